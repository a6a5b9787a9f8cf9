package e2e

// Nomad's lock expiry (nomad/locks.go of v1.11.2) fires 2×TTL after the last
// renew and, lock_delay later, clears WHATEVER lock the variable holds: its
// release carries no lock ID. A release by the old holder inside that window
// frees the lock early, and the pending expiry then clears the next holder's
// lock. These tests keep the upstream behaviour in view (a Nomad upgrade that
// changes it fails the first) and prove that `lock` never releases inside
// the window (docs/expiry.md).

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// The timing: TTL 10s and a lock delay of 10s, so the window in
// which an old holder's release lets the pending expiry hit the next holder
// is [20s, 30s] after its last renew.
const (
	expiryTTL   = 10 * time.Second
	expiryDelay = 10 * time.Second
)

// TestLockExpiryWindow runs the expiry scenarios on one dev agent with the
// driver.
func TestLockExpiryWindow(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"upstream_release_inside_expiry_clears_next_holder", func(t *testing.T) { testUpstreamExpiryClearsNextHolder(t, a) }},
		{"frozen_holder_thawed_inside_lock_delay", func(t *testing.T) { testFrozenHolderThawedInsideLockDelay(t, a) }},
		{"frozen_driver_thawed_inside_lock_delay", func(t *testing.T) { testFrozenSupervisorAndPluginThawedInsideLockDelay(t, a) }},
	})
}

// testUpstreamExpiryClearsNextHolder reproduces, with plain Nomad API calls,
// what lockclient's release cutoff protects against: holder A stops renewing;
// once the server's 2×TTL timer has fired, A releases (accepted: its lock ID
// still matches); B acquires at once and keeps renewing; A's pending expiry
// then clears B's lock, long before B's own TTL could run out.
func testUpstreamExpiryClearsNextHolder(t *testing.T, a *harness.Agent) {
	path := "expiry/upstream"
	vars := a.API().Variables()
	lock := &api.VariableLock{TTL: expiryTTL.String(), LockDelay: expiryDelay.String()}

	va, _, err := vars.AcquireLock(&api.Variable{Path: path, Items: map[string]string{"holder": "A"}, Lock: lock}, nil)
	if err != nil || va.Lock == nil {
		t.Fatalf("A: acquire: %v (%+v)", err, va)
	}
	// The server started A's timer when it applied the acquire, before
	// this answer: 2×TTL + 1s from here, it has fired, and the lock
	// delay runs.
	aAnswered := time.Now()
	time.Sleep(time.Until(aAnswered.Add(2*expiryTTL + time.Second)))
	if _, _, err := vars.ReleaseLock(&api.Variable{Path: path, Lock: &api.VariableLock{ID: va.Lock.ID}}, nil); err != nil {
		t.Fatalf("NOMAD CHANGED: the old holder's release inside its expiry window was refused (%v); "+
			"Nomad v1.11.2 accepts it. Revisit lockclient's release cutoff and docs/expiry.md", err)
	}
	vb, _, err := vars.AcquireLock(&api.Variable{Path: path, Items: map[string]string{"holder": "B"}, Lock: lock}, nil)
	if err != nil || vb.Lock == nil {
		t.Fatalf("B: acquire right after A's release: %v (%+v)", err, vb)
	}
	bAcquired := time.Now()

	// B renews every 2s, as a healthy holder does; its own expiry could not
	// begin before bAcquired + 2×TTL.
	var clearedAt time.Time
	for lastRenew := bAcquired; time.Since(bAcquired) < 2*expiryTTL-time.Second; time.Sleep(50 * time.Millisecond) {
		v, _, err := vars.Read(path, nil)
		if err == nil && (v.Lock == nil || v.Lock.ID != vb.Lock.ID) {
			clearedAt = time.Now()
			break
		}
		if time.Since(lastRenew) >= 2*time.Second {
			lastRenew = time.Now()
			_, _, _ = vars.RenewLock(&api.Variable{Path: path, Lock: &api.VariableLock{ID: vb.Lock.ID}}, nil)
		}
	}
	if clearedAt.IsZero() {
		t.Fatalf("NOMAD CHANGED: A released inside its expiry window, B acquired and renewed for %s, and B still holds the lock: "+
			"the pending expiry no longer clears the next holder's lock (Nomad v1.11.2 does, nomad/locks.go invalidateVariableLock). "+
			"lockclient's release cutoff (docs/expiry.md) may be relaxed; update this test and the docs", time.Since(bAcquired).Round(time.Second))
	}
	harness.Measure(t, "upstream_next_holder_lock_cleared_after", clearedAt.Sub(bAcquired))
	// A's expiry: its timer fired by aAnswered + 2×TTL, its release
	// follows the lock delay (plus Raft and a busy machine).
	if latest := aAnswered.Add(2*expiryTTL + expiryDelay + 10*time.Second); clearedAt.After(latest) {
		t.Errorf("B's lock was cleared %s after A's acquire, later than A's pending expiry could explain (%s)",
			clearedAt.Sub(aAnswered).Round(time.Millisecond), latest.Sub(aAnswered))
	}
	t.Logf("upstream: B acquired %s after A's acquire, and lost its lock %s later to A's pending expiry, while renewing",
		bAcquired.Sub(aAnswered).Round(time.Millisecond), clearedAt.Sub(bAcquired).Round(time.Millisecond))
}

