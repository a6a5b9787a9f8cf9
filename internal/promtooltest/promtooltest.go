// Package promtooltest runs Prometheus's promtool (Debian's prometheus
// package; `make prometheus` installs it) for the tests that check the
// monitoring examples and the /metrics endpoints. A missing promtool fails
// the test, so that a machine without it cannot pass by skipping; with
// SINGLETON_NO_PROMTOOL=1 such a test skips instead, and says so.
package promtooltest

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// SkipEnv is the variable that lets a test skip when promtool is missing.
const SkipEnv = "SINGLETON_NO_PROMTOOL"

// Path is promtool's path; without it the test fails (or skips, see SkipEnv).
func Path(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("promtool not found and %s=1: skipping (install Debian's prometheus package: make prometheus)", SkipEnv)
	}
	t.Fatalf("promtool not found: install Debian's prometheus package (make prometheus), or set %s=1 to skip", SkipEnv)
	return ""
}

// Run runs promtool with args and stdin (nil for none); it fails the test,
// with promtool's output, unless promtool exits 0.
func Run(t testing.TB, stdin []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command(Path(t), args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// CheckMetrics is `promtool check metrics` (the exposition format and its
// lint) on text, a /metrics answer.
func CheckMetrics(t testing.TB, text []byte) {
	t.Helper()
	if len(bytes.TrimSpace(text)) == 0 {
		t.Fatal("no metrics to check")
	}
	Run(t, text, "check", "metrics")
}
