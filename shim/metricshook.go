package shim

import (
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

// metricsHook counts a run's metrics into Supervisor.Metrics: every metric
// the supervisor updates is updated here, from what the other parts of the
// run report, so that no metric call runs through the core loop. It goes
// first among the hooks, so that it sees each lease before any other
// hook's acquired may fail.
type metricsHook struct{ m *Metrics }

// newMetricsHook attaches the hook to the run's lease observer.
func newMetricsHook(s *Supervisor) *metricsHook {
	h := &metricsHook{m: s.Metrics}
	if s.Locker != nil {
		s.Locker.SetObserver(h)
	}
	return h
}

func (h *metricsHook) hookName() string { return "metrics" }

// acquired counts the acquisition, by how the previous tenure ended as the
// record read before the acquire tells: the lock is held from here on.
func (h *metricsHook) acquired(lease *lockclient.Lease) bool {
	reason := "expiry"
	p := lease.Previous
	switch {
	case lease.Adopted:
		reason = "adopted"
	case lease.PreviousTakenOver():
		reason = "lease_takeover"
	case p.IsZero():
		reason = "first"
	case !p.ReleasedAt.IsZero() || p.ReleasedClean:
		reason = "released"
	}
	now := time.Now()
	h.m.update(func(s *lockmetrics.Snapshot) {
		lockmetrics.Count(&s.Acquisitions, reason)
		s.Held, s.HeldSince, s.Fence, s.Slot = true, now, lease.Fence, ""
		if lease.Holders > 0 {
			s.Slot = strconv.Itoa(lease.Slot)
		}
		if !s.WaitingSince.IsZero() {
			s.Waits = observe(s.Waits, lockmetrics.WaitDurationDesc, now.Sub(s.WaitingSince))
			s.WaitingSince = time.Time{}
		}
	})
	return true
}

// observe follows the run's events: the start of a wait, the end of the
// tenure, and the last acknowledged renew that holding events carry.
func (h *metricsHook) observe(ev Event) {
	h.m.update(func(s *lockmetrics.Snapshot) {
		switch {
		case ev.State == StateWaiting && s.WaitingSince.IsZero() && !s.Held:
			s.WaitingSince = ev.Time
		case ev.State == StateLost || ev.State == StateReleased:
			s.Held, s.HeldSince, s.LastRenew = false, time.Time{}, time.Time{}
		case s.Held && !ev.LastRenew.IsZero():
			// LastRenew is on the lease's clock (CLOCK_BOOTTIME): its age
			// is taken off the event's wall time.
			s.LastRenew = ev.Time.Add(-lockclient.BootNow().Sub(ev.LastRenew))
		}
	})
}

// Renewed is the lease's report of one renew or heartbeat.
func (h *metricsHook) Renewed(r lockclient.RenewReport) {
	op := string(r.Op)
	h.m.update(func(s *lockmetrics.Snapshot) {
		if r.Failed {
			lockmetrics.Count(&s.RenewFailures, op)
			return
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
