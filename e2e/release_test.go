package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestReleasePackages installs what `make release` ships, as a user would:
// the .deb with dpkg -i on this machine (and purges it at the end), whose
// lock runs from the PATH and whose plugin a Nomad agent finds in the
// plugin dir the package filled, enabled by the config file it put in
// /etc/nomad.d; and lock's OCI image, loaded with docker load into the
// harness's private engine (never the system's), where lock -version runs.
// (TestReleaseIsReproducible, at the root, checks the bytes.)
func TestReleasePackages(t *testing.T) {
	t.Parallel()
	const (
		version   = "0.0.0-e2e"
		pkg       = "nomad-driver-singleton"
		pluginDir = "/opt/nomad/data/plugins"
		conffile  = "/etc/nomad.d/nomad-driver-singleton.hcl"
		stateDir  = "/var/lib/nomad-driver-singleton"
	)
	if os.Geteuid() != 0 {
		t.Fatal("dpkg -i needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	dist := t.TempDir()
	build := exec.CommandContext(ctx, "scripts/release.sh", version, dist, "linux/amd64")
	build.Dir = harness.RepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, out)
	}

	if err := exec.CommandContext(ctx, "dpkg", "-s", pkg).Run(); err == nil {
		t.Fatalf("%s is installed already: this test installs and purges it; run dpkg --purge %s first", pkg, pkg)
	}
	_, statErr := os.Stat(stateDir)
	t.Cleanup(func() {
		if out, err := exec.Command("dpkg", "--purge", pkg).CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge %s: %v\n%s", pkg, err, out)
		}
		for _, f := range []string{"/usr/bin/lock", filepath.Join(pluginDir, pkg), conffile} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s is still there after dpkg --purge: %v", f, err)
			}
		}
		if errors.Is(statErr, os.ErrNotExist) {
			os.RemoveAll(stateDir) // the plugin's state, made at its first start
		}
	})
	t.Log(run("dpkg", "-i", filepath.Join(dist, pkg+"_"+version+"_linux_amd64.deb")))

	if out := strings.TrimSpace(run("lock", "-version")); out != "lock "+version {
		t.Errorf("lock -version from the PATH = %q, want %q", out, "lock "+version)
	}
	if path, err := exec.LookPath("lock"); err != nil || path != "/usr/bin/lock" {
		t.Errorf("lock on the PATH is %q (%v), want /usr/bin/lock", path, err)
	}

	conf, err := os.ReadFile(conffile)
	if err != nil {
		t.Fatal(err)
	}
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, PluginDir: pluginDir, Config: []string{string(conf)},
		RequireDrivers: []string{"raw_exec", harness.PluginDriverName}})
	status := a.Nomad(t, "node", "status", "-self", "-verbose")
	for _, re := range []string{`(?m)^singleton\s+true\s+true\s+Healthy\b`, `(?m)^driver\.singleton\.version\s+= ` + regexp.QuoteMeta(version) + `$`} {
		if !regexp.MustCompile(re).MatchString(status) {
			t.Errorf("nomad node status -self -verbose does not match %s:\n%s", re, status)
		}
	}

	d := harness.StartDocker(t)
	image := "nomad-driver-singleton/lock:" + version
	t.Log(d.CLI(t, "load", "-i", filepath.Join(dist, "lock_"+version+"_linux_amd64.oci.tar")))
	t.Cleanup(func() { _, _ = d.TryCLI("rmi", image) })
	if out := strings.TrimSpace(d.CLI(t, "run", "--rm", "--network", "none", image, "-version")); out != "lock "+version {
		t.Errorf("docker run %s -version = %q, want %q", image, out, "lock "+version)
	}
	if n := strings.TrimSpace(d.CLI(t, "image", "inspect", "-f", "{{len .RootFS.Layers}}", image)); n != "1" {
		t.Errorf("the image has %s layers, want lock's alone", n)
	}
	// Nothing but lock: no shell to run.
	if out, err := d.TryCLI("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c", "true"); err == nil {
		t.Errorf("the image runs /bin/sh: it holds more than lock\n%s", out)
	}
}
