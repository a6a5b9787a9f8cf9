package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverHolderRecordIgnoresTaskEnv: a job's env block overrides
// NOMAD_ALLOC_ID and NOMAD_JOB_ID in the task's environment (the workload
// sees the forged values), yet the lock's holder record names the real
// allocation and job: the next gate waits for the allocation it names, and
// the LB request ids are made of it.
func TestDriverHolderRecordIgnoresTaskEnv(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	const forged = "00000000-0000-4000-8000-000000000000"
	j := newDrvJob(t, "envholder", 1)
	j.env = map[string]string{"NOMAD_ALLOC_ID": forged, "NOMAD_JOB_ID": "forged-job"}
	j.run(t, a)
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusRunning, 60*time.Second)
	start := j.waitStart(t, 60*time.Second, nil)
	if start.AllocID != forged {
		t.Fatalf("the workload sees NOMAD_ALLOC_ID %q, want the env block's %s: the override did not take", start.AllocID, forged)
	}
	allocs := drvRunning(t, a, j.id)
	if len(allocs) != 1 {
		t.Fatalf("running allocations %v, want 1", allocs)
	}
	v := drvLock(t, a, j.lockPath())
	if v.Lock == nil || v.Items["holder_alloc_id"] != allocs[0] || v.Items["holder_job_id"] != j.id {
		t.Errorf("holder record names alloc %q and job %q, want %s and %s (items %v)",
			v.Items["holder_alloc_id"], v.Items["holder_job_id"], allocs[0], j.id, v.Items)
	}
}

// TestDriverGracefulStopKeepsKillTimeout: a task with kill_signal SIGINT
// and kill_timeout 30s whose workload needs 25s to flush after SIGINT, with
// a TTL of 10s: the flush outlasts the lease's stop deadline (19s after a
// renew) many times over, yet the renews during the stop carry the group
// guard's and the watchdog's deadlines along. The workload ends its flush
// and exits 0; nothing is SIGKILLed and no event speaks of a cut.
func TestDriverGracefulStopKeepsKillTimeout(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	const flush = 25 * time.Second
	j := newDrvJob(t, "fullgrace", 1)
	j.killSignal, j.killTimeout = "SIGINT", "30s"
	j.args = []string{"-stop-after", flush.String()}
	j.run(t, a)
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusRunning, 60*time.Second)
	start := j.waitStart(t, 60*time.Second, nil)
	stopped := time.Now()
	// Stop the job rather than the allocation: no replacement then starts,
	// which would also take 25 s to stop.
	if _, _, err := a.API().Jobs().Deregister(j.id, false, nil); err != nil {
		t.Fatal(err)
	}
	end := j.waitEnd(t, start.Instance, 90*time.Second)
	if end.Event != harness.EventStop || end.Signal != "SIGINT" {
		t.Errorf("the workload ended with %s %s, want its stop record after SIGINT", end.Event, end.Signal)
	}
	if took := time.Since(stopped); took < flush {
		t.Errorf("stop record %s after the stop, want the whole %s flush", took, flush)
	}
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusComplete, 60*time.Second)
	evs := drvEvents(t, a, start.AllocID)
	if cut := drvMatching(evs, "SIGKILL"); len(cut) > 0 {
		t.Errorf("events speak of SIGKILL:\n%s", drvFormatEvents(evs))
	}
	if lost := drvMatching(evs, "Lock lost"); len(lost) > 0 {
		t.Errorf("events speak of a loss:\n%s", drvFormatEvents(evs))
	}
	if rel := drvMatching(evs, "Released lock"); len(rel) != 1 {
		t.Errorf("want one Released lock event:\n%s", drvFormatEvents(evs))
	}
}