// testFrozenHolderThawedInsideLockDelay is the scenario with `lock`
// (see expiryFrozenTrial).
func testFrozenHolderThawedInsideLockDelay(t *testing.T, a *harness.Agent) {
	expiryFrozenTrial(t, a, "lock", "expiry-frozen", &chaosTrial{})
}

// testFrozenSupervisorAndPluginThawedInsideLockDelay is the scenario with the
// driver (see expiryFrozenTrial).
func testFrozenSupervisorAndPluginThawedInsideLockDelay(t *testing.T, a *harness.Agent) {
	expiryFrozenTrial(t, a, "driver", "expiry-frozen", &chaosTrial{})
}

// expirySubject is the job of expiryFrozenTrial: three allocations on one
// lock (ttl 10s, delay 10s) whose workloads take 3s to stop after SIGTERM.
type expirySubject struct {
	a       *harness.Agent
	sc      scenario // lock
	drv     *drvJob  // driver
	marker  string
	record  string
	logHint string // where the holder says it left the lock to expire
}

func startExpirySubject(t *testing.T, a *harness.Agent, variant, name string) *expirySubject {
	s := &expirySubject{a: a}
	workload := []string{"-stop-after", "3s"}
	if variant != "lock" {
		s.drv = newDrvJob(t, name, 3)
		s.drv.args = workload
		s.drv.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q", expiryTTL, expiryDelay)
		s.drv.run(t, a)
		s.marker, s.record = s.drv.marker, s.drv.record
		a.WaitAllocs(t, s.drv.id, 3, api.AllocClientStatusRunning, 90*time.Second)
		return s
	}
	s.sc = newScenario(t, name)
	args := append([]string{"-ttl", expiryTTL.String(), "-delay", expiryDelay.String(), s.sc.path}, s.sc.workloadArgv(t, workload...)...)
	a.RunJobHCL(t, jobHCL(s.sc.job, "service", group{count: 3, command: harness.LockBin(t), args: args}))
	t.Cleanup(func() { _ = a.Purge(s.sc.job) })
	s.marker, s.record = s.sc.marker, s.sc.record
	a.WaitAllocs(t, s.sc.job, 3, api.AllocClientStatusRunning, 90*time.Second)
	return s
}

// holderSays is what the holder's allocation said: the `lock` task's stderr,
// or the driver's task events.
func (s *expirySubject) holderSays(t *testing.T, allocID string) string {
	if s.drv != nil {
		var b strings.Builder
		for _, ev := range drvEvents(t, s.a, allocID) {
			b.WriteString(drvEventText(ev) + "\n")
		}
		return b.String()
	}
	return s.a.AllocLogs(t, allocID, taskName, "stderr")
}

