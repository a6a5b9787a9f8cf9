package shim

import (
	"context"
	"errors"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
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

// Table tests of the metrics hook (metricshook.go), one per phase it takes
// part in, over leases on the in-memory lock: the metric values an
// operator reads.

// metricsPhaseRig is a metrics hook over srv's lock, and a Locker of it.
func metricsPhaseRig(t *testing.T, srv *locktest.Server) (*metricsHook, *Metrics, *lockclient.Locker) {
	t.Helper()
	l := srv.Locker(t, lockclient.Config{Path: "locks/web", Timing: locktest.Timing(), Holder: lockclient.Holder{AllocID: "alloc-self"}})
	m := NewMetrics(nil)
	return newMetricsHook(m, l), m, l
}

// PreAcquire: the wait for the lock begins (nomad_singleton_waiting_since),
// once: a second PreAcquire keeps its start, and one while the lock is
// held starts none.
func TestMetricsHookPreAcquire(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before is the count before the PreAcquire (zero: none yet).
		before    lockmetrics.Snapshot
		wantSince func(before lockmetrics.Snapshot, began time.Time, got time.Time) bool
	}{
		{"a first wait: waiting since now", lockmetrics.Snapshot{},
			func(_ lockmetrics.Snapshot, began, got time.Time) bool {
				return !got.Before(began) && time.Since(got) < ceiling
			}},
		{"waiting already: the wait's start kept", lockmetrics.Snapshot{WaitingSince: time.Unix(1000, 0)},
			func(before lockmetrics.Snapshot, _, got time.Time) bool { return got.Equal(before.WaitingSince) }},
		{"the lock held: no wait", lockmetrics.Snapshot{Held: true, HeldSince: time.Unix(1000, 0)},
			func(_ lockmetrics.Snapshot, _, got time.Time) bool { return got.IsZero() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m, _ := metricsPhaseRig(t, locktest.New())
			m.snap = tc.before
			began := time.Now()
			if err := h.PreAcquire(context.Background(), &PreAcquireResponse{}); err != nil {
				t.Fatal(err)
			}
			s := m.Snapshot()
			if !tc.wantSince(tc.before, began, s.WaitingSince) || s.Held != tc.before.Held {
				t.Errorf("waiting since %v, held %v; before: %+v", s.WaitingSince, s.Held, tc.before)
			}
		})
	}
}

// Held: one acquisition counted under how the previous tenure ended, as
// the record read at the acquire tells (first, released, expiry, adopted);
// the lock held from now on, with its fence (and a semaphore's slot); the
// wait that led to it observed, unless the lease was taken over without
// one.
func TestMetricsHookHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		// previous ends the previous tenure on srv; adopt takes its lease
		// over instead of acquiring; holders makes the lock a semaphore.
		previous func(t *testing.T, srv *locktest.Server)
		adopt    bool
		holders  int
		waited   bool // a PreAcquire came first
		reason   string
		slot     string
	}{
		{name: "no previous holder, after a wait: first, the wait observed", waited: true, reason: "first"},
		{name: "no previous holder, no wait: first, no wait observed", reason: "first"},
		{name: "the previous holder released it: released", waited: true, reason: "released",
			previous: func(t *testing.T, srv *locktest.Server) {
				prev, err := srv.Locker(t, lockclient.Config{Path: "locks/web", Timing: locktest.Timing(),
					Holder: lockclient.Holder{AllocID: "alloc-prev"}}).Acquire(context.Background(), lockclient.AcquireOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := prev.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the previous holder's lock expired: expiry", waited: true, reason: "expiry",
			previous: func(t *testing.T, srv *locktest.Server) { srv.TakeOver(0); srv.Expire() }},
		{name: "a restarted gate's lease taken over: adopted, no wait observed", waited: true, adopt: true, reason: "adopted",
			previous: func(t *testing.T, srv *locktest.Server) { srv.TakeOver(time.Second) }},
		{name: "a semaphore's slot: its slot shown", waited: true, holders: 2, reason: "first", slot: "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h *metricsHook
			var m *Metrics
			var l *lockclient.Locker
			if tc.holders > 0 {
				vs := locktest.NewVars()
				l = vs.Locker(t, lockclient.Config{Path: "locks/web", Holders: tc.holders, Timing: locktest.Timing()})
				m = NewMetrics(nil)
				h = newMetricsHook(m, l)
			} else {
				srv := locktest.New()
				if tc.previous != nil {
					tc.previous(t, srv)
				}
				h, m, l = metricsPhaseRig(t, srv)
			}
			if tc.waited {
				if err := h.PreAcquire(context.Background(), &PreAcquireResponse{}); err != nil {
					t.Fatal(err)
				}
			}
			var lease *lockclient.Lease
			var err error
			if tc.adopt {
				lease, err = l.AdoptPath(context.Background(), "", "locktest-lock-1", 1)
			} else {
				lease, err = l.Acquire(context.Background(), lockclient.AcquireOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			if err := h.Held(context.Background(), lease); err != nil {
				t.Fatal(err)
			}
			s := m.Snapshot()
			if s.Acquisitions[tc.reason] != 1 || len(s.Acquisitions) != 1 {
				t.Errorf("acquisitions %v, want one %s", s.Acquisitions, tc.reason)
			}
			if !s.Held || s.HeldSince.IsZero() || s.LastRenew.IsZero() || s.Fence != lease.Fence || s.Slot != tc.slot || !s.WaitingSince.IsZero() {
				t.Errorf("held %v since %v, last renew %v, fence %d (want %d), slot %q (want %q), waiting since %v",
					s.Held, s.HeldSince, s.LastRenew, s.Fence, lease.Fence, s.Slot, tc.slot, s.WaitingSince)
			}
			waits := uint64(0)
			if s.Waits != nil {
				waits = s.Waits.Count
			}
			if want := tc.waited && !tc.adopt; (waits == 1) != want || waits > 1 {
				t.Errorf("%d waits observed, want one: %v", waits, want)
			}
			// A snapshot is a copy: a change to it never reaches the count.
			s.Acquisitions[tc.reason] = 99
			if again := m.Snapshot(); again.Acquisitions[tc.reason] != 1 {
				t.Errorf("a change to a snapshot reached the count: %v", again.Acquisitions)
			}
		})
	}
}

// Released: the tenure ends once the lock is released (or nothing was
// left to release); a release that failed, or a lock kept for the plugin
// to release, is still the run's to count as held.
func TestMetricsHookReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		held bool
	}{
		{"released: no longer held", nil, false},
		{"the release failed: still held (it expires on the server)", errors.New("rpc error: no leader"), true},
		{"kept for the plugin (the identity rejected): still held", lockclient.ErrIdentityRejected, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m, l := metricsPhaseRig(t, locktest.New())
			lease, err := l.Acquire(context.Background(), lockclient.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			if err := h.Held(context.Background(), lease); err != nil {
				t.Fatal(err)
			}
			var resp ReleaseResponse
			h.Release(context.Background(), ReleaseRequest{Lease: lease, Proven: true}, &resp)
			if !reflect.DeepEqual(resp, ReleaseResponse{}) {
				t.Errorf("the metrics hook decided the release: %+v", resp)
			}
			h.Released(tc.err)
			s := m.Snapshot()
			if s.Held != tc.held || s.HeldSince.IsZero() == tc.held || s.LastRenew.IsZero() == tc.held {
				t.Errorf("held %v since %v, last renew %v; want held %v", s.Held, s.HeldSince, s.LastRenew, tc.held)
			}
		})
	}
}
