package e2e

// A gate's kill proves its gated tasks dead now; the next gate must not
// take that for dead for good (issue 35, H1). Two faults where it was
// not: a gated app that crashed on its own, its restart pending, when the
// gate loses its lock (H1(d): Nomad restarts it before its own kill of the
// allocation begins, after the group's shutdown_delay); and a Docker
// engine that hangs while the gate kills (H1(c): the kill fails, and was
// retried by no one). In both the next gate waits for Nomad to report the
// old app dead for good, and the plugin's warden kills whatever of it runs
// while its gate does not hold.

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestGatePendingRestart: H1(d), for a raw_exec and a docker app.
func TestGatePendingRestart(t *testing.T) {
	t.Parallel()
	a, d := gateDockerAgent(t, false)
	records := chaosGateRecords(t)
	var subs []subtest
	for _, kind := range []string{"raw_exec", "docker"} {
		subs = append(subs, subtest{strings.ReplaceAll(kind, "_", "-"), func(t *testing.T) {
			tr := &chaosTrial{Takeover: -1, Recovery: -1}
			gatePendingRestartTrial(t, a, d, records, kind, 1, tr)
			t.Logf("overlaps=%d fences=%d takeover=%s %s", tr.Overlaps, tr.Fences, tr.Takeover, tr.Note)
			if tr.Overlaps > 0 || tr.Fences > 0 {
				t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
			}
		}})
	}
	runConcurrently(t, subs)
}

// TestLeaseGatePendingRestart: H1(d) where the next gate used to trust a
// record at once: a lease-mode takeover's seal. The holder's client (a
// server and two clients in network namespaces) is cut off while its app's
// restart is pending; the cut-off gate fences and kills nothing (nothing
// runs), Nomad there restarts the app before its own kill of the
// allocation, and the standby seals the old heartbeat after L.
func TestLeaseGatePendingRestart(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	tr := &chaosTrial{Takeover: -1, Recovery: -1}
	leaseGatePendingTrial(t, a, chaosGateRecords(t), 1, tr)
	t.Logf("overlaps=%d fences=%d takeover=%s %s", tr.Overlaps, tr.Fences, tr.Takeover, tr.Note)
	if tr.Overlaps > 0 || tr.Fences > 0 {
		t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
	}
}

// gateCutAfterCrash is when, after the holder's app crashed, its client is
// cut off in leaseGatePendingTrial: its gate fences D = 6 s later and
// fails, Nomad there kills the allocation the group's shutdown_delay
// (6 s) after that, and the app's restart (14 to 17.5 s after its crash)
// comes first; the standby seals L = 9 s after the cut.
const gateCutAfterCrash = 6 * time.Second

// leaseGatePendingTrial: see TestLeaseGatePendingRestart. The next gate,
// which finds the old heartbeat sealed but the servers showing the old app
// pending, waits until the servers lose the cut-off client; the warden
// there kills the restarted app meanwhile.
func leaseGatePendingTrial(t *testing.T, a *harness.Agent, records string, n int, tr *chaosTrial) {
	j := newGateJobID(t, fmt.Sprintf("lgpr-r%d", n), "raw_exec", records)
	j.lockExtra = "\n          mode = \"lease\""
	j.noService = true
	j.groupExtra = fmt.Sprintf("\n    shutdown_delay = %q\n    constraint {\n      operator = \"distinct_hosts\"\n      value    = \"true\"\n    }",
		gatePendingGroupDelay)
	j.appRestart = fmt.Sprintf("delay = %q", gatePendingRestart)
	j.appKill = "3s"
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	cut := a.ClientOf(chaosAllocNode(t, a, holder))
	if cut == nil || chaosAllocNode(t, a, standby) == cut.NodeID() {
		t.Fatalf("the holder %s and the standby %s are not on two clients", drvShort(holder), drvShort(standby))
	}
	leaseGateWaitEvent(t, a, standby, 30*time.Second, "Lease mode: ", "L = 9s")
	time.Sleep(4 * time.Second) // the standby counts a few heartbeat changes
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)

	crash := harness.MonoNow()
	if err := syscall.Kill(app.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, app.PID, 30*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	for deadline := time.Now().Add(gateCutAfterCrash); ; time.Sleep(100 * time.Millisecond) {
		al, _, err := a.API().Allocations().Info(holder, nil)
		if err == nil && al.TaskStates["app"] != nil && al.TaskStates["app"].State == "pending" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the servers do not report the crashed app pending within %s (err %v)", gateCutAfterCrash, err)
		}
	}
	time.Sleep(gateCutAfterCrash - time.Duration(harness.MonoNow()-crash)) // the fault's schedule
	at := chaosCut(t, cut)
	next := j.start(t, holder, at, chaosTakeoverBound+60*time.Second)
	tr.Takeover = time.Duration(next.Mono - at)
	restarted := j.restartedNote(t, holder, crash)
	time.Sleep(gateRestartWatch - time.Duration(harness.MonoNow()-crash))
	tr.Note = fmt.Sprintf("lease mode, raw_exec app crashed, client cut off %s later%s, next app %s after the cut",
		harness.Millis(gateCutAfterCrash), restarted, harness.Millis(tr.Takeover))
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	chaosWaitNodeReady(t, a, cut, 60*time.Second)
	// The cut-off client's task events reach the servers once healed.
	for deadline := time.Now().Add(30 * time.Second); restarted != "" && len(j.restartEnds(t, a, holder, crash, next.Mono)) == 0 &&
		time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
	}
	known = append(known, j.restartEnds(t, a, holder, crash, next.Mono)...)
	chaosGateFinish(t, a, j, smp, tr, known...)
	leaseWaitNodeQuiet(t, cut, 45*time.Second)
}

