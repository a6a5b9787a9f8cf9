package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// WaitTaskEvent waits until the task has an event of type typ (for example
// api.TaskTerminated, whose ExitCode is the task's exit code) and returns the
// latest such event. On timeout the test fails with the job's allocations and
// recent task events.
func (a *Agent) WaitTaskEvent(t testing.TB, allocID, task, typ string, timeout time.Duration) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		events, err := a.TaskEvents(allocID, task)
		lastErr = err
		for i := len(events) - 1; i >= 0; i-- {
			if events[i].Type == typ {
				return events[i]
			}
		}
		if time.Now().After(deadline) {
			var jobDesc string
			if alloc, _, err := a.api.Allocations().Info(allocID, nil); err == nil {
				jobDesc = a.describeJob(alloc.JobID)
			}
			t.Fatalf("harness: alloc %s task %s: no %q event within %s (last error: %v)\n%s",
				short(allocID), task, typ, timeout, lastErr, jobDesc)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitAllocLog polls the task's stream ("stdout" or "stderr") until it
// contains every one of want, and returns the log. The test fails after
// timeout, showing the log.
func (a *Agent) WaitAllocLog(t testing.TB, allocID, task, stream string, timeout time.Duration, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := a.AllocLogs(t, allocID, task, stream)
		missing := ""
		for _, w := range want {
			if !strings.Contains(out, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: %s of alloc %s task %s lacks %q after %s:\n%s", stream, short(allocID), task, missing, timeout, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
