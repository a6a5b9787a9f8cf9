package lockmetrics

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Kind is a metric family's Prometheus type.
type Kind string

// The types used.
const (
	KindGauge     Kind = "gauge"
	KindCounter   Kind = "counter"
	KindHistogram Kind = "histogram"
)

// Desc declares one metric family. Every series of it carries TaskLabels,
// then "slot" if Slot, then Labels.
type Desc struct {
	Name, Help string
	Kind       Kind
	// Slot adds the semaphore slot held ("" for a plain lock, or while
	// waiting). Only gauges of the tenure carry it: a counter keeps one
	// series per task whatever slot it holds.
	Slot    bool
	Labels  []string
	Buckets []float64 // a histogram's upper bounds
}

// TaskLabels name the task of every series, in this order.
var TaskLabels = []string{"namespace", "job", "group", "task", "alloc_id", "path"}

// LabelNames are d's label names, in order.
func (d *Desc) LabelNames() []string {
	names := slices.Clone(TaskLabels)
	if d.Slot {
		names = append(names, "slot")
	}
	return append(names, d.Labels...)
}

// Bucket bounds, in seconds.
var (
	latencyBuckets   = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	fenceLeftBuckets = []float64{.5, 1, 2, 3, 5, 8, 13, 21, 34, 60}
	waitBuckets      = []float64{.1, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}
	lbBuckets        = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// The supervisor's families: every task, under `lock` and the driver.
var (
	HeldDesc = &Desc{Name: "nomad_singleton_lock_held", Kind: KindGauge, Slot: true,
		Help: "1 while this task holds the lock (from its acquire to its release or loss), 0 while it waits or after."}
	FenceDesc = &Desc{Name: "nomad_singleton_lock_fence", Kind: KindGauge, Slot: true,
		Help: "The fence (the lock variable's ModifyIndex at the acquire) of this task's last acquisition; 0 before the first."}
	AcquiredDesc = &Desc{Name: "nomad_singleton_lock_acquired_timestamp_seconds", Kind: KindGauge, Slot: true,
		Help: "When this task acquired the lock it holds (Unix time); 0 while it does not hold it."}
	AcquisitionsDesc = &Desc{Name: "nomad_singleton_lock_acquisitions_total", Kind: KindCounter, Labels: []string{"reason"},
		Help: "Acquisitions of the lock by this task, by how the previous tenure ended: first (no previous holder), released, step_down (released by a holder that stepped down: lock step-down), expiry (no release recorded), lease_takeover; adopted: a restarted gate took over its own lease."}
	LossesDesc = &Desc{Name: "nomad_singleton_lock_losses_total", Kind: KindCounter, Labels: []string{"reason"},
		Help: "Losses of the lock while held, by cause: conflict, expiry, fence_deadline, lease_takeover, deleted."}
	RenewDurationDesc = &Desc{Name: "nomad_singleton_lock_renew_duration_seconds", Kind: KindHistogram, Labels: []string{"op"}, Buckets: latencyBuckets,
		Help: "Time from the send of an acknowledged renew (op=renew) or lease-mode heartbeat (op=heartbeat) to its answer."}
	RenewFailuresDesc = &Desc{Name: "nomad_singleton_lock_renew_failures_total", Kind: KindCounter, Labels: []string{"op"},
		Help: "Renews (op=renew) or lease-mode heartbeats (op=heartbeat) that were not acknowledged."}
	FenceLeftDesc = &Desc{Name: "nomad_singleton_lock_fence_time_left_seconds", Kind: KindHistogram, Labels: []string{"op"}, Buckets: fenceLeftBuckets,
		Help: "Time that was left to the fence deadline when a renew or heartbeat was acknowledged: how close the holder came to fencing itself."}
	WaitingDesc = &Desc{Name: "nomad_singleton_lock_waiting_seconds", Kind: KindGauge,
		Help: "How long this task has been waiting for the lock as a standby; 0 when it does not wait."}
	WaitDurationDesc = &Desc{Name: "nomad_singleton_lock_wait_duration_seconds", Kind: KindHistogram, Buckets: waitBuckets,
		Help: "Time spent waiting as a standby, from the start of the wait to the acquire."}
	LBRequestsDesc = &Desc{Name: "nomad_singleton_lb_requests_total", Kind: KindCounter, Labels: []string{"op", "result"},
		Help: "Load balancer requests by op (add, readd, remove) and result (success, failed, canceled, invalid_request_noop, unknown)."}
	LBDurationDesc = &Desc{Name: "nomad_singleton_lb_request_duration_seconds", Kind: KindHistogram, Labels: []string{"op"}, Buckets: lbBuckets,
		Help: "Time a load balancer request took to its final state (polls, retries and cancel included)."}
)

// The plugin's own families (driver tasks and gates).
var (
	CrashReleasesDesc = &Desc{Name: "nomad_singleton_plugin_crash_releases_total", Kind: KindCounter, Labels: []string{"result"},
		Help: "Locks the plugin dealt with for a supervisor that died holding one, by result: released, not_released, left_to_expire, kept (a gate's lock, left to expire)."}
	LeaseTakeoversDesc = &Desc{Name: "nomad_singleton_plugin_lease_takeovers_total", Kind: KindCounter, Labels: []string{"result"},
		Help: "Lease-mode takeovers by this task's standby (the plugin): taken (it released a dead holder's lock), skipped (the heartbeat went stale but the lock was left to the server's expiry)."}
	WatchdogKillsDesc = &Desc{Name: "nomad_singleton_plugin_watchdog_kills_total", Kind: KindCounter,
		Help: "Times the plugin's watchdog killed this task because its supervisor let a deadline pass."}
	HeartbeatAgeDesc = &Desc{Name: "nomad_singleton_lease_heartbeat_age_seconds", Kind: KindGauge,
		Help: "Lease mode: how long this task's standby (the plugin) has seen the holder's heartbeat unchanged; present while it watches."}
)

// Supervisor lists the supervisor's families, PluginFamilies the plugin's.
var (
	Supervisor = []*Desc{HeldDesc, FenceDesc, AcquiredDesc, AcquisitionsDesc, LossesDesc, RenewDurationDesc, RenewFailuresDesc,
		FenceLeftDesc, WaitingDesc, WaitDurationDesc, LBRequestsDesc, LBDurationDesc}
	PluginFamilies = []*Desc{CrashReleasesDesc, LeaseTakeoversDesc, WatchdogKillsDesc, HeartbeatAgeDesc}
)

// Reasons of an acquisition (AcquisitionsDesc).
var AcquisitionReasons = []string{"first", "released", "step_down", "expiry", "lease_takeover", "adopted"}

// Results the plugin counts, each shown from zero.
var (
	CrashReleaseResults = []string{"released", "not_released", "left_to_expire", "kept"}
	TakeoverResults     = []string{"taken", "skipped"}
)

// Sample is one series: its label values (TaskLabels, then the family's
// own) and its value, or its histogram.
type Sample struct {
	Labels []string
	Value  float64
	Hist   *Histogram
}

// Family is one family's samples.
type Family struct {
	Desc    *Desc
	Samples []Sample
}

// Buckets is a histogram sample's cumulative counts by upper bound.
func (s Sample) Buckets(d *Desc) map[float64]uint64 { return s.Hist.cumulative(d.Buckets) }

// Gather turns the tasks' metrics into families, at now. A family with no
// series is left out.
func Gather(tasks []Task, now time.Time) []Family {
	fams := map[*Desc]*Family{}
	add := func(d *Desc, labels []string, v float64, h *Histogram) {
		f := fams[d]
		if f == nil {
			f = &Family{Desc: d}
			fams[d] = f
		}
		f.Samples = append(f.Samples, Sample{Labels: labels, Value: v, Hist: h})
	}
	for _, t := range tasks {
		if t.Snap != nil {
			gatherSnapshot(add, t, now)
		}
		if t.Plugin != nil {
			gatherPlugin(add, t)
		}
	}
	var out []Family
	for _, d := range slices.Concat(Supervisor, PluginFamilies) {
		if f := fams[d]; f != nil {
			out = append(out, *f)
		}
	}
	return out
}

type adder func(d *Desc, labels []string, v float64, h *Histogram)

// labels are a sample's label values for d.
func (t Task) labels(d *Desc, slot string, extra ...string) []string {
	l := t.Labels
	out := []string{l.Namespace, l.Job, l.Group, l.Task, l.AllocID, l.Path}
	if d.Slot {
		out = append(out, slot)
	}
	return append(out, extra...)
}

func gatherSnapshot(add adder, t Task, now time.Time) {
	s := t.Snap
	held := s.Held && !t.Exited
	lbl := func(d *Desc, extra ...string) []string { return t.labels(d, s.Slot, extra...) }
	add(HeldDesc, lbl(HeldDesc), b2f(held), nil)
	add(FenceDesc, lbl(FenceDesc), float64(s.Fence), nil)
	acquired := 0.0
	if held && !s.HeldSince.IsZero() {
		acquired = float64(s.HeldSince.UnixNano()) / 1e9
	}
	add(AcquiredDesc, lbl(AcquiredDesc), acquired, nil)
	for _, r := range AcquisitionReasons {
		add(AcquisitionsDesc, lbl(AcquisitionsDesc, r), float64(s.Acquisitions[r]), nil)
	}
	for _, c := range lockclient.LostCauses() {
		add(LossesDesc, lbl(LossesDesc, string(c)), float64(s.Losses[string(c)]), nil)
	}
	// A histogram shows once it has an observation: a standby, which never
	// renewed, has none (a plugin's standbys are most of its tasks).
	for _, op := range sortedKeys(s.RenewLatency) {
		add(RenewDurationDesc, lbl(RenewDurationDesc, op), 0, s.RenewLatency[op])
	}
	for _, op := range slices.Sorted(maps.Keys(s.RenewFailures)) {
		add(RenewFailuresDesc, lbl(RenewFailuresDesc, op), float64(s.RenewFailures[op]), nil)
	}
	for _, op := range sortedKeys(s.FenceLeft) {
		add(FenceLeftDesc, lbl(FenceLeftDesc, op), 0, s.FenceLeft[op])
	}
	waiting := 0.0
	if !t.Exited && !s.WaitingSince.IsZero() {
		waiting = max(now.Sub(s.WaitingSince).Seconds(), 0)
	}
	add(WaitingDesc, lbl(WaitingDesc), waiting, nil)
	if s.Waits != nil && s.Waits.Count > 0 {
		add(WaitDurationDesc, lbl(WaitDurationDesc), 0, s.Waits)
	}
	for _, k := range slices.Sorted(maps.Keys(s.LBRequests)) {
		op, result, _ := strings.Cut(k, "/")
		add(LBRequestsDesc, lbl(LBRequestsDesc, op, result), float64(s.LBRequests[k]), nil)
	}
	for _, op := range sortedKeys(s.LBLatency) {
		add(LBDurationDesc, lbl(LBDurationDesc, op), 0, s.LBLatency[op])
	}
}

func gatherPlugin(add adder, t Task) {
	p := t.Plugin
	slot := ""
	if t.Snap != nil {
		slot = t.Snap.Slot
	}
	lbl := func(d *Desc, extra ...string) []string { return t.labels(d, slot, extra...) }
	for _, r := range CrashReleaseResults {
		add(CrashReleasesDesc, lbl(CrashReleasesDesc, r), float64(p.CrashReleases[r]), nil)
	}
	for _, r := range TakeoverResults {
		add(LeaseTakeoversDesc, lbl(LeaseTakeoversDesc, r), float64(p.LeaseTakeovers[r]), nil)
	}
	add(WatchdogKillsDesc, lbl(WatchdogKillsDesc), float64(p.WatchdogKills), nil)
	if p.StandbyWatching && !t.Exited {
		add(HeartbeatAgeDesc, lbl(HeartbeatAgeDesc), p.HeartbeatAge.Seconds(), nil)
	}
}

// sortedKeys is the keys of m's histograms that have an observation, sorted.
func sortedKeys(m map[string]*Histogram) []string {
	var keys []string
	for k, h := range m {
		if h != nil && h.Count > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// formatFloat is a sample value or bucket bound in the text format.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