// restartedNote says when the allocation's app started again after its
// crash at crash ("" if it did not).
func (j *gateJob) restartedNote(t *testing.T, allocID string, crash int64) string {
	note := ""
	for _, r := range drvStarts(j.records(t)) {
		if r.AllocID == allocID && r.Mono > crash {
			note = fmt.Sprintf(", the old app restarted %s after its crash", harness.Millis(time.Duration(r.Mono-crash)))
		}
	}
	return note
}

// restartEnds are the ends of the allocation's app runs that started after
// crash and were SIGKILLed (no end record), as Nomad's client saw them
// exit ("Terminated"), on the records' clock: the warden kills a restart
// at once, and it may come and go between two of the sampler's scans. An
// end is given only when it came before next, the next holder's first
// start; a later one is left for the check to find unproven.
func (j *gateJob) restartEnds(t *testing.T, a *harness.Agent, allocID string, crash, next int64) []harness.KnownEnd {
	t.Helper()
	evs, _ := a.TaskEvents(allocID, j.app)
	var out []harness.KnownEnd
	for _, r := range drvStarts(j.records(t)) {
		if r.AllocID != allocID || r.Mono <= crash {
			continue
		}
		for _, ev := range evs {
			at := time.Unix(0, ev.Time)
			if ev.Type != "Terminated" || at.Before(r.Wall) {
				continue
			}
			if end := r.Mono + int64(at.Sub(r.Wall)); end < next {
				out = append(out, harness.KnownEnd{PID: r.PID, Mono: end})
			}
			break
		}
	}
	return out
}

// TestGateDockerdFrozen: H1(c). Not parallel: it freezes the Docker
// engine that every docker test of the binary shares.
func TestGateDockerdFrozen(t *testing.T) {
	a, d := gateDockerAgent(t, false)
	tr := &chaosTrial{Takeover: -1, Recovery: -1}
	gateDockerdFrozenTrial(t, a, d, chaosGateRecords(t), 1, tr)
	t.Logf("overlaps=%d fences=%d takeover=%s %s", tr.Overlaps, tr.Fences, tr.Takeover, tr.Note)
	if tr.Overlaps > 0 || tr.Fences > 0 {
		t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
	}
}

// Timings of the pending-restart trial: the group's shutdown_delay (as
// long as the lock's bound allows with kill_timeout 3s), the app's restart
// delay (as short as the gate allows: above the group's delay + 7s), and
// the moment after the crash at which the lock is lost, so that the app's
// restart (14 to 17.5 s after its crash) comes before Nomad's kill of the
// allocation (the group's delay after the gate fails, 18 s at the
// earliest).
const (
	gatePendingGroupDelay = 6 * time.Second
	gatePendingRestart    = 14 * time.Second
	gatePendingLossAfter  = 12 * time.Second
)

