package e2e

// A restart of the holder's gate (issue 35, C1): Nomad stops the gate
// while its allocation runs on (`nomad alloc restart <alloc> gate`, or a
// `template` of the gate re-rendered, change_mode "restart"), and a gated
// task killed from outside would be restarted by Nomad after its restart
// delay (15 s, the service default), beside the next holder. The gate
// keeps its lease and kills nothing, in lock and in lease mode, and the
// restarted gate takes the lease over: the app runs on, unsignalled, and
// no other allocation's app ever starts. A restarted gate that cannot take
// its kept lease over (its fence deadline passed while Nomad held the
// restart back) never lets the app run unheld: the plugin's warden stops
// it then, with its kill_signal, and the restarted run fails for good.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// gateRestartWatch is how long after each restart of the gate the test
// watches for a second app: longer than the gated app's restart delay
// (15 s, + up to 25 % jitter) after a kill, with room to spare.
const gateRestartWatch = 45 * time.Second

func TestGateRestart(t *testing.T) {
	t.Parallel()
	a, d := gateDockerAgent(t, true)
	records := chaosGateRecords(t)
	var subs []subtest
	for _, mode := range []string{"lock", "lease"} {
		for _, kind := range []string{"raw_exec", "docker"} {
			name := mode + "_" + strings.ReplaceAll(kind, "_", "-")
			subs = append(subs, subtest{name + "_kept", func(t *testing.T) {
				tr := &chaosTrial{Takeover: -1, Recovery: -1}
				gateRestartTrial(t, a, d, records, mode, kind, 1, tr)
				t.Logf("%s: overlaps=%d fences=%d %s", name, tr.Overlaps, tr.Fences, tr.Note)
			}})
		}
	}
	for _, c := range []struct{ mode, kind string }{{"lock", "raw_exec"}, {"lease", "docker"}} {
		name := c.mode + "_" + strings.ReplaceAll(c.kind, "_", "-")
		subs = append(subs, subtest{name + "_not_taken_over", func(t *testing.T) {
			tr := &chaosTrial{Takeover: -1, Recovery: -1}
			gateAdoptFailsTrial(t, a, d, records, c.mode, c.kind, 1, tr)
			t.Logf("%s: overlaps=%d fences=%d takeover=%s %s", name, tr.Overlaps, tr.Fences, tr.Takeover, tr.Note)
		}})
	}
	runConcurrently(t, subs)
}

// gateDockerAgent starts a dev agent with the Docker engine of the test
// binary and, with releaseToken (lease-mode gates), the plugin's
// release_token_file.
func gateDockerAgent(t *testing.T, releaseToken bool) (*harness.Agent, *harness.Docker) {
	t.Helper()
	harness.BuildTestWorkload(t)
	d := harness.StartDocker(t)
	opts := drvAgentOptions(t, true)
	opts.Docker = d
	if releaseToken {
		leaseWithReleaseToken(t, &opts)
	}
	return harness.StartAgent(t, opts), d
}

// newGateRestartJob is a count = 2 gate job of kind and mode (lock or
// lease) named id whose app ignores SIGTERM (and SIGINT), has
// restart { delay = "15s" } and kill_timeout 3s, and whose gate renders a
// template from the job's variable nomad/jobs/<id> (item "rotate"), with
// templateExtra in its template block.
func newGateRestartJob(t *testing.T, a *harness.Agent, d *harness.Docker, records, mode, kind, id, templateExtra string) *gateJob {
	t.Helper()
	a.Nomad(t, "var", "put", "-force", "nomad/jobs/"+id, "rotate=1")
	t.Cleanup(func() { _, _ = a.TryNomad(t, "var", "purge", "nomad/jobs/"+id) })
	j := newChaosGateJob(t, kind, records, id, d)
	j.appRestart = `delay = "15s"`
	j.appKill = "3s"
	if kind != "docker" {
		j.extraArgs = append(j.extraArgs, "-ignore-term")
	}
	if mode == "lease" {
		j.lockExtra = "\n          mode = \"lease\""
	}
	j.gateExtra = fmt.Sprintf(`
      template {
        destination = "secrets/rotate.env"
        data        = "ROTATE={{ with nomadVar \"nomad/jobs/%s\" }}{{ .rotate }}{{ end }}\n"%s
      }`, id, templateExtra)
	return j
}

