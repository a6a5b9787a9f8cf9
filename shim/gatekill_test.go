package shim

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// H1(a): the gate's kill of its gated tasks is never bounded by the
// lease's stop deadline. Past it (a 409 just before the fence deadline, a
// slow engine), every attempt still gets a budget of its own, and a
// failed one is retried. (Before: each attempt's context ended at the stop
// deadline, so past it the kill killed nothing and was given up.)
func TestGateKillOutlivesTheStopDeadline(t *testing.T) {
	defer func(d time.Duration) { gateKillRetryFor = d }(gateKillRetryFor)
	gateKillRetryFor = 3 * time.Second
	r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
	f := r.withKiller("app", "db")
	f.killTakes = 100 * time.Millisecond
	f.killErr, f.failKills = errors.New("docker: no answer"), 1
	lease := r.checkedAndHeld()
	r.srv.TakeOver(time.Second) // a 409: the stop deadline is the fence deadline
	select {
	case <-lease.Lost():
	case <-time.After(ceiling):
		t.Fatal("the lease was not lost")
	}
	// Hold the loss until its stop deadline has passed.
	time.Sleep(lockclient.BootUntil(lease.StopDeadline()) + 10*time.Millisecond)
	if !r.gate().w.kill(lease, "the lock was lost") {
		t.Fatalf("the kill past the stop deadline: not proven dead; events:\n%s", r.eventLog())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kills != 2 {
		t.Errorf("%d kill attempts, want 2 (one failed, retried)", f.kills)
	}
	for i, b := range f.budgets {
		if b < gateKillAllTimeout/2 {
			t.Errorf("attempt %d had %s to kill, want a budget of its own (%s)", i+1, b, gateKillAllTimeout)
		}
		if f.graces[i] > 0 {
			t.Errorf("attempt %d had a grace of %s past the stop deadline, want none (SIGKILL at once)", i+1, f.graces[i])
		}
	}
}

// The same over a whole run: the lock is taken over 100ms before the
// gate's fence deadline and a kill takes longer than that. The gate kills
// its gated tasks and proves them dead, and says so.
func TestGateKillAfterALateConflict(t *testing.T) {
	r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
	f := r.withKiller("app", "db")
	f.killTakes = 300 * time.Millisecond
	r.run()
	held := r.holding()
	r.srv.FailRenew(locktest.Error(500, "rpc error: no leader"))
	// Renews fail from now on: the fence deadline is the last good one's.
	time.Sleep(50 * time.Millisecond)
	var fence time.Time
	r.mu.Lock()
	for _, ev := range r.events {
		if ev.Fence == held.Fence && !ev.FenceDeadline.IsZero() {
			fence = ev.FenceDeadline
		}
	}
	r.mu.Unlock()
	time.Sleep(lockclient.BootUntil(fence) - 100*time.Millisecond)
	r.srv.FailRenew(locktest.Error(409, "variable doesn't hold a lock with this ID"))
	if code := r.exitWithin(lockclient.MinTTL + 2*ceiling); code != ExitLost {
		t.Errorf("exit %d, want ExitLost; events:\n%s", code, r.eventLog())
	}
	if _, killed := f.calls(); !killed {
		t.Errorf("the gated tasks were not killed; events:\n%s", r.eventLog())
	}
	if !r.message("it killed app, db itself, proven dead") {
		t.Errorf("no event says the gate killed its gated tasks; events:\n%s", r.eventLog())
	}
}

// A gated task killed while there is time gets its kill_signal and its
// kill_timeout (the killer's grace), cut to what the lease's stop deadline
// leaves: a SIGTERM to a gate whose lease is healthy gives them the time.
func TestGateKillGivesTheGatedTasksTheirGrace(t *testing.T) {
	r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
	f := r.withKiller("app", "db")
	r.run()
	r.holding()
	r.sigs <- syscall.SIGTERM
	if code := r.exit(); code != 1 {
		t.Errorf("exit %d, want 1; events:\n%s", code, r.eventLog())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.graces) == 0 || f.graces[0] < lockclient.MinTTL/2 {
		t.Errorf("kill graces %v, want the first well above 0 (the lease's stop deadline is 2×TTL away)", f.graces)
	}
}
