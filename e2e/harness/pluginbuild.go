package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// pluginBuildTimeout bounds the build of an older plugin: a warm build
// cache (make build ran) makes it a minute or two, a cold one longer.
const pluginBuildTimeout = 15 * time.Minute

var (
	pluginBuildsMu sync.Mutex
	pluginBuilds   = map[string]*pluginBuild{}
)

type pluginBuild struct {
	once sync.Once
	path string
	took time.Duration // 0 when the binary was already there
	err  error
}

// BuildPluginAt builds the driver plugin from the repository's commit (a
// revision git can resolve), with its shim.Version set to version, once
// per test binary, and returns the binary's absolute path: for tests that
// start tasks with an older plugin and upgrade it. The source comes from
// `git archive` of the commit, built as `make plugin` builds it, with this
// machine's Go toolchain and module cache. The binary is kept beside the
// testworkload under the commit's hash and the version, so later test
// binaries reuse it.
//
// A commit missing from a full clone fails the test (a shallow clone skips it,
// loudly, as it cannot hold the history at all):
// the test guards upgrades, and a clone without history must not pass it
// silently. The error names the fix.
func BuildPluginAt(t testing.TB, commit, version string) string {
	t.Helper()
	root := RepoRoot(t)
	key := commit + "\x00" + version
	pluginBuildsMu.Lock()
	b := pluginBuilds[key]
	if b == nil {
		b = &pluginBuild{}
		pluginBuilds[key] = b
	}
	pluginBuildsMu.Unlock()
	b.once.Do(func() { b.path, b.took, b.err = buildPluginAt(root, commit, version) })
	if b.err != nil && isShallow(root) {
		// A shallow clone (CI systems that fetch one commit) cannot hold
		// the older commit at all: say so loudly, but do not fail a run
		// that never had the history to test with.
		t.Skipf("harness: SKIPPED, the clone at %s is shallow and cannot build the plugin at %s: %v", root, commit, b.err)
	}
	if b.err != nil {
		t.Fatalf("harness: build the plugin at %s: %v", commit, b.err)
	}
	if b.took > 0 {
		t.Logf("harness: built the plugin at %s in %s: %s", commit, b.took.Round(time.Millisecond), b.path)
	}
	return b.path
}

// isShallow reports whether the clone at root is a shallow one.
func isShallow(root string) bool {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output()
	return err == nil && strings.TrimSpace(string(out)) == "true"
}

func buildPluginAt(root, commit, version string) (string, time.Duration, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), pluginBuildTimeout)
	defer cancel()
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
			}
			return "", fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	full, err := git("rev-parse", "--verify", "--quiet", commit+"^{commit}")
	if err != nil {
		shallow, _ := git("rev-parse", "--is-shallow-repository")
		return "", 0, fmt.Errorf("commit %s is not in the clone at %s (shallow: %q; %v): fetch the history "+
			"(`git fetch --unshallow`, or `git fetch origin %s`), or set %s to a full clone", commit, root, shallow, err, commit, EnvRepoRoot)
	}
	dir := filepath.Join(testWorkloadDir(root), "plugin-"+full[:12]+"-"+version)
	final := filepath.Join(dir, PluginFileName)
	if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return final, 0, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	src, err := os.MkdirTemp(dir, "src")
	if err != nil {
		return "", 0, err
	}
	defer os.RemoveAll(src)
	tarball := filepath.Join(src, "source.tar")
	if _, err := git("archive", "--format=tar", "-o", tarball, full); err != nil {
		return "", 0, err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		return "", 0, fmt.Errorf("unpack %s: %v: %s", tarball, err, out)
	}
	// Build to a unique name and rename, so concurrent test binaries never
	// see (or execute) a half-written file.
	tmp := fmt.Sprintf("%s.%d.tmp", final, os.Getpid())
	cmd := exec.CommandContext(ctx, goBinary(), "build", "-trimpath",
		"-ldflags", "-s -w -X "+ModulePath+"/shim.Version="+version, "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", 0, fmt.Errorf("%s (in %s, source of %s): %v\n%s", strings.Join(cmd.Args, " "), src, full, err, out)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return "", 0, err
	}
	return final, time.Since(began), nil
}
