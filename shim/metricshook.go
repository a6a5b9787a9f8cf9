package shim

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Metrics is what a run counts for its metrics (internal/lockmetrics): its
// metrics hook keeps it from the life cycle's events, and from the lease's
// and the LB client's observers. Safe for concurrent use.
type Metrics struct {
	mu   sync.Mutex
	snap lockmetrics.Snapshot
	// changed, if set, runs after each change, outside the lock: the
	// driver's supervisor then writes the snapshot for the plugin. It must
	// not block.
	changed func()
}

// NewMetrics returns an empty count; changed, if not nil, hears of each
// change (and must not block).
func NewMetrics(changed func()) *Metrics { return &Metrics{changed: changed} }

// Snapshot is a copy of the count now.
func (m *Metrics) Snapshot() lockmetrics.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap.Clone()
}

// update changes the count under its lock, then says so.
func (m *Metrics) update(f func(s *lockmetrics.Snapshot)) {
	m.mu.Lock()
	f(&m.snap)
	m.mu.Unlock()
	if m.changed != nil {
		m.changed()
	}
}

// metricsHook counts a run's metrics into Env.Metrics: every metric the
// supervisor updates is updated here, from the phases of the run (the wait
// begins before the acquire; the tenure runs from Held to the release) and
// from the lease's and the LB client's observers, so that no metric call
// runs through the core loop. Attach puts it first among the hooks, so
// that it sees each lease before any other hook's Held may fail.
type metricsHook struct{ m *Metrics }

// newMetricsHook attaches the hook to the run's lease observer.
func newMetricsHook(m *Metrics, locker *lockclient.Locker) *metricsHook {
	h := &metricsHook{m: m}
	locker.SetObserver(h)
	return h
}

func (h *metricsHook) Name() string { return "metrics" }

// PreAcquire starts the wait.
func (h *metricsHook) PreAcquire(context.Context, *PreAcquireResponse) error {
	now := time.Now()
	h.m.update(func(s *lockmetrics.Snapshot) {
		if s.WaitingSince.IsZero() && !s.Held {
			s.WaitingSince = now
		}
	})
	return nil
}

// Held counts the acquisition, by how the previous tenure ended as the
// record read before the acquire tells: the lock is held from here on.
func (h *metricsHook) Held(_ context.Context, lease *lockclient.Lease) error {
	reason := "expiry"
	p := lease.Previous
	switch {
	case lease.Adopted:
		reason = "adopted"
	case lease.PreviousTakenOver():
		reason = "lease_takeover"
	case p.IsZero():
		reason = "first"
	case p.Handover.From != "":
		reason = "step_down"
	case !p.ReleasedAt.IsZero() || p.ReleasedClean:
		reason = "released"
	}
	now := time.Now()
	h.m.update(func(s *lockmetrics.Snapshot) {
		lockmetrics.Count(&s.Acquisitions, reason)
		s.Held, s.HeldSince, s.Fence, s.Slot = true, now, lease.Fence, ""
		s.LastRenew = now.Add(-lockclient.BootNow().Sub(lease.LastRenew())) // the acquire's send, on the wall clock
		if lease.Holders > 0 {
			s.Slot = strconv.Itoa(lease.Slot)
		}
		if !s.WaitingSince.IsZero() && !lease.Adopted {
			// An adopted lease came without a wait for the lock.
			s.Waits = observe(s.Waits, lockmetrics.WaitDurationDesc, now.Sub(s.WaitingSince))
		}
		s.WaitingSince = time.Time{}
	})
	return nil
}

func (h *metricsHook) Release(context.Context, ReleaseRequest, *ReleaseResponse) {}

// Released ends the tenure once the lock is released.
func (h *metricsHook) Released(err error) {
	if err != nil {
		return
	}
	h.m.update(func(s *lockmetrics.Snapshot) {
		s.Held, s.HeldSince, s.LastRenew = false, time.Time{}, time.Time{}
	})
}

// Renewed is the lease's report of one renew or heartbeat: an
// acknowledged renew was sent Took ago, the lease's last renew.
func (h *metricsHook) Renewed(r lockclient.RenewReport) {
	op := string(r.Op)
	now := time.Now()
	h.m.update(func(s *lockmetrics.Snapshot) {
		if r.Failed {
			lockmetrics.Count(&s.RenewFailures, op)
			return
		}
		if r.Op == lockclient.OpRenew && s.Held {
			s.LastRenew = now.Add(-r.Took)
		}
		lockmetrics.ObserveIn(&s.RenewLatency, lockmetrics.RenewDurationDesc, op, r.Took.Seconds())
		lockmetrics.ObserveIn(&s.FenceLeft, lockmetrics.FenceLeftDesc, op, max(r.FenceLeft, 0).Seconds())
	})
}

// Lost is the lease's report of its loss.
func (h *metricsHook) Lost(cause lockclient.LostCause) {
	h.m.update(func(s *lockmetrics.Snapshot) {
		lockmetrics.Count(&s.Losses, string(cause))
		s.Held, s.HeldSince, s.LastRenew = false, time.Time{}, time.Time{}
	})
}

// lbRequest is the LB client's report of one request.
func (h *metricsHook) lbRequest(r lbhook.RequestReport) {
	h.m.update(func(s *lockmetrics.Snapshot) {
		lockmetrics.Count(&s.LBRequests, r.Op+"/"+r.Result)
		lockmetrics.ObserveIn(&s.LBLatency, lockmetrics.LBDurationDesc, r.Op, r.Took.Seconds())
	})
}

// observe adds d to the histogram hist of family desc, made if nil.
func observe(hist *lockmetrics.Histogram, desc *lockmetrics.Desc, d time.Duration) *lockmetrics.Histogram {
	if hist == nil {
		hist = &lockmetrics.Histogram{}
	}
	hist.Observe(desc.Buckets, d.Seconds())
	return hist
}
