package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverRollingUpdateHandsOverOnce: a driver job with a holder and
// warm standbys goes through updates that each replace every allocation.
// Nomad replaces the lowest name index first, so the holder is often
// stopped while an old-version standby waits: that standby gives the new
// version the lock (docs/updates.md). Each update hands the lock over
// exactly once, to an allocation of the new version, and no two workloads
// ever overlap: with count = 2 and count = 3 and max_parallel = 1, and with
// count = 3 and a canary that is promoted automatically.
//
// Slow on purpose (a minute and a half): every update is a deployment that
// waits for each new allocation's min_healthy_time, one allocation at a
// time, five updates per job.
func TestDriverRollingUpdateHandsOverOnce(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"count_2", func(t *testing.T) {
			testDrvUpdatesHandOverOnce(t, a, "update-once", 2, `    max_parallel      = 1
    min_healthy_time  = "2s"
    healthy_deadline  = "2m"
    progress_deadline = "3m"`)
		}},
		{"count_3", func(t *testing.T) {
			testDrvUpdatesHandOverOnce(t, a, "update-three", 3, `    max_parallel      = 1
    min_healthy_time  = "2s"
    healthy_deadline  = "2m"
    progress_deadline = "3m"`)
		}},
		{"count_3_canary", func(t *testing.T) {
			testDrvUpdatesHandOverOnce(t, a, "update-canary", 3, `    max_parallel      = 1
    canary            = 1
    auto_promote      = true
    min_healthy_time  = "2s"
    healthy_deadline  = "2m"
    progress_deadline = "3m"`)
		}},
	})
}

func testDrvUpdatesHandOverOnce(t *testing.T, a *harness.Agent, name string, count int, update string) {
	const updates = 5
	j := newDrvJob(t, name, count)
	j.update = update
	j.args = []string{"v0"}
	j.run(t, a)
	j.waitStart(t, 60*time.Second, nil)
	drvWaitDeployment(t, a, j.id, 0, 2*time.Minute)

	s := j.sampler(t)
	var at []int64 // monotonic time of each update
	for v := 1; v <= updates; v++ {
		at = append(at, harness.MonoNow())
		j.args = []string{"v" + strconv.Itoa(v)}
		j.run(t, a)
		drvWaitDeployment(t, a, j.id, uint64(v), 3*time.Minute)
		want := j.args[0]
		j.waitStart(t, 60*time.Second, func(r harness.Record) bool { return slices.Contains(r.Argv, want) })
	}
	time.Sleep(2 * time.Second)
	sum := s.Stop()
	t.Logf("samples: %s", sum)

	recs := j.records(t)
	version := map[string]string{} // instance → v0, v1, …
	for _, r := range drvStarts(recs) {
		version[r.Instance] = r.Argv[len(r.Argv)-1]
	}
	ivs := harness.CheckNoOverlap(t, recs, sum)
	per := make([]int, updates)
	for _, h := range harness.Handovers(ivs) {
		if h.To.Start < at[0] {
			continue
		}
		u := len(at) - 1
		for u > 0 && h.To.Start < at[u] {
			u--
		}
		per[u]++
		from, to := version[h.From.Instance], version[h.To.Instance]
		t.Logf("update %d: handover %s → %s after %s", u+1, from, to, h.Gap)
		if want := "v" + strconv.Itoa(u+1); to != want {
			t.Errorf("update %d handed the lock to a %s workload (from %s), want %s", u+1, to, from, want)
		}
	}
	total := 0
	for u, n := range per {
		total += n
		if n != 1 {
			t.Errorf("update %d handed the lock over %d times, want exactly once", u+1, n)
		}
	}
	if t.Failed() {
		stubs, _ := a.Allocs(j.id)
		for _, al := range stubs {
			log := a.AllocLogs(t, al.ID, drvTask, "stderr")
			t.Logf("alloc %s %s v%d %s/%s; supervisor log:\n%s", drvShort(al.ID), al.Name, al.JobVersion, al.DesiredStatus, al.ClientStatus, log)
		}
	}
	harness.Measure(t, name+"_handovers_per_update", float64(total)/updates)
	t.Logf("handovers per update: %v (%s per update)", per, fmt.Sprintf("%.2f", float64(total)/updates))
}

