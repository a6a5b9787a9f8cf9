package e2e

// Node drains, kept as Nomad does them: a drain of the standby's node moves
// nothing, a drain of the holder's node hands the lock over once, and the
// rolling-update rule (shim/update.go) never takes a drain's migration for
// an update.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

const (
	// drainUpdateGrace is the jobs' update_grace: far above a handover's
	// gap, so a standby that gave way to a drain's replacement as if it were
	// a new version would show as a gap this long.
	drainUpdateGrace = 30 * time.Second
	// drainKillTimeout is the driver task's kill_timeout: a holder that took
	// its drain-stop for an update-stop would keep serving up to this less
	// lock.kill_timeout (docs/updates.md) and say so in an event.
	drainKillTimeout = "20s"
	// drainTimeout bounds each drain. A drain moves an allocation only
	// once the group's other allocations have a health verdict (Nomad's
	// drainer, handleTaskGroup): a driver task's after the group's
	// migrate.min_healthy_time (10s by default); a gate standby's never
	// before migrate.healthy_deadline (drainGateMigrate).
	drainTimeout = 4 * time.Minute
	// drainGateUpdate is the gate job's update block, the one the examples
	// and docs/updates.md give a gated group with standbys: no deployment,
	// so the allocations' health comes from the migrate block.
	drainGateUpdate = "      max_parallel = 0"
	// drainGateMigrate is the gate job's migrate block. A standby gate's
	// allocation is pending (its gated tasks wait for the lock), so it is
	// never healthy, only declared unhealthy migrate.healthy_deadline after
	// it was placed (5m by default), and until then the drainer moves
	// nothing of the group; 15s keeps the test short.
	drainGateMigrate = "\n    migrate {\n      min_healthy_time = \"2s\"\n      healthy_deadline = \"15s\"\n    }"
	// drainDistinctHosts puts the holder and the standby on two nodes.
	drainDistinctHosts = "\n    constraint {\n      operator = \"distinct_hosts\"\n      value    = \"true\"\n    }"
)

// drainUpdateRuleEvents are the beginnings of the update rule's events
// (shim/events.go, docs/troubleshooting.md): none may appear in a drain.
var drainUpdateRuleEvents = []string{
	"Lock free: giving way for up to ",
	"Stopped for a rolling update: ",
	"Rolling update: ",
}

// TestNodeDrainHandsOverOnce: one server and three clients; a job of two
// allocations (holder and standby) on two of them, the third free. A drain
// of the standby's node moves the standby to the free node and nothing else
// (no handover: the holder's workload runs on, same lock ID and fence);
// once that node is back in service, a drain of the holder's node hands the
// lock over exactly once, to the moved standby, never overlapping (records
// and sampler), within a handover's time: no standby gives way to the
// holder's replacement as if it were a new version, and the holder does not
// keep serving as if stopped for an update (no update-rule event). For a
// driver task, then for a gate with a raw_exec app, on the same cluster
// (a drain moves every job of its node, so they run one after the other).
//
// Each drain waits, as Nomad's drainer does, until every allocation of the
// group has a health verdict: a driver task's standby runs, so it is
// healthy after min_healthy_time; a gate's standby is pending, so the drain
// waits until migrate.healthy_deadline declares it unhealthy (5m by
// default, 15s here; drainGateMigrate).
func TestNodeDrainHandsOverOnce(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	opts := drvAgentOptions(t, false)
	opts.Clients = 3
	a := harness.StartAgent(t, opts)
	records := t.TempDir()

	t.Run("driver", func(t *testing.T) {
		j := newDrvJob(t, "drain", 2)
		j.groupExtra = strings.TrimPrefix(drainDistinctHosts, "\n    ")
		j.killTimeout = drainKillTimeout
		j.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q\n          update_grace = %q", drvTTLHCL, drvDelayHCL, drainUpdateGrace)
		j.run(t, a)
		drainTrial(t, a, j.singleton())
	})
	t.Run("gate_raw_exec", func(t *testing.T) {
		j := newGateJobID(t, "gate-drain", "raw_exec", records)
		j.groupExtra = drainDistinctHosts + drainGateMigrate
		j.update = drainGateUpdate
		j.lockExtra = fmt.Sprintf("\n          update_grace = %q", drainUpdateGrace)
		j.run(t, a)
		t.Cleanup(func() { _ = a.Purge(j.id) })
		drainTrial(t, a, j.singleton())
	})
}

