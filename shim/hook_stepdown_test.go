package shim

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Tests of a run's step-down (hook_stepdown.go) over locktest.Vars, where
// the lock, its step-down request and its standby records are variables
// of their own, as on Nomad.

// newStepDownRig is a runRig whose lock API is a locktest.Vars.
func newStepDownRig(t *testing.T, script string) (*runRig, *locktest.Vars) {
	t.Helper()
	r := newRunRig(t, script, time.Second)
	vars := locktest.NewVars()
	cfg := lockclient.Config{Path: r.spec.Path, Timing: locktest.Timing(), Holder: r.spec.Holder}
	r.srv, r.sup.Locker = vars.Server(cfg.Path), vars.Locker(t, cfg)
	r.watchReleases()
	return r, vars
}

// operator is the Locker of a token that may release the lock at path.
func operator(t *testing.T, vars *locktest.Vars, path string) *lockclient.Locker {
	return vars.Locker(t, lockclient.Config{Path: path, Timing: locktest.Timing()})
}

// standbyRecorded waits until path's standby record of alloc exists (or,
// with gone, no longer does).
func standbyRecorded(t *testing.T, vars *locktest.Vars, path, alloc string, gone bool) {
	t.Helper()
	s := vars.Server(lockclient.StandbyPrefixFor(path) + alloc)
	deadline := time.Now().Add(ceiling)
	for (len(s.Items()) == 0) != gone {
		if time.Now().After(deadline) {
			t.Fatalf("standby record of %s: want gone=%v within %s, items %v", alloc, gone, ceiling, s.Items())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A step-down of a process workload: its holder record offers it; a
// request proved with the lock ID stops the workload through the stop
// path (proven dead before the release), the release leaves the handover
// and the clean mark, and the run waits again as a standby (recorded as
// one), gives way for the handover's wait, and then, nobody else having
// taken the lock, takes it back and starts its workload again under the
// new fence. Run never returns meanwhile.
func TestStepDownStopsTheWorkloadAndWaitsAgain(t *testing.T) {
	r, vars := newStepDownRig(t, sleeper)
	r.run()
	first := r.event("holding", inState(StateHolding))
	standbyRecorded(t, vars, r.spec.Path, "alloc-self", true)
	op, ctx := operator(t, vars, r.spec.Path), context.Background()
	target, err := op.StepDownTarget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if target.Holder.StepDown != lockclient.StepDownStop || target.Holder.StepDownWithin <= 0 {
		t.Fatalf("the holder's record offers %q within %s, want %q", target.Holder.StepDown, target.Holder.StepDownWithin, lockclient.StepDownStop)
	}
	const wait = 400 * time.Millisecond
	if _, err := op.SendStepDown(ctx, target, lockclient.StepDownRequest{To: "alloc-b", Wait: wait, Expires: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}

	r.event("stepped down", func(ev Event) bool { return strings.HasPrefix(ev.Message, "Stepped down: ") })
	r.checkReleasesAfterDeath(1)
	items := r.srv.Items()
	if items["step_down_from"] != "alloc-self" || items["step_down_to"] != "alloc-b" || items["released_clean"] != "true" {
		t.Errorf("the released record %v: want the handover to alloc-b and the clean mark", items)
	}
	releasedAt := time.Now()
	standbyRecorded(t, vars, r.spec.Path, "alloc-self", false)

	second := r.event("holding again", func(ev Event) bool { return ev.State == StateHolding && ev.Fence > first.Fence })
	if _, at := r.srv.LastGrant(); at.Before(releasedAt.Add(wait - 100*time.Millisecond)) {
		t.Errorf("the former holder took the lock back %s after its release, within the handover's wait (%s)", at.Sub(releasedAt), wait)
	}
	for deadline := time.Now().Add(ceiling); !strings.Contains(r.out.String(), "started fence="+strconv.FormatUint(second.Fence, 10)); {
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not start again under fence %d: %q", second.Fence, r.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	select {
	case code := <-r.code:
		t.Fatalf("Run ended (%d) after the step-down; events:\n%s", code, r.eventLog())
	default:
	}
	standbyRecorded(t, vars, r.spec.Path, "alloc-self", true)
}

// A request that proves nothing to the holder changes nothing: the holder
// reads it and runs on, and the next valid request is the one it acts on,
// once.
func TestStepDownIgnoresUnprovedRequests(t *testing.T) {
	tests := []struct {
		name string
		// send writes the request that must have no effect.
		send func(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, req *locktest.Server)
	}{
		{"forged proof", func(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, req *locktest.Server) {
			sendStepDown(t, op, target, "alloc-evil", time.Minute)
			items := req.Items()
			items["mac"] = strings.Repeat("ab", 32)
			req.SetItems(items)
		}},
		{"target changed after the proof", func(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, req *locktest.Server) {
			sendStepDown(t, op, target, "alloc-b", time.Minute)
			items := req.Items()
			items["to"] = "alloc-evil"
			req.SetItems(items)
		}},
		{"for another holder", func(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, _ *locktest.Server) {
			target.Holder.AllocID = "alloc-other"
			sendStepDown(t, op, target, "alloc-evil", time.Minute)
		}},
		{"expired", func(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, _ *locktest.Server) {
			sendStepDown(t, op, target, "alloc-evil", -time.Second)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, vars := newStepDownRig(t, sleeper)
			r.run()
			r.event("holding", inState(StateHolding))
			op := operator(t, vars, r.spec.Path)
			target, err := op.StepDownTarget(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			req := vars.Server(lockclient.StepDownPathFor(r.spec.Path))
			waitWatched(t, req, 0) // the holder watches
			reads := req.Calls(locktest.OpRead)
			tc.send(t, op, target, req)
			waitWatched(t, req, reads) // and read it
			if !r.workloadAlive() || !r.srv.Held() {
				t.Fatalf("the workload or the lock went on a request that proves nothing; events:\n%s", r.eventLog())
			}
			sendStepDown(t, op, target, "alloc-b", time.Minute)
			r.event("stepped down", func(ev Event) bool { return strings.HasPrefix(ev.Message, "Stepped down: ") })
			if to := r.srv.Items()["step_down_to"]; to != "alloc-b" {
				t.Errorf("handed over to %q, want alloc-b", to)
			}
			r.checkReleasesAfterDeath(1)
		})
	}
}

// sendStepDown writes a request for target's holder naming to, expiring
// in expires.
func sendStepDown(t *testing.T, op *lockclient.Locker, target lockclient.StepDownTarget, to string, expires time.Duration) {
	t.Helper()
	if _, err := op.SendStepDown(context.Background(), target, lockclient.StepDownRequest{To: to, Wait: time.Second,
		Expires: time.Now().Add(expires)}); err != nil {
		t.Fatal(err)
	}
}

// waitWatched waits until the request variable's server answered more
// than reads reads: a blocking read returned (it counts as it answers).
func waitWatched(t *testing.T, req *locktest.Server, reads int) {
	t.Helper()
	deadline := time.Now().Add(ceiling)
	for req.Calls(locktest.OpRead) <= reads {
		if time.Now().After(deadline) {
			t.Fatalf("the holder did not read the step-down request within %s", ceiling)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A standby records itself while it waits and withdraws the record once it
// holds; when the lock comes free with a handover, it takes it at once if
// it is the standby named, and otherwise gives way until the handover's end.
func TestStandbyGivesWayToAHandover(t *testing.T) {
	const grace = 600 * time.Millisecond
	tests := []struct {
		name     string
		handover lockclient.Handover
		// givesWay: it takes the lock only once the handover's wait is over.
		givesWay bool
	}{
		{"named", lockclient.Handover{From: locktest.OtherAlloc, To: "alloc-self"}, false},
		{"another standby named", lockclient.Handover{From: locktest.OtherAlloc, To: "alloc-c"}, true},
		{"nobody named", lockclient.Handover{From: locktest.OtherAlloc}, false},
		{"it stepped down itself, nobody named", lockclient.Handover{From: "alloc-self"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, vars := newStepDownRig(t, sleeper)
			r.srv.TakeOver(time.Millisecond)
			r.run()
			standbyRecorded(t, vars, r.spec.Path, "alloc-self", false)
			tc.handover.Until = time.Now().Add(grace)
			items := maps.Clone(r.srv.Items())
			maps.Copy(items, tc.handover.Items())
			items["released_clean"] = "true"
			r.srv.SetItems(items)
			r.srv.Free()
			freed := time.Now()
			r.event("holding", inState(StateHolding))
			_, at := r.srv.LastGrant()
			if waited := at.Sub(freed); tc.givesWay != (waited >= grace-100*time.Millisecond) {
				t.Errorf("took the lock %s after it came free; want giving way (%s): %v", waited, grace, tc.givesWay)
			}
			standbyRecorded(t, vars, r.spec.Path, "alloc-self", true)
		})
	}
}

// The acquire's deferral is every hook's: it holds while any holds, and
// otherwise gives way for the longest grace.
func TestAddDefer(t *testing.T) {
	type answer struct {
		grace time.Duration
		hold  bool
	}
	tests := []struct {
		name    string
		answers []answer
		want    answer
	}{
		{"one", []answer{{time.Second, false}}, answer{time.Second, false}},
		{"the longest grace", []answer{{time.Second, false}, {3 * time.Second, false}, {0, false}}, answer{3 * time.Second, false}},
		{"a hold first", []answer{{0, true}, {time.Second, false}}, answer{0, true}},
		{"a hold last", []answer{{time.Second, false}, {0, true}}, answer{0, true}},
		{"none give way", []answer{{0, false}, {0, false}}, answer{0, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var resp PreAcquireResponse
			for _, a := range tc.answers {
				resp.AddDefer(func(context.Context, lockclient.Holder) (time.Duration, bool) { return a.grace, a.hold })
			}
			grace, hold := resp.Defer(context.Background(), lockclient.Holder{})
			if got := (answer{grace, hold}); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
