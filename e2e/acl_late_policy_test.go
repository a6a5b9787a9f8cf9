package e2e

// Issue 31: a driver task and a gate submitted without their ACL policies
// say in their task events which policy to apply, and take the lock once it
// is applied, without a resubmission of the job.

import (
	"os"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

func TestACLPolicyAppliedLate(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	records := t.TempDir()
	if err := os.Chmod(records, 0o777); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, false)
	opts.ACLs = true
	a := harness.StartAgent(t, opts)

	drv := newDrvJob(t, "acl-late", 1)
	drv.run(t, a)
	gate := newGateJobID(t, "gate-acl-late", "raw_exec", records)
	gate.count, gate.noService = 1, true
	gate.run(t, a)
	t.Cleanup(func() { _ = a.Purge(gate.id) })

	// The driver task waits, its event naming the policy and the command.
	var drvAlloc string
	drvEv := waitJobTaskEvent(t, a, drv.id, drvTask, 90*time.Second, &drvAlloc, "Lock denied (HTTP 403)",
		`path "`+drv.lockPath()+`" { capabilities = ["write", "read"] }`,
		"nomad acl policy apply -namespace default -job "+drv.id+" ")
	t.Logf("driver: %s", drvEventText(drvEv))
	// The gate refuses to start, its event naming the policy and the command.
	gateEv := waitJobTaskEvent(t, a, gate.id, "gate", 90*time.Second, nil, "Gate not started", "permission denied",
		`capabilities = ["read-job"]`, "nomad acl policy apply -namespace default -job "+gate.id+" -group "+gate.group+" -task gate ")
	t.Logf("gate: %s", drvEventText(gateEv))
	for _, rec := range []string{drv.record, gate.record} {
		if recs, _ := harness.ReadRecords(rec); len(recs) > 0 {
			t.Errorf("a workload ran without its policy: %v", recs)
		}
	}

	applied := harness.MonoNow()
	applyLockPolicy(t, a, drv.id, drv.lockPath())
	applyGatePolicy(t, a, gate, true)

	// The waiting driver task takes the lock in place: same allocation,
	// no restart.
	start := waitMainStart(t, drv.record, 90*time.Second, nil)
	harness.Measure(t, "acl_late_driver_start_after_policy", time.Duration(start.Mono-applied))
	if start.AllocID != drvAlloc {
		t.Errorf("the driver's workload started in alloc %s, want the allocation that waited for the policy, %s", drvShort(start.AllocID), drvShort(drvAlloc))
	}
	if al, _, err := a.API().Allocations().Info(drvAlloc, nil); err != nil {
		t.Fatal(err)
	} else if st := al.TaskStates[drvTask]; st == nil || st.Restarts != 0 {
		t.Errorf("the driver task was restarted while it waited for its policy: %+v", st)
	}
	// The gate's app starts in a replacement allocation of the same job.
	first := gate.start(t, "", 0, 120*time.Second)
	harness.Measure(t, "acl_late_gate_app_start_after_policy", time.Duration(first.Mono-applied))

	for _, id := range []string{drv.id, gate.id} {
		job, _, err := a.API().Jobs().Info(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if *job.Version != 0 {
			t.Errorf("job %s is at version %d: it was resubmitted", id, *job.Version)
		}
	}
}

// waitJobTaskEvent waits for an event of task in any allocation of the job
// that contains every one of subs, and returns it (and, if allocID is not
// nil, its allocation in *allocID).
func waitJobTaskEvent(t *testing.T, a *harness.Agent, jobID, task string, timeout time.Duration, allocID *string, subs ...string) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		allocs, _ := a.Allocs(jobID)
		var all []*api.TaskEvent
		for _, al := range allocs {
			evs, _ := a.TaskEvents(al.ID, task)
			all = append(all, evs...)
			if m := drvMatching(evs, subs...); len(m) > 0 {
				if allocID != nil {
					*allocID = al.ID
				}
				return m[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: no %s event containing %q within %s; events:\n%s", jobID, task, subs, timeout, drvFormatEvents(all))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