// singletonJob is a running job of a holder and standbys, as the tests
// that move its lock see it: its singleton task (the driver task or the
// gate), whose events say it waits for the lock with waiting, and the
// records and marker of its workload (the gated app for a gate).
type singletonJob struct {
	jobID, task, marker, record, lockPath, waiting string
}

func (j *drvJob) singleton() singletonJob {
	return singletonJob{jobID: j.id, task: drvTask, marker: j.marker, record: j.record, lockPath: j.lockPath(),
		waiting: "Waiting for lock " + j.lockPath()}
}

func (j *gateJob) singleton() singletonJob {
	return singletonJob{jobID: j.id, task: "gate", marker: j.marker, record: j.record, lockPath: j.lockPath(),
		waiting: "Gate waiting for lock " + j.lockPath()}
}

func drainTrial(t *testing.T, a *harness.Agent, s singletonJob) {
	first := waitMainStart(t, s.record, 90*time.Second, nil)
	holder := first.AllocID
	holderNode := chaosAllocNode(t, a, holder)
	standby := s.waitStandby(t, a, "", holder, 90*time.Second)
	standbyNode := chaosAllocNode(t, a, standby)
	free := ""
	for _, m := range a.Clients() {
		if m.NodeID() != holderNode && m.NodeID() != standbyNode {
			free = m.NodeID()
		}
	}
	if standbyNode == holderNode || free == "" {
		t.Fatalf("holder %s on node %s and standby %s on node %s: want two distinct nodes and a free one",
			drvShort(holder), drvShort(holderNode), drvShort(standby), drvShort(standbyNode))
	}
	fence := drvLock(t, a, s.lockPath).ModifyIndex
	lockID := drvCheckLockHeld(t, a, s.lockPath, holder, fence)
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	smp.WaitSeen(t, 30*time.Second, first.PID)
	t.Logf("holder %s on %s, standby %s on %s, node %s free", drvShort(holder), drvShort(holderNode),
		drvShort(standby), drvShort(standbyNode), drvShort(free))

	// The standby's node: the standby moves to the free node; the holder
	// never notices.
	at := harness.MonoNow()
	took := drainNode(t, a, standbyNode)
	moved := s.waitStandby(t, a, free, holder, 90*time.Second)
	harness.Measure(t, "drain_standby_node", took)
	if starts := drvStarts(readRecords(t, s.record)); len(starts) != 1 {
		t.Errorf("%d workload starts after the drain of the standby's node, want the holder's alone: %+v", len(starts), starts)
	}
	quiet := [2]int64{at, harness.MonoNow()}
	if id := drvCheckLockHeld(t, a, s.lockPath, holder, fence); id != lockID {
		t.Errorf("the lock ID changed during the drain of the standby's node")
	}
	chaosSetEligible(t, a, a.ClientOf(standbyNode), true) // maintenance done

	// The holder's node: the holder stops, the moved standby takes over.
	at = harness.MonoNow()
	took = drainNode(t, a, holderNode)
	next := waitMainStart(t, s.record, 60*time.Second, func(r harness.Record) bool { return r.AllocID != holder })
	if next.AllocID != moved {
		t.Errorf("after the drain of the holder's node the workload started in %s, want the moved standby %s", drvShort(next.AllocID), drvShort(moved))
	}
	s.waitStandby(t, a, standbyNode, next.AllocID, 90*time.Second) // the holder's replacement
	chaosSetEligible(t, a, a.ClientOf(holderNode), true)
	harness.Measure(t, "drain_holder_node", took)

	sum := smp.Stop()
	drvCheckOnlyPID(t, drvSamplesWithin(sum, quiet[0], quiet[1]), first.PID, holder)
	ivs := harness.CheckNoOverlap(t, readRecords(t, s.record), sum)
	hs := harness.Handovers(ivs)
	if len(hs) != 1 {
		t.Fatalf("%d handovers over both drains, want exactly 1: %+v", len(hs), hs)
	}
	h := hs[0]
	harness.Measure(t, "drain_handover_gap", h.Gap)
	t.Logf("drain of the holder's node: %s → %s, %s without a workload; drain took %s", drvShort(h.From.AllocID),
		drvShort(h.To.AllocID), h.Gap, time.Duration(harness.MonoNow()-at).Round(time.Millisecond))
	if h.Gap >= drainUpdateGrace {
		t.Errorf("the drain's handover left the lock without a workload for %s, as long as the update_grace (%s): "+
			"a standby gave way to the holder's replacement as if it were a new version?", h.Gap, drainUpdateGrace)
	}
	allocs, err := a.Allocs(s.jobID)
	if err != nil {
		t.Fatal(err)
	}
	for _, al := range allocs {
		evs, _ := a.TaskEvents(al.ID, s.task)
		for _, prefix := range drainUpdateRuleEvents {
			if m := drvMatching(evs, prefix); len(m) > 0 {
				t.Errorf("alloc %s (version %d) applied the rolling-update rule in a drain:\n%s", drvShort(al.ID), al.JobVersion, drvFormatEvents(m))
			}
		}
		if al.JobVersion != allocs[0].JobVersion {
			t.Errorf("alloc %s runs job version %d, %s version %d: a drain changed the job", drvShort(al.ID), al.JobVersion, drvShort(allocs[0].ID), allocs[0].JobVersion)
		}
	}
}