// expiryFrozenTrial is the scenario: three holders on one lock
// (ttl 10s, delay 10s), workloads that take 3s to stop after SIGTERM. The
// holder is frozen (SIGSTOP) just after a renew and thawed about 22s later,
// inside [2×TTL, 2×TTL + delay] after that renew, when the server's expiry
// is pending. Its process-group guard kills its workload meanwhile.
//
//   - lock: the `lock` process is frozen; on thaw it must not release.
//   - driver: the supervisor and the plugin are frozen (the plugin's
//     watchdog would otherwise kill the task and release long before the
//     window); the plugin is thawed first: its watchdog kills the frozen
//     supervisor and its crash release must not release either, judging
//     by the last renew that the supervisor recorded in its state dir.
//   - driver-restart: as driver, but the frozen plugin is SIGKILLed
//     instead of thawed; Nomad relaunches it, and the new plugin, which
//     knows the lease only from the state dir, must not release.
//
// Either says it left the lock to expire: the next holder then gets the
// lock from the expiry itself, with nothing pending behind it, and no two
// workloads ever run together. A release instead frees the lock at once,
// and the pending expiry clears the next holder's lock while its workload
// runs: a third holder starts beside it as it stops (3s).
func expiryFrozenTrial(t *testing.T, a *harness.Agent, variant, name string, tr *chaosTrial) {
	s := startExpirySubject(t, a, variant, name)
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload, Interval: 25 * time.Millisecond})
	first := waitMainStart(t, s.record, 90*time.Second, nil)
	holder := first.AllocID

	var frozen time.Time
	var thaw []int // in order
	var sup, plugin int
	if s.drv != nil {
		sup = drvSupervisor(t, holder).PID
		plugin = drvPlugin(t, a.Client().PID(), 0, 10*time.Second).PID
		drvSIGCONTCleanup(t, sup)
		drvSIGCONTCleanup(t, plugin)
		drvWaitRenew(t, a, holder, 2*expiryTTL) // the status shows a renew just acknowledged
		for _, pid := range []int{plugin, sup} {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		frozen, thaw = time.Now(), []int{plugin, sup}
		// The last acknowledged renew was sent just before the freeze.
		time.Sleep(time.Until(frozen.Add(2*expiryTTL + 2*time.Second)))
	} else {
		lockProc, _ := lockOf(t, s.marker, first.PID)
		t.Cleanup(func() { _ = syscall.Kill(lockProc.PID, syscall.SIGCONT) })
		// Renews go out every TTL/2 from the acquire, just before the
		// start record: freeze 1.5s after one, so the last acknowledged
		// renew was sent 1.5s (give or take the renews' round trips)
		// before the freeze.
		freezeAt := first.Wall.Add(expiryTTL/2 + 1500*time.Millisecond)
		for time.Until(freezeAt) < time.Second {
			freezeAt = freezeAt.Add(expiryTTL / 2)
		}
		time.Sleep(time.Until(freezeAt))
		if err := syscall.Kill(lockProc.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		frozen, thaw = time.Now(), []int{lockProc.PID}
		time.Sleep(time.Until(frozen.Add(2*expiryTTL + 1500*time.Millisecond)))
	}
	if variant == "driver-restart" {
		// The plugin dies instead of thawing: Nomad relaunches it, and
		// the new plugin recovers the task from its state dir, finds the
		// frozen supervisor past its deadlines and kills it.
		if err := syscall.Kill(plugin, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		relaunched := drvPlugin(t, a.Client().PID(), plugin, 90*time.Second)
		drvWaitGone(t, sup, 60*time.Second)
		t.Logf("plugin relaunched (pid %d) and its watchdog killed the frozen supervisor %s after the freeze", relaunched.PID, time.Since(frozen).Round(time.Millisecond))
		thaw = []int{sup}
	}
	for _, pid := range thaw {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the plugin's watchdog acts first
	}
	t.Logf("froze the holder (alloc %s, %v) at +%s after its start, thawed %s later",
		holder[:8], thaw, frozen.Sub(first.Wall).Round(time.Millisecond), time.Since(frozen).Round(time.Millisecond))

	// The next holder starts once the server's expiry freed the lock. Then
	// watch past the moment the pending expiry of an early release would
	// have hit it (≤ 2×TTL + delay after the freeze), and one stop more.
	next := waitMainStart(t, s.record, 2*expiryTTL+expiryDelay+30*time.Second, func(r harness.Record) bool { return r.AllocID != holder })
	tr.Takeover = next.Wall.Sub(frozen)
	harness.Measure(t, "expiry_frozen_"+variant+"_takeover_after_freeze", tr.Takeover)
	watchUntil := frozen.Add(2*expiryTTL + expiryDelay + 15*time.Second)
	if w := next.Wall.Add(15 * time.Second); w.After(watchUntil) {
		watchUntil = w
	}
	time.Sleep(time.Until(watchUntil))
	sum := smp.Stop()
	recs := readRecords(t, s.record)
	ivs := chaosCheck(t, tr, recs, sum)
	overlap := time.Duration(0)
	for _, o := range harness.Overlaps(ivs) {
		overlap += o.For
	}
	harness.Measure(t, "expiry_frozen_"+variant+"_overlap", overlap)
	starts := 0
	for _, iv := range ivs {
		if iv.AllocID != holder {
			starts++
		}
	}
	if starts != 1 {
		t.Errorf("want exactly one takeover after the frozen holder, got %d starts: %s", starts, describeIntervals(ivs))
	}

	// The thawed holder (or the plugin for it) said it left the lock to
	// expire, and never released it.
	said := s.holderSays(t, holder)
	before, _, left := strings.Cut(said, "left to expire")
	if !left || strings.Contains(before, "lock released") || strings.Contains(before, "Released lock") {
		t.Errorf("the thawed holder did not leave its lock to expire (it must not release it):\n%s", said)
	}
	if m := regexp.MustCompile(`last acknowledged renew was sent ([0-9.]+m?s) ago`).FindStringSubmatch(said); m != nil {
		since, _ := time.ParseDuration(m[1])
		harness.Measure(t, "expiry_frozen_"+variant+"_thawed_after_last_renew", since)
		tr.Note = fmt.Sprintf("thawed %s after the last renew, left to expire; next holder %s after the freeze",
			since.Round(100*time.Millisecond), tr.Takeover.Round(100*time.Millisecond))
		if since < 2*expiryTTL || since > 2*expiryTTL+expiryDelay {
			t.Errorf("the holder thawed %s after its last renew, outside [2×TTL, 2×TTL + delay] = [%s, %s]: the scenario missed its window",
				since, 2*expiryTTL, 2*expiryTTL+expiryDelay)
		}
	} else if left {
		t.Errorf("the holder does not say when its last renew was sent:\n%s", said)
	}
}

// describeIntervals lists workload intervals for a failure message.
func describeIntervals(ivs []harness.Interval) string {
	var b strings.Builder
	for _, iv := range ivs {
		fmt.Fprintf(&b, "\n  alloc %.8s fence %s pid %d ended=%t for %s", iv.AllocID, iv.Fence, iv.PID, iv.Ended, iv.Duration().Round(time.Millisecond))
	}
	return b.String()
}

// expiryFrozenGateTrial is the scenario with a gate: three allocations of a
// gate (ttl 10s, delay 10s) holding the lock for a raw_exec gated app that
// takes 3s to stop after SIGTERM. The holder's gate supervisor and the
// plugin are frozen just after a renew (nothing else stops a gated app: it
// runs under another driver), and the plugin is thawed inside
// [2×TTL, 2×TTL + delay] after that renew; the supervisor once the
// plugin's watchdog has killed it. The
// plugin's watchdog kills the gated app and the frozen supervisor, and its
// crash release, judging by the last renew the supervisor recorded, must
// leave the lock to expire: a release then would let the pending expiry
// clear the next holder's lock while its app runs.
func expiryFrozenGateTrial(t *testing.T, a *harness.Agent, records, name string, tr *chaosTrial) {
	j := newGateJobID(t, name, "raw_exec", records)
	j.count, j.noService = 3, true
	j.ttl, j.delay = expiryTTL.String(), expiryDelay.String()
	j.extraArgs, j.appKill = []string{"-stop-after", "3s"}, "6s"
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	for range 2 {
		j.standby(t, a, holder) // both others wait for the lock
	}

	sup := drvSupervisor(t, holder).PID
	plugin := drvPlugin(t, a.Client().PID(), 0, 10*time.Second).PID
	drvSIGCONTCleanup(t, sup)
	drvSIGCONTCleanup(t, plugin)
	drvWaitRenew(t, a, holder, 2*expiryTTL) // the status shows a renew just acknowledged
	for _, pid := range []int{plugin, sup} {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	frozen, at := time.Now(), harness.MonoNow()
	// The last acknowledged renew was sent just before the freeze.
	time.Sleep(time.Until(frozen.Add(2*expiryTTL + 2*time.Second)))
	// The plugin's watchdog acts first: it kills the holder's app
	// (SIGKILL: no end record), then the still frozen supervisor.
	if err := syscall.Kill(plugin, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Since(frozen)
	gone := drvWaitGone(t, app.PID, 60*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	// The supervisor is thawed only once the watchdog has killed it (or
	// after 30s): thawed earlier, it would find its lease past the fence
	// deadline and end it itself, and the plugin's crash release, which
	// this row is about, would not run.
	for until := time.Now().Add(30 * time.Second); drvAlive(sup) && time.Now().Before(until); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(sup, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
		t.Fatal(err)
	}
	t.Logf("froze the holder's gate and the plugin (alloc %s) at +%s after its app's start, thawed the plugin %s later; the app was gone %s after the thaw",
		drvShort(holder), frozen.Sub(first.Wall).Round(time.Millisecond), thawed.Round(time.Millisecond),
		(time.Duration(gone-at) - thawed).Round(time.Millisecond))
	next := j.start(t, holder, at, 2*expiryTTL+expiryDelay+30*time.Second)
	tr.Takeover = time.Duration(next.Mono - at)
	harness.Measure(t, "expiry_frozen_gate_takeover_after_freeze", tr.Takeover)
	if next.Mono < gone {
		t.Errorf("the next app (alloc %s) started %s before the frozen holder's app was gone", drvShort(next.AllocID), time.Duration(gone-next.Mono))
	}
	// Watch past the moment the pending expiry of an early release would
	// have hit the next holder (≤ 2×TTL + delay after the freeze), and
	// one stop more.
	watchUntil := frozen.Add(2*expiryTTL + expiryDelay + 15*time.Second)
	if w := next.Wall.Add(15 * time.Second); w.After(watchUntil) {
		watchUntil = w
	}
	time.Sleep(time.Until(watchUntil))
	if starts := drvStarts(j.records(t)); len(starts) != 2 {
		t.Errorf("want the holder's app and exactly one takeover, got %d app starts: %+v", len(starts), starts)
	}
	if v := drvLock(t, a, j.lockPath()); v.Lock == nil || v.Items["holder_alloc_id"] != next.AllocID {
		t.Errorf("lock %s %s after the freeze: %+v %v, want still held by the next holder %s", j.lockPath(),
			time.Since(frozen).Round(time.Second), v.Lock, v.Items, drvShort(next.AllocID))
	}
	chaosGateOnlyIn(t, j.records(t), []string{holder, next.AllocID}, []int64{0, at})

	// The plugin, for the frozen gate, killed its app and left the lock to
	// expire; it never released it.
	chaosGateWatchdogFired(t, a, holder)
	evs, err := a.TaskEvents(holder, "gate")
	if err != nil {
		t.Fatal(err)
	}
	var said strings.Builder
	for _, ev := range evs {
		said.WriteString(drvEventText(ev) + "\n")
	}
	before, _, left := strings.Cut(said.String(), "left to expire")
	if !left || strings.Contains(before, "Released lock") || strings.Contains(said.String(), "Released lock") {
		t.Errorf("the plugin did not leave the frozen gate's lock to expire (it must not release it):\n%s", said.String())
	}
	if m := regexp.MustCompile(`last acknowledged renew was sent ([0-9.]+m?s) ago`).FindStringSubmatch(said.String()); m != nil {
		since, _ := time.ParseDuration(m[1])
		harness.Measure(t, "expiry_frozen_gate_thawed_after_last_renew", since)
		tr.Note = fmt.Sprintf("plugin thawed %s after the last renew: app killed, lock left to expire; next app %s after the freeze",
			since.Round(100*time.Millisecond), tr.Takeover.Round(100*time.Millisecond))
		if since < 2*expiryTTL || since > 2*expiryTTL+expiryDelay {
			t.Errorf("the plugin judged the lease %s after its last renew, outside [2×TTL, 2×TTL + delay] = [%s, %s]: the scenario missed its window",
				since, 2*expiryTTL, 2*expiryTTL+expiryDelay)
		}
	} else if left {
		t.Errorf("the plugin does not say when the gate's last renew was sent:\n%s", said.String())
	}
	chaosGateFinish(t, a, j, smp, tr, known...)
}
