package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReleaseIsReproducible builds the linux/amd64 release (tarballs,
// .deb, .rpm, OCI image) twice: once
// from this tree, once from a copy of it at another path under another
// umask, and wants identical SHA256SUMS. (One platform keeps it fast; the
// second build reuses the Go build cache, which is keyed by content, so
// this proves that paths, build IDs, file times, owners and modes do not
// leak into the artifacts.)
func TestReleaseIsReproducible(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const version = "0.0.0-reprotest"
	env := append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")

	files, err := exec.CommandContext(ctx, "git", "ls-files", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("list the tree's files with git: %v", err)
	}
	copyDir := filepath.Join(t.TempDir(), "elsewhere", "src")
	if err := os.MkdirAll(copyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, f := range strings.Split(strings.TrimSpace(string(files)), "\n") {
		if _, err := os.Stat(f); err == nil && !strings.HasPrefix(f, "bin/") && !strings.HasPrefix(f, "dist/") {
			list = append(list, f)
		}
	}
	pack := exec.CommandContext(ctx, "tar", "-cf", "-", "-T", "-")
	pack.Stdin = strings.NewReader(strings.Join(list, "\n"))
	unpack := exec.CommandContext(ctx, "tar", "-xf", "-", "-C", copyDir)
	unpack.Stdin, _ = pack.StdoutPipe()
	if err := pack.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := unpack.CombinedOutput(); err != nil {
		t.Fatalf("copy the tree: %v\n%s", err, out)
	}
	if err := pack.Wait(); err != nil {
		t.Fatal(err)
	}

	var dist string
	sums := func(dir, umask string) []byte {
		t.Helper()
		out := filepath.Join(t.TempDir(), "dist")
		dist = out
		cmd := exec.CommandContext(ctx, "bash", "-c", "umask "+umask+" && scripts/release.sh "+version+" "+out+" linux/amd64")
		cmd.Dir, cmd.Env = dir, env
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("release build in %s: %v\n%s", dir, err, b)
		}
		b, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	here := sums(".", "022")
	there := sums(copyDir, "077")
	if !bytes.Equal(here, there) {
		t.Fatalf("two release builds differ:\n%s\nvs (copy at another path, umask 077):\n%s", here, there)
	}
	if n := strings.Count(string(here), "\n"); n != 5 {
		t.Fatalf("SHA256SUMS lists %d artifacts, want the plugin's and lock's tarballs, the .deb, the .rpm and lock's OCI image:\n%s", n, here)
	}
	t.Logf("identical:\n%s", here)

	// Both binaries carry the version: lock prints it, and the plugin
	// reports it as driver.singleton.version (shim.Version, stamped alike).
	unpacked := t.TempDir()
	for _, tgz := range []string{"lock_" + version + "_linux_amd64.tar.gz", "nomad-driver-singleton_" + version + "_linux_amd64.tar.gz"} {
		if out, err := exec.CommandContext(ctx, "tar", "-xzf", filepath.Join(dist, tgz), "-C", unpacked).CombinedOutput(); err != nil {
			t.Fatalf("unpack %s: %v\n%s", tgz, err, out)
		}
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(unpacked, "lock"), "-version").Output(); err != nil || strings.TrimSpace(string(out)) != "lock "+version {
		t.Errorf("lock -version = %q, %v; want %q", out, err, "lock "+version)
	}
	plugin, err := os.ReadFile(filepath.Join(unpacked, "nomad-driver-singleton"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(plugin, []byte(version)) {
		t.Errorf("the released plugin does not carry version %s", version)
	}
}