// drainNode drains the node (deadline drainTimeout) and waits until the
// drain is complete; it returns how long that took.
func drainNode(t *testing.T, a *harness.Agent, nodeID string) time.Duration {
	t.Helper()
	began := time.Now()
	spec := &api.DrainSpec{Deadline: drainTimeout}
	if _, err := a.API().Nodes().UpdateDrainOpts(nodeID, &api.DrainOptions{DrainSpec: spec}, nil); err != nil {
		t.Fatalf("drain node %s: %v", drvShort(nodeID), err)
	}
	deadline := began.Add(drainTimeout + time.Minute)
	for {
		node, _, err := a.API().Nodes().Info(nodeID, nil)
		if err == nil && node.DrainStrategy == nil && node.LastDrain != nil && node.LastDrain.Status == api.DrainStatusComplete {
			return time.Since(began)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the drain of node %s is not complete after %s (node %+v, err %v)", drvShort(nodeID), time.Since(began), node, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitStandby waits for an allocation of the job other than not, on the
// node (any node for ""), that the servers want running and whose
// singleton task says it waits for the lock, and returns its ID.
func (s singletonJob) waitStandby(t *testing.T, a *harness.Agent, node, not string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		allocs, _ := a.Allocs(s.jobID)
		for _, al := range allocs {
			if al.ID == not || (node != "" && al.NodeID != node) || al.DesiredStatus != api.AllocDesiredStatusRun {
				continue
			}
			if al.ClientStatus != api.AllocClientStatusPending && al.ClientStatus != api.AllocClientStatusRunning {
				continue
			}
			if evs, _ := a.TaskEvents(al.ID, s.task); len(drvMatching(evs, s.waiting)) > 0 {
				return al.ID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no allocation of %s on node %q waits for the lock within %s: %s", s.jobID, drvShort(node), timeout, a.Nomad(t, "job", "status", s.jobID))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitEvent waits until the allocation's singleton task has an event
// whose text contains every one of subs.
func (s singletonJob) waitEvent(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, _ := a.TaskEvents(allocID, s.task)
		if len(drvMatching(evs, subs...)) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no %s task event containing %q within %s; events:\n%s", drvShort(allocID), s.task, subs, timeout, drvFormatEvents(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
