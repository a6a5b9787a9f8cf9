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
