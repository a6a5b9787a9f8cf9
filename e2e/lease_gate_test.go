package e2e

// Lease mode for a gate (docs/gate.md#lease-mode): the gate holder's whole
// node dies, and the standby gate's plugin on the other node takes the
// lock over after L (9 s by default), well before the server would expire
// it; the new gate trusts the sealed heartbeat (its predecessor's gated
// tasks were killed by then) and its gated app starts at once.

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestLeaseGateNodeDeath: a lease-mode gate with a raw_exec gated app, one
// allocation on each of two clients (network namespaces); every process of
// the holder's client is frozen at once and then SIGKILLed. The standby's
// app must start well under the plain lock's expiry, and the apps' own
// records must never show two at once.
func TestLeaseGateNodeDeath(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	tr := &chaosTrial{}
	leaseGateTrial(t, a, leaseNodeDeath, chaosGateRecords(t), "raw_exec", "lgnd-r", tr)
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the node died, want under %s (the plain lock's expiry is 19 s or more)", tr.Takeover, leaseTakeoverBound)
	}
	if tr.Overlaps > 0 {
		t.Errorf("%d overlaps", tr.Overlaps)
	}
}

// TestLeaseGatePartition: the lease-mode gate holder's client is cut off,
// alive. The gate cannot write its heartbeat, fences itself D after the
// last acknowledged one and kills its gated app itself (K); the standby
// gate takes the lock over after L, its app never beside the old one.
func TestLeaseGatePartition(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	tr := &chaosTrial{}
	leaseGateTrial(t, a, leasePartition, chaosGateRecords(t), "raw_exec", "lgpt-r", tr)
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the cut, want under %s", tr.Takeover, leaseTakeoverBound)
	}
	if tr.Overlaps > 0 {
		t.Errorf("%d overlaps", tr.Overlaps)
	}
}

// TestLeaseGatePartitionDocker is TestLeaseGatePartition with a docker
// gated app, which ignores SIGTERM: the cut-off gate pauses, SIGKILLs and
// inspects its container through the engine, by D + K.
func TestLeaseGatePartitionDocker(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	d := harness.StartDocker(t)
	opts := leaseAgentOptions(t)
	opts.Docker = d
	a := harness.StartAgent(t, opts)
	tr := &chaosTrial{}
	leaseGateTrial(t, a, leasePartition, chaosGateRecords(t), "docker", "lgpt-d", tr, func(j *gateJob) { j.image = d.Image })
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the cut, want under %s", tr.Takeover, leaseTakeoverBound)
	}
	if tr.Overlaps > 0 {
		t.Errorf("%d overlaps", tr.Overlaps)
	}
}

// leaseGateTrial runs a lease-mode gate job of kind with two allocations
// on distinct clients, kills the holder's node or cuts it off, waits for
// the standby's app and checks the records (chaosGateFinish), then brings
// the node back. tr.Takeover is the time from the fault to the next app
// start.
func leaseGateTrial(t *testing.T, a *harness.Agent, fault leaseFault, records, kind, name string, tr *chaosTrial, prepare ...func(*gateJob)) {
	j := newGateJobID(t, name, kind, records)
	for _, p := range prepare {
		p(j)
	}
	j.lockExtra = "\n          mode = \"lease\""
	j.noService = true
	j.groupExtra = "\n    constraint {\n      operator = \"distinct_hosts\"\n      value    = \"true\"\n    }"
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	node := chaosAllocNode(t, a, holder)
	dead := a.ClientOf(node)
	if dead == nil {
		t.Fatalf("no client runs node %s", drvShort(node))
	}
	if chaosAllocNode(t, a, standby) == node {
		t.Fatalf("the standby %s runs on the holder's node", drvShort(standby))
	}
	leaseGateWaitEvent(t, a, standby, 30*time.Second, "Lease mode: ", "L = 9s")
	leaseGateWaitEvent(t, a, holder, 30*time.Second, "Gate kills and proves dead itself")
	// The standby bounds the holder's last renew from two heartbeat
	// changes it saw: let it see a few.
	time.Sleep(4 * time.Second)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)

	var at, gone int64
	what := "node_death"
	switch fault {
	case leaseNodeDeath:
		var frozen []int
		at, frozen = leaseKillNode(t, dead)
		gone = leaseWaitGone(t, app.PID, 10*time.Second)
		t.Logf("node death: froze and SIGKILLed %d processes of %s", len(frozen), dead.Name())
	case leasePartition:
		what = "partition"
		at = chaosCut(t, dead)
		// The gate fences D after its last acknowledged heartbeat and
		// kills its app itself, by D + K.
		gone = leaseWaitGone(t, app.PID, 2*drvTTL+10*time.Second)
		harness.Measure(t, "gate_partition_app_gone_lease_"+kind, time.Duration(gone-at))
	}
	known := []harness.KnownEnd{{PID: app.PID, Mono: gone}}

	next := j.start(t, holder, at, chaosTakeoverBound)
	tr.Takeover = time.Duration(next.Mono - at)
	harness.Measure(t, "gate_"+what+"_takeover_lease_"+kind, tr.Takeover)
	if next.Mono < gone {
		t.Errorf("the standby's app started %s before the old app was gone: two at once", time.Duration(gone-next.Mono))
	}
	if next.AllocID != standby {
		t.Errorf("the new holder is %s, want the standby %s", drvShort(next.AllocID), drvShort(standby))
	}
	leaseGateWaitEvent(t, a, standby, 30*time.Second, "Took the lock over from a holder whose heartbeat stopped")

	tr.Note = fmt.Sprintf("gate + %s app, lease mode, %s: old app gone %s after the fault, next app %s after it", kind, what,
		time.Duration(gone-at).Round(10*time.Millisecond), tr.Takeover.Round(10*time.Millisecond))

	chaosGateFinish(t, a, j, smp, tr, known...)
	switch fault {
	case leaseNodeDeath:
		if err := dead.Start(); err != nil {
			t.Fatal(err)
		}
	case leasePartition:
		if err := dead.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	chaosWaitNodeReady(t, a, dead, 60*time.Second)
	leaseWaitNodeQuiet(t, dead, 45*time.Second)
}

// leaseGateWaitEvent waits for a task event of the allocation's gate
// containing every one of subs.
func leaseGateWaitEvent(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration, subs ...string) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, _ := a.TaskEvents(allocID, "gate")
		if m := drvMatching(evs, subs...); len(m) > 0 {
			return m[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no gate event containing %q within %s; events:\n%s", drvShort(allocID), subs, timeout, drvFormatEvents(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
