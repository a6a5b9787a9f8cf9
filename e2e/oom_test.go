package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverOOMKill: a workload that allocates far more than its task's
// memory (64 MB) is OOM-killed by the kernel in the task's memory cgroup.
// Nomad must show it (the Terminated event carries oom_killed = true and
// the "OOM Killed" exit message), and the supervisor, which stays outside
// that cgroup, must survive it: it proves the task dead and releases the
// lock itself ("Released lock", not the plugin's crash release).
func TestDriverOOMKill(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	j := newDrvJob(t, "oom", 1)
	j.args = []string{"-eat-mb", "512"}
	j.failFast = true
	j.run(t, a)

	start := j.waitStart(t, 60*time.Second, nil)
	term := drvWaitTerminated(t, a, start.AllocID, 60*time.Second)
	if term.Details["oom_killed"] != "true" {
		t.Errorf("Terminated event has oom_killed = %q, want true: %s", term.Details["oom_killed"], drvEventText(term))
	}
	if term.Details["exit_code"] != "137" {
		t.Errorf("Terminated event has exit code %q, want 137 (SIGKILL by the OOM killer): %s", term.Details["exit_code"], drvEventText(term))
	}
	drvWaitEvent(t, a, start.AllocID, 10*time.Second, "OOM Killed", "resources.memory")
	evs := drvEvents(t, a, start.AllocID)
	if len(drvMatching(evs, "Released lock")) == 0 {
		t.Errorf("no \"Released lock\" event: the supervisor did not release after the OOM kill; events:\n%s", drvFormatEvents(evs))
	}
	if m := drvMatching(evs, "crashed supervisor"); len(m) > 0 {
		t.Errorf("the supervisor died with its workload (the plugin released for it): %s", drvFormatEvents(m))
	}
	if v := drvLock(t, a, j.lockPath()); v.Lock != nil && v.Lock.ID != "" {
		t.Errorf("lock %s is still held after the task ended: %+v", j.lockPath(), v.Lock)
	}
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusFailed, 60*time.Second)
}

// drvWaitTerminated waits for the task's Terminated event.
func drvWaitTerminated(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs := drvEvents(t, a, allocID)
		for _, ev := range evs {
			if ev.Type == api.TaskTerminated {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no Terminated event within %s; events:\n%s", drvShort(allocID), timeout, drvFormatEvents(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