// TestDriverBrokenNewVersionFallsBackToOldStandby: the new version's task
// fails at start (a lock block the driver refuses), so it never takes the
// lock. The old-version standby gives it the update_grace, then takes the
// lock itself: the time with no holder is the grace plus a normal
// takeover, and no two workloads ever overlap.
func TestDriverBrokenNewVersionFallsBackToOldStandby(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))

	const grace = 4 * time.Second
	// The holder starts alone, at index 0, which Nomad replaces first; the
	// standby joins at index 1.
	j := newDrvJob(t, "update-broken", 1)
	j.update = `    max_parallel      = 1
    min_healthy_time  = "2s"
    healthy_deadline  = "1m"
    progress_deadline = "2m"`
	j.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q\n          update_grace = %q", drvTTLHCL, drvDelayHCL, grace)
	j.args = []string{"v0"}
	j.run(t, a)
	j.waitStart(t, 60*time.Second, nil)
	drvWaitDeployment(t, a, j.id, 0, 2*time.Minute)
	j.count = 2
	j.run(t, a)
	drvWaitDeployment(t, a, j.id, 1, 2*time.Minute)
	// Both v0 allocations run: one holds, the other waits.
	a.WaitAllocs(t, j.id, 2, "running", 60*time.Second)

	s := j.sampler(t)
	updateAt := harness.MonoNow()
	j.args = []string{"v1"}
	j.lockBlock = `ttl = "5s"` // refused at start: TTL out of range
	j.run(t, a)
	// The v0 holder at index 0 is stopped first; the v0 standby takes over.
	var recs []harness.Record
	harness.WaitRecord(t, j.record, 2*time.Minute, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > updateAt
	})
	time.Sleep(2 * time.Second)
	sum := s.Stop()
	t.Logf("samples: %s", sum)
	recs = j.records(t)
	ivs := harness.CheckNoOverlap(t, recs, sum)
	var after []harness.Handover
	for _, h := range harness.Handovers(ivs) {
		if h.To.Start > updateAt {
			after = append(after, h)
		}
	}
	if len(after) != 1 {
		t.Fatalf("%d handovers after the update, want 1 (to the old standby): %+v", len(after), after)
	}
	h := after[0]
	for _, r := range drvStarts(recs) {
		if r.Instance == h.To.Instance && !slices.Contains(r.Argv, "v0") {
			t.Errorf("the lock went to %v, want the v0 standby", r.Argv)
		}
	}
	harness.Measure(t, "broken_new_version_time_without_holder", h.Gap)
	t.Logf("no holder for %s (grace %s)", h.Gap, grace)
	if h.Gap < grace-500*time.Millisecond {
		t.Errorf("the old standby took the lock after %s, before the grace of %s it gives a new version", h.Gap, grace)
	}
	if h.Gap > grace+30*time.Second {
		t.Errorf("the old standby took the lock only after %s (grace %s)", h.Gap, grace)
	}
}

// TestDriverHolderWaitsForItsSuccessor: with max_parallel = 2 Nomad stops
// the holder and the standby of a count = 2 group at once. The holder's
// own replacement starts only once the holder is gone, but the standby's
// starts while the holder stops: the holder keeps serving, the lock held,
// until that one waits for the lock (its task's kill_timeout less
// lock.kill_timeout at most), says so in its events, and the lock goes
// straight to it, not to the holder's own replacement. Each update hands
// over once, to the new version, never two at once. On one node (a dev
// agent), and on two clients with the allocations on distinct hosts, where
// a replacement placed on the other node waits for the allocation it
// replaces through the servers (client/allocwatcher, remotePrevAlloc).
func TestDriverHolderWaitsForItsSuccessor(t *testing.T) {
	t.Parallel()
	harness.SkipOutsideSmoke(t) // its agents start in its subtests
	harness.BuildTestWorkload(t)
	runConcurrently(t, []subtest{
		{"one_node", func(t *testing.T) {
			testDrvHolderWaits(t, harness.StartAgent(t, drvAgentOptions(t, true)), "")
		}},
		{"two_nodes", func(t *testing.T) {
			opts := drvAgentOptions(t, false)
			opts.Clients = 2
			testDrvHolderWaits(t, harness.StartAgent(t, opts), `constraint {
      operator = "distinct_hosts"
      value    = "true"
    }`)
		}},
	})
}

