package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// ModulePath is the Go module path of the product (the repository root's
// go.mod, not e2e/go.mod); RepoRoot looks for a go.mod that declares it.
const ModulePath = "github.com/nomad-driver-singleton/nomad-driver-singleton"

// Environment variables that override where the harness finds things.
const (
	EnvRepoRoot = "E2E_REPO_ROOT" // repository root
	EnvNomadBin = "E2E_NOMAD_BIN" // nomad agent/CLI binary
	EnvLockBin  = "E2E_LOCK_BIN"  // lock binary
	EnvLogDir   = "E2E_LOG_DIR"   // if set, agent logs are written (and kept) here
)

var (
	repoRootOnce sync.Once
	repoRoot     string
	repoRootErr  error
)

// RepoRoot returns the absolute path of the repository root (the directory
// whose go.mod declares ModulePath). $E2E_REPO_ROOT overrides the search.
func RepoRoot(t testing.TB) string {
	t.Helper()
	repoRootOnce.Do(func() { repoRoot, repoRootErr = findRepoRoot() })
	if repoRootErr != nil {
		t.Fatalf("harness: %v", repoRootErr)
	}
	return repoRoot
}

func findRepoRoot() (string, error) {
	if dir := os.Getenv(EnvRepoRoot); dir != "" {
		return filepath.Abs(dir)
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if declaresModule(filepath.Join(dir, "go.mod")) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find the repository root (a go.mod declaring %s) above %v; set %s",
		ModulePath, starts, EnvRepoRoot)
}

func declaresModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == ModulePath
		}
	}
	return false
}

// NomadBin returns the absolute path of the Nomad binary: $E2E_NOMAD_BIN, or
// <repo>/bin/nomad. The test fails if it is missing or not executable.
func NomadBin(t testing.TB) string {
	t.Helper()
	return requireBinary(t, EnvNomadBin, "nomad")
}

// LockBin returns the absolute path of the lock binary: $E2E_LOCK_BIN, or
// <repo>/bin/lock. The test fails if it is missing or not executable.
func LockBin(t testing.TB) string {
	t.Helper()
	return requireBinary(t, EnvLockBin, "lock")
}

func requireBinary(t testing.TB, envVar, name string) string {
	t.Helper()
	path := os.Getenv(envVar)
	if path == "" {
		path = filepath.Join(RepoRoot(t), "bin", name)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatalf("harness: %s: %v", path, err)
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.Fatalf("harness: %s binary not found at %s: run `make build %s` in the repository root (or set %s)",
			name, abs, name, envVar)
	case err != nil:
		t.Fatalf("harness: %s binary: %v", name, err)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		t.Fatalf("harness: %s is not an executable file: run `make build %s` (or set %s)", abs, name, envVar)
	}
	return abs
}

// testWorkloadDir is stable per checkout, so repeated runs reuse one file
// instead of leaving a temporary directory behind each time (two checkouts
// on one machine never run each other's build), and short, so it can be
// mounted or referenced from task configs easily.
func testWorkloadDir(root string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(root))
	return filepath.Join(os.TempDir(), fmt.Sprintf("nomad-singleton-e2e-%08x", h.Sum32()))
}

var (
	workloadOnce sync.Once
	workloadPath string
	workloadErr  error
)

// BuildTestWorkload builds e2e/testworkload with CGO_ENABLED=0 (a static
// binary, so it also runs inside an exec-driver chroot) once per test binary
// and returns its absolute path. The file is named "testworkload"; its
// directory holds nothing else of interest, so it can be a host volume.
func BuildTestWorkload(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	workloadOnce.Do(func() { workloadPath, workloadErr = buildTestWorkload(root) })
	if workloadErr != nil {
		t.Fatalf("harness: build testworkload: %v", workloadErr)
	}
	return workloadPath
}

func buildTestWorkload(root string) (string, error) {
	dir := testWorkloadDir(root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(dir, "testworkload")
	// Build to a unique name and rename, so concurrent test binaries never
	// see (or execute) a half-written file.
	tmp := fmt.Sprintf("%s.%d.tmp", final, os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// e2e is a module of its own (e2e/go.mod), so the build runs there.
	cmd := exec.CommandContext(ctx, goBinary(), "build", "-o", tmp, "./testworkload")
	cmd.Dir = filepath.Join(root, "e2e")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return final, nil
}

// goBinary is the go command on PATH, else the one of the toolchain that
// built the test binary.
func goBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