// gatePendingRestartTrial: the holder's app crashes on its own (SIGKILL,
// as an OOM kill would); its restart is due 14-17.5 s later. 12 s after
// the crash the lock is released behind the holder's back: its gate kills
// what runs (nothing) and fails, and Nomad kills the allocation only after
// the group's shutdown_delay, so the app restarts first, while nobody
// holds for it. The next gate holds the lock at once but starts its app
// only once Nomad reports the old one dead for good; the warden kills the
// restarted one meanwhile.
func gatePendingRestartTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records, kind string, n int, tr *chaosTrial) {
	j := newChaosGateJob(t, kind, records, fmt.Sprintf("gpr-%s%d", kind[:1], n), d)
	j.groupExtra = fmt.Sprintf("\n    shutdown_delay = %q", gatePendingGroupDelay)
	j.appRestart = fmt.Sprintf("delay = %q", gatePendingRestart)
	j.appKill = "3s"
	j.noService = true
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	v := j.heldBy(t, a, holder)

	crash := harness.MonoNow()
	j.killApp(t, d, holder, app)
	gone := drvWaitGone(t, app.PID, 30*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	time.Sleep(gatePendingLossAfter - time.Duration(harness.MonoNow()-crash)) // the fault's schedule
	at := harness.MonoNow()
	j.releaseBehindBack(t, a, v.Lock.ID)
	next := j.start(t, holder, at, chaosTakeoverBound+30*time.Second)
	tr.Takeover = time.Duration(next.Mono - at)
	restarted := j.restartedNote(t, holder, crash)
	if restarted != "" && gateEventsSaying(t, a, holder, "Gate's warden killed") == 0 {
		t.Errorf("the old app restarted while its gate did not hold, and no event says the warden killed it")
	}
	// Past any restart of the old app that could still come.
	time.Sleep(gateRestartWatch - time.Duration(harness.MonoNow()-crash))
	known = append(known, j.restartEnds(t, a, holder, crash, next.Mono)...)
	if next.AllocID != standby {
		t.Logf("the app started in %s, not the standby %s (a replacement)", drvShort(next.AllocID), drvShort(standby))
	}
	tr.Note = fmt.Sprintf("%s app crashed, lock lost %s later%s, next app %s after the loss", kind,
		harness.Millis(gatePendingLossAfter), restarted, harness.Millis(tr.Takeover))
	chaosGateFinish(t, a, j, smp, tr, known...)
}

// gateDockerdFrozenFor is how long the trial keeps the engine frozen:
// longer than the gate's retries of its kill (gateKillRetryFor, 10s).
const gateDockerdFrozenFor = 15 * time.Second

// gateDockerdFrozenTrial: the Docker engine is frozen (SIGSTOP of dockerd)
// and the lock released behind the holder's back: the gate's kill of its
// app (whose container runs on) hangs, is retried, and given up; the gate
// fails. The next gate holds the lock but waits for Nomad to report the
// old app dead; once the engine is thawed, the plugin's warden (or
// Nomad's kill) ends it, and only then does the next app start.
func gateDockerdFrozenTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records string, n int, tr *chaosTrial) {
	j := newChaosGateJob(t, "docker", records, fmt.Sprintf("gdf-d%d", n), d)
	j.noService = true
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	j.standby(t, a, holder)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	v := j.heldBy(t, a, holder)

	thaw := d.Freeze(t)
	at := harness.MonoNow()
	j.releaseBehindBack(t, a, v.Lock.ID) // on failure, the Freeze cleanup thaws
	time.Sleep(gateDockerdFrozenFor)     // the fault
	frozenAlive := drvAlive(app.PID)
	thaw()
	thawed := harness.MonoNow()
	gone := drvWaitGone(t, app.PID, 90*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	next := j.start(t, holder, at, chaosTakeoverBound+60*time.Second)
	tr.Takeover = time.Duration(next.Mono - at)
	if next.Mono < gone {
		t.Errorf("the next app started %s before the old one was gone", time.Duration(gone-next.Mono))
	}
	if gateEventsSaying(t, a, holder, "Gate could not prove") == 0 {
		t.Errorf("no event says the gate could not prove its app dead while the engine was frozen")
	}
	tr.Note = fmt.Sprintf("engine frozen %s (old app alive then: %v), old app gone %s after the thaw, next app %s after the loss",
		harness.Millis(gateDockerdFrozenFor), frozenAlive, harness.Millis(time.Duration(gone-thawed)), harness.Millis(tr.Takeover))
	chaosGateFinish(t, a, j, smp, tr, known...)
}