func testDrvHolderWaits(t *testing.T, a *harness.Agent, groupExtra string) {
	const updates = 3
	j := newDrvJob(t, "update-holder-waits", 2)
	j.groupExtra = groupExtra
	j.killTimeout = "20s"
	j.update = `    max_parallel      = 2
    min_healthy_time  = "2s"
    healthy_deadline  = "2m"
    progress_deadline = "3m"`
	j.args = []string{"v0"}
	j.run(t, a)
	holder := j.waitStart(t, 60*time.Second, nil)
	drvWaitDeployment(t, a, j.id, 0, 2*time.Minute)

	s := j.sampler(t)
	for v := 1; v <= updates; v++ {
		updateAt := harness.MonoNow()
		want := "v" + strconv.Itoa(v)
		j.args = []string{want}
		j.run(t, a)
		next := j.waitStart(t, 90*time.Second, func(r harness.Record) bool { return r.Mono > updateAt })
		if !slices.Contains(next.Argv, want) {
			t.Errorf("update %d: the lock went to %v, want %s", v, next.Argv, want)
		}
		old, _, err := a.API().Allocations().Info(holder.AllocID, nil)
		if err != nil {
			t.Fatalf("read the old holder %s: %v", drvShort(holder.AllocID), err)
		}
		if nx, _, err := a.API().Allocations().Info(next.AllocID, nil); err == nil {
			t.Logf("update %d: holder %s on node %s → %s on node %s", v, drvShort(holder.AllocID), drvShort(old.NodeID), drvShort(next.AllocID), drvShort(nx.NodeID))
		}
		if next.AllocID == old.NextAllocation {
			t.Errorf("update %d: the lock went to the old holder's own replacement %s, which starts only once the holder is gone: the holder did not wait for the other new allocation",
				v, drvShort(next.AllocID))
		}
		// The old holder's events say it kept serving, and whom for.
		var texts []string
		deadline := time.Now().Add(30 * time.Second)
		for {
			texts = texts[:0]
			if al, _, err := a.API().Allocations().Info(holder.AllocID, nil); err == nil && al.TaskStates[drvTask] != nil {
				for _, ev := range al.TaskStates[drvTask].Events {
					texts = append(texts, drvEventText(ev))
				}
			}
			joined := strings.Join(texts, "\n")
			if strings.Contains(joined, "Stopped for a rolling update: keeping the workload running for up to 16s") &&
				strings.Contains(joined, "Rolling update: allocation "+drvShort(next.AllocID)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("update %d: the old holder's events do not say it waited for %s:\n%s", v, drvShort(next.AllocID), joined)
			}
			time.Sleep(500 * time.Millisecond)
		}
		drvWaitDeployment(t, a, j.id, uint64(v), 3*time.Minute)
		holder = next
	}
	time.Sleep(2 * time.Second)
	sum := s.Stop()
	recs := j.records(t)
	ivs := harness.CheckNoOverlap(t, recs, sum)
	for _, h := range harness.Handovers(ivs) {
		t.Logf("handover %s → %s after %s", drvShort(h.From.AllocID), drvShort(h.To.AllocID), h.Gap)
		harness.Measure(t, "holder_waits_handover_gap", h.Gap)
	}
	if n := len(harness.Handovers(ivs)); n != updates {
		t.Errorf("%d handovers over %d updates, want one each", n, updates)
	}
}