// gateEventsSaying counts the events of the allocation's gate that say
// sub (Nomad keeps a task's last 10).
func gateEventsSaying(t *testing.T, a *harness.Agent, allocID, sub string) int {
	t.Helper()
	evs, _ := a.TaskEvents(allocID, "gate")
	return len(drvMatching(evs, sub))
}

// gateEventSince reports whether the allocation's gate has an event that
// says sub, stamped at since or later.
func gateEventSince(t *testing.T, a *harness.Agent, allocID string, since time.Time, sub string) bool {
	t.Helper()
	evs, _ := a.TaskEvents(allocID, "gate")
	for _, ev := range drvMatching(evs, sub) {
		if !time.Unix(0, ev.Time).Before(since) {
			return true
		}
	}
	return false
}

// gateRestartTrial: the holder's gate is restarted by `nomad alloc restart
// <alloc> gate`, then by a re-render of its template; after each, for
// gateRestartWatch, the restarted gate holds the same lock, the app runs
// on in the holder (one start, no signal), and the standby never starts
// it.
func gateRestartTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records, mode, kind string, n int, tr *chaosTrial) {
	id := fmt.Sprintf("grs%s-%s%d", mode[:2], kind[:1], n)
	j := newGateRestartJob(t, a, d, records, mode, kind, id, "")
	if mode == "lease" {
		// The restarted gate must take the lease over before its fence
		// deadline, lease_fence after the last heartbeat (6 s by
		// default): from `nomad alloc restart` to the take-over took 1 s
		// here when idle, and 4.2 s at a load of 24 on two cores, which
		// left the warden's kill at the fence to race it. The lock
		// mode's fence is most of the TTL; give lease mode as much.
		j.ttl = "20s"
		j.lockExtra += "\n          lease_fence = \"15s\""
	}
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	lockID := j.heldBy(t, a, holder).Lock.ID
	var notes []string
	for i, trigger := range []string{"alloc restart of the gate", "template re-render"} {
		since := time.Now()
		at := harness.MonoNow()
		switch i {
		case 0:
			a.Nomad(t, "alloc", "restart", holder, "gate")
		case 1:
			a.Nomad(t, "var", "put", "-force", "nomad/jobs/"+id, "rotate=2")
		}
		for deadline := time.Now().Add(60 * time.Second); !gateEventSince(t, a, holder, since, "Took over lock"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				evs, _ := a.TaskEvents(holder, "gate")
				t.Fatalf("%s: the restarted gate did not take its lease over within 60s:\n%s\ngate log:\n%s", trigger, drvFormatEvents(evs),
					a.AllocLogs(t, holder, "gate", "stderr"))
			}
		}
		tookOver := time.Duration(harness.MonoNow() - at)
		harness.Measure(t, "gate_restart_"+mode+"_"+kind+"_"+strconv.Itoa(i)+"_took_over", tookOver)
		notes = append(notes, fmt.Sprintf("%s: taken over %s later", trigger, harness.Millis(tookOver)))
		// Watch for a restarted app, or a second one, for longer than
		// the app's restart delay.
		time.Sleep(gateRestartWatch)
		if v := drvLock(t, a, j.lockPath()); v.Lock == nil || v.Lock.ID != lockID || v.Items["holder_alloc_id"] != holder {
			t.Errorf("%s: lock %s is %+v %v, want the same lock ID held by %s", trigger, j.lockPath(), v.Lock, v.Items, drvShort(holder))
		}
		if !drvAlive(app.PID) {
			t.Errorf("%s: the holder's app (pid %d) died; it must run on across a restart of its gate", trigger, app.PID)
		}
		j.standby(t, a, holder)
	}
	recs := j.records(t)
	for _, r := range recs {
		if r.AllocID == holder && r.Event == harness.EventSignal {
			t.Errorf("the holder's app got %s across the restarts of its gate; it must run on untouched: %+v", r.Signal, r)
		}
	}
	if starts := drvStarts(recs); len(starts) != 1 {
		t.Errorf("%d app starts, want the holder's first alone: %+v", len(starts), starts)
	}
	chaosGateOnlyIn(t, recs, []string{holder}, []int64{0})
	chaosGateNeverStarted(t, a, j.id, holder)
	tr.Note = strings.Join(notes, "; ") + "; app ran on, standby " + drvShort(standby) + " waited"
	chaosGateFinish(t, a, j, smp, tr)
	if tr.Overlaps > 0 || tr.Fences > 0 {
		t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
	}
}

