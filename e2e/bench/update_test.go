package bench

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// VariantDriverRuleOff is (c) with update_grace = "0s": a standby takes a
// free lock at once, whatever its job version (the rolling-update rule of
// docs/updates.md off), to show the rule's effect beside (c) with it.
const VariantDriverRuleOff = "(c) singleton driver, update_grace = 0s (rule off)"

// updateBlock is the group's update block in the rolling-update scenario.
const updateBlock = `      max_parallel      = 1
      min_healthy_time  = "2s"
      healthy_deadline  = "2m"
      progress_deadline = "3m"`

// rollingUpdate measures rolling updates of a count = 2 group (section
// TitleUpdate): handovers per update, time without a holder per update,
// handovers to an old-version workload, overlaps.
func (b *bench) rollingUpdate(t *testing.T) {
	variants := []string{VariantAnchor, VariantDriverRuleOff, VariantDriver}
	type rows struct{ per, gap, old, over *Row }
	rs := map[string]*rows{}
	for _, v := range variants {
		rs[v] = &rows{per: b.row(TitleUpdate, "handovers per update", v, Count, AggStats, nil)}
	}
	for _, v := range variants {
		rs[v].gap = b.row(TitleUpdate, "time without a holder per update", v, Seconds, AggStats, nil)
	}
	for _, v := range variants {
		rs[v].old = b.row(TitleUpdate, "handovers to an old-version workload", v, Count, AggSum, nil)
	}
	for _, v := range variants {
		var g *Goal
		if v != VariantAnchor {
			g = Zero("the lock decides who runs; the rule only makes an old-version standby wait longer before an acquire.")
		}
		rs[v].over = b.row(TitleUpdate, "updates where two workloads overlapped", v, Count, AggSum, g)
	}
	// One variant at a time: the gaps are sub-second for (c).
	for _, v := range variants {
		t.Run(slug(v), func(t *testing.T) {
			r := rs[v]
			b.updateRuns(t, v, r.per, r.gap, r.old, r.over)
		})
	}
}

func (b *bench) updateRuns(t *testing.T, v string, per, gap, old, over *Row) {
	j := b.newJob("update", v, 2)
	if v == VariantDriverRuleOff {
		j.updateGrace = "0s"
	}
	j.update = updateBlock
	j.extraArgs = []string{"v0"}
	b.register(t, j)
	defer b.stopJob(t, j, 30*time.Second)
	waitStart(t, j.record, 0, 90*time.Second)
	b.waitDeployment(t, j, 0, 3*time.Minute)

	s := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	var at []int64 // monotonic time of each update's submit
	for u := 1; u <= b.cfg.Runs; u++ {
		tag := "v" + strconv.Itoa(u)
		j.extraArgs = []string{tag}
		at = append(at, b.register(t, j))
		b.waitDeployment(t, j, uint64(u), 4*time.Minute)
		harness.WaitRecord(t, j.record, 90*time.Second, func(r harness.Record) bool {
			return r.Event == harness.EventStart && r.Role == harness.RoleMain && len(r.Argv) > 0 && r.Argv[len(r.Argv)-1] == tag
		})
	}
	time.Sleep(2 * time.Second)
	sum := s.Stop()
	recs, err := harness.ReadRecords(j.record)
	if err != nil {
		t.Fatal(err)
	}
	version := map[string]string{} // instance → v0, v1, …
	for _, r := range recs {
		if r.Event == harness.EventStart && r.Role == harness.RoleMain && len(r.Argv) > 0 {
			version[r.Instance] = r.Argv[len(r.Argv)-1]
		}
	}
	ivs := harness.Intervals(recs, sum.GoneByPID())
	n := make([]int, len(at))
	without := make([]time.Duration, len(at))
	olds := make([]int, len(at))
	overlapped := make([]bool, len(at))
	for _, h := range harness.Handovers(ivs) {
		if h.To.Start < at[0] {
			continue
		}
		u := len(at) - 1
		for u > 0 && h.To.Start < at[u] {
			u--
		}
		n[u]++
		if h.Overlap || h.Gap < 0 {
			overlapped[u] = true
		} else {
			without[u] += h.Gap
		}
		if version[h.To.Instance] != "v"+strconv.Itoa(u+1) {
			olds[u]++
		}
	}
	for _, o := range harness.Overlaps(ivs) {
		if o.B.Start >= at[0] {
			u := len(at) - 1
			for u > 0 && o.B.Start < at[u] {
				u--
			}
			overlapped[u] = true
		}
	}
	if extra := sum.Over(1); len(extra) > 0 {
		b.rep.Note("%s, rolling update: the sampler saw two allocations' workloads at once in %d samples: %s", v, len(extra), sum)
	}
	for u := range at {
		add(per, float64(n[u]))
		add(gap, without[u].Seconds())
		add(old, float64(olds[u]))
		o := 0.0
		if overlapped[u] {
			o = 1
		}
		add(over, o)
		b.progress("update %s run %d/%d: %d handover(s), %d to an old version, %s without a holder, overlap %t",
			v, u+1, len(at), n[u], olds[u], fmtS(int64(without[u])), overlapped[u])
	}
}

// waitDeployment waits until the job's latest deployment, of version, is
// successful.
func (b *bench) waitDeployment(t testing.TB, j *job, version uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, _, err := b.a.API().Jobs().LatestDeployment(j.id, nil)
		if err == nil && d != nil && d.JobVersion == version {
			switch d.Status {
			case api.DeploymentStatusSuccessful:
				return
			case api.DeploymentStatusFailed, api.DeploymentStatusCancelled:
				t.Fatalf("deployment of %s v%d: %s (%s)", j.id, version, d.Status, d.StatusDescription)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("deployment of %s v%d not successful after %s: %s (err %v)", j.id, version, timeout, fmtDeployment(d), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func fmtDeployment(d *api.Deployment) string {
	if d == nil {
		return "none"
	}
	return fmt.Sprintf("v%d %s (%s)", d.JobVersion, d.Status, d.StatusDescription)
}
