// Package lockmetrics declares every metric the project exposes, once: its
// name, help, type, labels and buckets (families.go), the snapshot of one
// supervisor's counters that the supervisor keeps (and, under the driver,
// writes to its state dir for the plugin), and Gather, which turns the
// snapshots of any number of tasks into metric families at scrape time.
//
// It links no metrics library: the plugin hands the families to
// prometheus/client_golang (driver/metrics.go); `lock`, which must stay
// small, writes them in Prometheus's text format itself (WriteText).
//
// Labels come from the task as the front end names it (the plugin: Nomad's
// task config; `lock`: its environment), never a secret: no lock ID, no
// token.
package lockmetrics

import (
	"slices"
	"sort"
	"time"
)

// Histogram is a Prometheus histogram's state: Counts[i] observations of at
// most Buckets[i] (not cumulative), over the family's buckets, and one more
// count for +Inf.
type Histogram struct {
	Counts []uint64 `json:"counts"`
	Sum    float64  `json:"sum"`
	Count  uint64   `json:"count"`
}

// Observe adds v to h, whose buckets are bounds.
func (h *Histogram) Observe(bounds []float64, v float64) {
	if len(h.Counts) != len(bounds)+1 {
		h.Counts = make([]uint64, len(bounds)+1)
	}
	i := sort.SearchFloat64s(bounds, v) // the first bound >= v
	h.Counts[i]++
	h.Sum += v
	h.Count++
}

// cumulative is h's bucket counts as Prometheus wants them, by upper bound.
func (h *Histogram) cumulative(bounds []float64) map[float64]uint64 {
	out := make(map[float64]uint64, len(bounds))
	var n uint64
	for i, b := range bounds {
		if i < len(h.Counts) {
			n += h.Counts[i]
		}
		out[b] = n
	}
	return out
}

// Snapshot is one supervisor's metrics: what its metrics hook counted
// (shim/metricshook.go). Under the driver the supervisor writes it to its
// state dir (metrics.json) and the plugin reads it at each scrape.
type Snapshot struct {
	// Held: the supervisor holds the lock (from its acquire to its release
	// or loss).
	Held bool `json:"held"`
	// Fence is the fence of the last acquisition (0: none yet).
	Fence uint64 `json:"fence,omitempty"`
	// Slot is the semaphore slot held ("" for a plain lock, or while waiting).
	Slot string `json:"slot,omitempty"`
	// HeldSince is when the lock was acquired, while Held.
	HeldSince time.Time `json:"held_since,omitzero"`
	// WaitingSince is when the current wait for the lock began; zero when
	// not waiting.
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	// LastRenew is when the last acknowledged renew (or the acquire) was
	// sent, while Held.
	LastRenew time.Time `json:"last_renew,omitzero"`

	Acquisitions  map[string]uint64     `json:"acquisitions,omitempty"`   // by reason
	Losses        map[string]uint64     `json:"losses,omitempty"`         // by cause
	RenewLatency  map[string]*Histogram `json:"renew_latency,omitempty"`  // by op: renew, heartbeat
	RenewFailures map[string]uint64     `json:"renew_failures,omitempty"` // by op
	FenceLeft     map[string]*Histogram `json:"fence_left,omitempty"`     // by op
	Waits         *Histogram            `json:"waits,omitempty"`
	LBRequests    map[string]uint64     `json:"lb_requests,omitempty"` // by "op/result"
	LBLatency     map[string]*Histogram `json:"lb_latency,omitempty"`  // by op
}

// Clone is a deep copy of s.
func (s Snapshot) Clone() Snapshot {
	c := s
	c.Acquisitions, c.Losses = cloneMap(s.Acquisitions), cloneMap(s.Losses)
	c.RenewFailures, c.LBRequests = cloneMap(s.RenewFailures), cloneMap(s.LBRequests)
	c.RenewLatency, c.FenceLeft, c.LBLatency = cloneHists(s.RenewLatency), cloneHists(s.FenceLeft), cloneHists(s.LBLatency)
	if s.Waits != nil {
		w := *s.Waits
		w.Counts = slices.Clone(w.Counts)
		c.Waits = &w
	}
	return c
}

func cloneMap(m map[string]uint64) map[string]uint64 {
	if m == nil {
		return nil
	}
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func cloneHists(m map[string]*Histogram) map[string]*Histogram {
	if m == nil {
		return nil
	}
	out := make(map[string]*Histogram, len(m))
	for k, h := range m {
		c := *h
		c.Counts = slices.Clone(h.Counts)
		out[k] = &c
	}
	return out
}

// Count adds one to m[key], making m if needed.
func Count(m *map[string]uint64, key string) {
	if *m == nil {
		*m = map[string]uint64{}
	}
	(*m)[key]++
}

// ObserveIn adds v to the histogram m[key] of family d.
func ObserveIn(m *map[string]*Histogram, d *Desc, key string, v float64) {
	if *m == nil {
		*m = map[string]*Histogram{}
	}
	h := (*m)[key]
	if h == nil {
		h = &Histogram{}
		(*m)[key] = h
	}
	h.Observe(d.Buckets, v)
}

// PluginCounts are what the plugin counts for one task itself, from the
// task events it words (driver/metrics.go).
type PluginCounts struct {
	CrashReleases  map[string]uint64 // by result
	LeaseTakeovers map[string]uint64 // by result
	WatchdogKills  uint64
	// StandbyWatching: the plugin's lease-mode standby watches this task's
	// lock's heartbeat, which it saw unchanged for HeartbeatAge.
	StandbyWatching bool
	HeartbeatAge    time.Duration
}

// Clone is a deep copy of p.
func (p PluginCounts) Clone() PluginCounts {
	c := p
	c.CrashReleases, c.LeaseTakeovers = cloneMap(p.CrashReleases), cloneMap(p.LeaseTakeovers)
	return c
}

// Labels name one task in every series of it.
type Labels struct {
	Namespace, Job, Group, Task, AllocID, Path string
}

// Task is one task's metrics at a scrape.
type Task struct {
	Labels Labels
	// Snap is the supervisor's snapshot (nil: none written yet).
	Snap *Snapshot
	// Exited: the task's supervisor has exited (it holds nothing).
	Exited bool
	// Plugin is what the plugin counted (nil for `lock`).
	Plugin *PluginCounts
}
