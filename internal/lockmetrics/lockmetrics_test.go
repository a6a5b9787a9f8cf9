package lockmetrics_test

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics/prom"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/prototext"
)

// tasks are two tasks of one job, a holder of a semaphore's slot with LB
// requests and a lease-mode standby, with label values that need escaping.
func tasks(now time.Time) []lockmetrics.Task {
	holder := lockmetrics.Snapshot{Held: true, Fence: 4711, Slot: "1", HeldSince: now.Add(-time.Minute), LastRenew: now.Add(-time.Second),
		Acquisitions: map[string]uint64{"released": 2}, Losses: map[string]uint64{"fence_deadline": 1},
		RenewFailures: map[string]uint64{"renew": 3}, LBRequests: map[string]uint64{"add/success": 1, "remove/unknown": 1}}
	lockmetrics.ObserveIn(&holder.RenewLatency, lockmetrics.RenewDurationDesc, "renew", 0.02)
	lockmetrics.ObserveIn(&holder.RenewLatency, lockmetrics.RenewDurationDesc, "renew", 7)
	lockmetrics.ObserveIn(&holder.FenceLeft, lockmetrics.FenceLeftDesc, "renew", 0.8)
	lockmetrics.ObserveIn(&holder.LBLatency, lockmetrics.LBDurationDesc, "add", 0.3)
	standby := lockmetrics.Snapshot{WaitingSince: now.Add(-30 * time.Second)}
	return []lockmetrics.Task{
		{Labels: lockmetrics.Labels{Namespace: "default", Job: `we"b\`, Group: "g", Task: "t", AllocID: "a1", Path: "nomad/jobs/web/lock"}, Snap: &holder},
		{Labels: lockmetrics.Labels{Namespace: "default", Job: `we"b\`, Group: "g", Task: "t", AllocID: "a2", Path: "nomad/jobs/web/lock"}, Snap: &standby,
			Plugin: &lockmetrics.PluginCounts{StandbyWatching: true, HeartbeatAge: 1500 * time.Millisecond,
				LeaseTakeovers: map[string]uint64{"taken": 1}}},
	}
}

// lock's text (WriteText) is what client_golang makes of the same
// families (the plugin's /metrics): the same families, series and values,
// once both are parsed.
func TestWriteTextIsWhatClientGolangWrites(t *testing.T) {
	now := time.Now()
	var ours bytes.Buffer
	if err := lockmetrics.WriteText(&ours, lockmetrics.Gather(tasks(now), now)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prom.NewCollector(func(time.Time) []lockmetrics.Task { return tasks(now) }))
	theirs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(ours.Bytes()))
	if err != nil {
		t.Fatalf("our text does not parse: %v\n%s", err, ours.String())
	}
	if len(parsed) != len(theirs) {
		t.Errorf("%d families in our text, %d from client_golang", len(parsed), len(theirs))
	}
	for _, want := range theirs {
		got := parsed[want.GetName()]
		if got == nil {
			t.Errorf("family %s missing from our text", want.GetName())
			continue
		}
		// The waiting time is read at each gather: leave it out.
		if want.GetName() == lockmetrics.WaitingDesc.Name {
			continue
		}
		if g, w := normal(got), normal(want); g != w {
			t.Errorf("family %s:\nours:\n%s\nclient_golang:\n%s", want.GetName(), g, w)
		}
	}
}

// normal is f in text, as client_golang orders it: labels by name,
// series by their labels; and with no +Inf bucket (implicit in
// client_golang's, explicit in the text).
func normal(f *dto.MetricFamily) string {
	for _, m := range f.Metric {
		slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		if h := m.Histogram; h != nil {
			h.Bucket = slices.DeleteFunc(h.Bucket, func(b *dto.Bucket) bool { return math.IsInf(b.GetUpperBound(), 1) })
		}
	}
	slices.SortFunc(f.Metric, func(a, b *dto.Metric) int {
		return strings.Compare(prototext.Format(&dto.Metric{Label: a.Label}), prototext.Format(&dto.Metric{Label: b.Label}))
	})
	return prototext.Format(f)
}

// The series an operator reads: held and fence per task and slot, losses
// by every cause from zero, histogram buckets cumulative, the standby's
// wait and its view of the heartbeat.
func TestGatherSeries(t *testing.T) {
	now := time.Now()
	var b bytes.Buffer
	if err := lockmetrics.WriteText(&b, lockmetrics.Gather(tasks(now), now)); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, want := range []string{
		`nomad_singleton_lock_held{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",slot="1"} 1`,
		`nomad_singleton_lock_held{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a2",path="nomad/jobs/web/lock",slot=""} 0`,
		`nomad_singleton_lock_fence{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",slot="1"} 4711`,
		`nomad_singleton_lock_losses_total{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",reason="conflict"} 0`,
		`nomad_singleton_lock_losses_total{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",reason="fence_deadline"} 1`,
		`nomad_singleton_lock_renew_duration_seconds_bucket{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",op="renew",le="0.025"} 1`,
		`nomad_singleton_lock_renew_duration_seconds_bucket{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",op="renew",le="5"} 1`,
		`nomad_singleton_lock_renew_duration_seconds_bucket{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",op="renew",le="+Inf"} 2`,
		`nomad_singleton_lock_fence_time_left_seconds_bucket{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",op="renew",le="1"} 1`,
		`nomad_singleton_lb_requests_total{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a1",path="nomad/jobs/web/lock",op="remove",result="unknown"} 1`,
		`nomad_singleton_lease_heartbeat_age_seconds{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a2",path="nomad/jobs/web/lock"} 1.5`,
		`nomad_singleton_plugin_lease_takeovers_total{namespace="default",job="we\"b\\",group="g",task="t",alloc_id="a2",path="nomad/jobs/web/lock",result="taken"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("no line %s", want)
		}
	}
	if strings.Contains(text, `alloc_id="a1",path="nomad/jobs/web/lock"} 0`+"\n"+"# HELP nomad_singleton_lease") {
		t.Errorf("a heartbeat age for a task whose standby does not watch")
	}
}

// A stopped task holds nothing, whatever its last snapshot said, and waits
// for nothing.
func TestGatherStoppedTask(t *testing.T) {
	now := time.Now()
	ts := tasks(now)
	for i := range ts {
		ts[i].Exited = true
	}
	for _, f := range lockmetrics.Gather(ts, now) {
		switch f.Desc {
		case lockmetrics.HeldDesc, lockmetrics.WaitingDesc, lockmetrics.AcquiredDesc:
			for _, s := range f.Samples {
				if s.Value != 0 {
					t.Errorf("%s %v = %v for a stopped task", f.Desc.Name, s.Labels, s.Value)
				}
			}
		case lockmetrics.HeartbeatAgeDesc:
			t.Errorf("%s for a stopped task", f.Desc.Name)
		}
	}
}
