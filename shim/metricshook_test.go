package shim

import (
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
)

// The metrics hook counts a run as an operator reads it: a wait, then the
// acquisition (and how the previous tenure ended), the renews and the time
// they left to the fence deadline, held until the release or the loss
// (and the loss's cause).
func TestMetricsCountTheRun(t *testing.T) {
	tests := []struct {
		name string
		// end ends the tenure the test way: a stop, or a loss.
		end       func(r *runRig)
		wantLoss  string // a loss counted under this cause ("": none)
		wantEnded State
	}{
		{"stopped", func(r *runRig) { r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second} }, "", StateReleased},
		{"lock taken by another holder", func(r *runRig) { r.srv.TakeOver(time.Second) }, "conflict", StateLost},
		{"lock expired under the holder", func(r *runRig) { expiredUnderUs(r.srv) }, "", StateLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunRig(t, sleeper, 200*time.Millisecond)
			changes := make(chan struct{}, 1)
			r.env.Metrics = NewMetrics(func() {
				select {
				case changes <- struct{}{}:
				default:
				}
			})
			r.srv.TakeOver(50 * time.Millisecond)
			r.run()
			r.event("waiting", inState(StateWaiting))
			waitSnap(t, r.env.Metrics, "waiting", func(s lockmetrics.Snapshot) bool { return !s.WaitingSince.IsZero() && !s.Held })
			r.srv.Free()
			r.holding()
			s := waitSnap(t, r.env.Metrics, "held, with renews", func(s lockmetrics.Snapshot) bool {
				return s.Held && s.RenewLatency["renew"] != nil && s.RenewLatency["renew"].Count >= 2
			})
			fence, _ := r.srv.LastGrant()
			if s.Fence != fence || s.Acquisitions["expiry"] != 1 || s.Waits == nil || s.Waits.Count != 1 || !s.WaitingSince.IsZero() {
				t.Errorf("while held: %+v; want fence %d, one acquisition after the previous holder's lock came free unmarked, one wait", s, fence)
			}
			if fl := s.FenceLeft["renew"]; fl == nil || fl.Count < 2 || fl.Sum <= 0 {
				t.Errorf("time left to the fence deadline at renews: %+v", fl)
			}
			if s.HeldSince.IsZero() || s.LastRenew.IsZero() || time.Since(s.LastRenew) > time.Second {
				t.Errorf("held since %v, last renew %v", s.HeldSince, s.LastRenew)
			}
			tc.end(r)
			r.event(string(tc.wantEnded), inState(tc.wantEnded))
			r.exit()
			s = r.env.Metrics.Snapshot()
			if s.Held || !s.HeldSince.IsZero() {
				t.Errorf("after the tenure: held %v since %v", s.Held, s.HeldSince)
			}
			var losses uint64
			for _, n := range s.Losses {
				losses += n
			}
			switch {
			case tc.wantLoss == "" && tc.wantEnded == StateReleased && losses != 0:
				t.Errorf("losses %v after a stop", s.Losses)
			case tc.wantLoss != "" && (s.Losses[tc.wantLoss] != 1 || losses != 1):
				t.Errorf("losses %v, want one %s", s.Losses, tc.wantLoss)
			case tc.wantEnded == StateLost && losses != 1:
				t.Errorf("losses %v, want one", s.Losses)
			}
		})
	}
}

// A run whose previous holder released the lock (and marked it so) counts
// its acquisition as after a release; Snapshot is a copy the hook does not
// change afterwards.
func TestMetricsAcquiredAfterARelease(t *testing.T) {
	first := newRunRig(t, sleeper, 200*time.Millisecond)
	first.run()
	first.holding()
	first.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
	first.exit()

	r := newRunRig(t, sleeper, 200*time.Millisecond)
	r.srv = first.srv
	r.sup.Locker = first.srv.Locker(t, first.sup.Locker.Config())
	r.env.Metrics = NewMetrics(nil)
	r.run()
	r.holding()
	s := waitSnap(t, r.env.Metrics, "held", func(s lockmetrics.Snapshot) bool { return s.Held })
	if s.Acquisitions["released"] != 1 || len(s.Acquisitions) != 1 {
		t.Errorf("acquisitions %v, want one after a release", s.Acquisitions)
	}
	s.Acquisitions["released"] = 99
	if again := r.env.Metrics.Snapshot(); again.Acquisitions["released"] != 1 {
		t.Errorf("a change to a snapshot reached the count: %v", again.Acquisitions)
	}
}

// waitSnap waits for a snapshot ok accepts.
func waitSnap(t *testing.T, m *Metrics, what string, ok func(lockmetrics.Snapshot) bool) lockmetrics.Snapshot {
	t.Helper()
	deadline := time.Now().Add(ceiling)
	for {
		s := m.Snapshot()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics not %s within %s: %+v", what, ceiling, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
