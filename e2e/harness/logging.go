package harness

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// NewLogger returns an hclog logger that writes through t.Logf, so harness
// messages appear with the test's output (and only with -v or on failure).
// Do not log through it after the test has finished.
func NewLogger(t testing.TB, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   name,
		Level:  hclog.Debug,
		Output: &testWriter{t: t},
	})
}

// testWriter turns each written line into one t.Logf call.
type testWriter struct {
	mu sync.Mutex
	t  testing.TB
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Helper()
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// fileTail returns the last n lines of a file, or a note why it could not.
func fileTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(cannot read " + path + ": " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