// gateAdoptFailsTrial: the holder's gate is restarted while its template's
// variable is missing, so Nomad holds the new run back in its prestart
// (restart { render_templates = true }) past the kept lease's fence
// deadline. The plugin's warden stops the app then (its kill_signal, then
// SIGKILL), before the lock can pass; once the variable is back, the
// restarted run finds no lease to take over and fails for good, so Nomad
// stops the allocation; the standby takes over only once Nomad reports the
// app dead for good. Never two apps, and the app never runs past the
// kept lease's fence deadline with nobody holding for it.
func gateAdoptFailsTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records, mode, kind string, n int, tr *chaosTrial) {
	id := fmt.Sprintf("gaf%s-%s%d", mode[:2], kind[:1], n)
	// The deleted variable must not restart the gate by itself.
	j := newGateRestartJob(t, a, d, records, mode, kind, id, "\n        change_mode = \"noop\"")
	j.gateRestart = "attempts         = 0\n        mode             = \"fail\"\n        render_templates = true"
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)

	a.Nomad(t, "var", "purge", "nomad/jobs/"+id)
	at := harness.MonoNow()
	a.Nomad(t, "alloc", "restart", holder, "gate")
	// The kept lease runs out (lock mode: TTL - margin after the last
	// renew; lease mode: lease_fence after the last heartbeat), and the
	// warden stops the app: with its kill_signal, which it ignores, then
	// SIGKILL.
	gone := drvWaitGone(t, app.PID, drvTTL+30*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	if bound := drvTTL + 3*time.Second + 10*time.Second; time.Duration(gone-at) > bound {
		t.Errorf("the app was gone only %s after the gate's restart, want within %s (the kept lease's fence deadline + kill_timeout)",
			time.Duration(gone-at), bound)
	}
	leaseGateWaitEvent(t, a, holder, 30*time.Second, "Gate's warden killed", "their kill_signal, then SIGKILL")
	var signalled bool
	for _, r := range j.records(t) {
		signalled = signalled || (r.AllocID == holder && r.Event == harness.EventSignal)
	}
	if !signalled {
		t.Errorf("the app was not given its kill_signal before the warden's SIGKILL")
	}
	time.Sleep(5 * time.Second) // the app's restart is due 15 s after its death: let the variable come back meanwhile
	a.Nomad(t, "var", "put", "-force", "nomad/jobs/"+id, "rotate=2")
	leaseGateWaitEvent(t, a, holder, 60*time.Second, "Gate not restarted")

	next := j.start(t, holder, at, chaosTakeoverBound+30*time.Second)
	tr.Takeover = time.Duration(next.Mono - at)
	if next.Mono < gone {
		t.Errorf("the standby's app started %s before the old one was gone", time.Duration(gone-next.Mono))
	}
	if next.AllocID != standby {
		t.Logf("the app started in %s, not the standby %s (a replacement)", drvShort(next.AllocID), drvShort(standby))
	}
	// Long enough for the old app's restart (15 s after its death) to
	// have come, were it to come.
	time.Sleep(gateRestartWatch - time.Duration(harness.MonoNow()-gone))
	recs := j.records(t)
	for _, r := range drvStarts(recs) {
		if r.AllocID == holder && r.Mono > first.Mono {
			t.Errorf("the old holder's app started again at %s: %+v", time.Duration(r.Mono-at), r)
		}
	}
	if al, _, err := a.API().Allocations().Info(holder, nil); err == nil && !slices.Contains([]string{api.AllocClientStatusFailed, api.AllocClientStatusComplete}, al.ClientStatus) {
		t.Errorf("the old holder's allocation is %s, want it failed (its restarted gate fails for good)", al.ClientStatus)
	}
	tr.Note = fmt.Sprintf("old app stopped by the warden %s after the gate's restart, next app %s after it",
		harness.Millis(time.Duration(gone-at)), harness.Millis(tr.Takeover))
	chaosGateFinish(t, a, j, smp, tr, known...)
	if tr.Overlaps > 0 || tr.Fences > 0 {
		t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
	}
}
