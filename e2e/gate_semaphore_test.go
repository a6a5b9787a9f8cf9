package e2e

// A gate whose lock is a semaphore (lock { holders = N }): of count = N + 2
// allocations, at most N run their gated app at once, each gate holding one
// slot, and each app learns its slot from the gate's nomad-lock.env in the
// allocation's shared dir. A freed slot is taken again after a graceful
// stop of its holder and after a SIGKILL of its gate's supervisor (the
// plugin kills the gated app, proves it dead and releases the slot).

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

func TestGateSemaphore(t *testing.T) {
	t.Parallel()
	workload := harness.BuildTestWorkload(t)
	records := t.TempDir()
	if err := os.Chmod(records, 0o777); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, true)
	opts.HostVolumes = map[string]string{"worker-bin": filepath.Dir(workload), "worker-data": records}
	opts.Docker = harness.StartDocker(t)
	opts.RequireDrivers = append(opts.RequireDrivers, "docker")
	a := harness.StartAgent(t, opts)
	var subtests []subtest
	for _, kind := range []string{"raw_exec", "docker"} {
		subtests = append(subtests, subtest{kind + "_two_of_four", func(t *testing.T) {
			testGateSemaphore(t, a, opts.Docker, kind, records)
		}})
	}
	subtests = append(subtests, subtest{"raw_exec_load_balancer_two_of_three", func(t *testing.T) {
		testGateSemaphoreLB(t, a, records)
	}})
	runConcurrently(t, subtests)
}

// testGateSemaphoreLB: count = 3, a gate holding one of 2 slots with a
// load_balancer block, the reference LB over real HTTP. Each slot's holder
// is listed; a slot's next holder's ADD swaps out that slot's previous
// upstream, after a graceful stop and after a SIGKILL of the gate's
// supervisor; the LB lists exactly the current holders, and never more
// than 2.
func testGateSemaphoreLB(t *testing.T, a *harness.Agent, records string) {
	const n = 2
	lb := lbStartServer(t)
	j := newGateJobID(t, "gsem-lb", "raw_exec", records)
	service := fmt.Sprintf("svc-gsem-%d", time.Now().UnixNano()%1e6)
	j.lb = gateLB(lb, service, lbGroup)
	j.count, j.holders, j.noService = n+1, n, true
	j.extraArgs = []string{"-lock-env", "${NOMAD_ALLOC_DIR}/nomad-lock.env"}
	prefix := j.lockPath()
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	live := lbWatchLive(t, lb, service)
	j.run(t, a)
	t.Cleanup(func() { _ = a.Purge(j.id) })

	holders := map[int]harness.Record{}
	harness.WaitRecord(t, j.record, 120*time.Second, func(r harness.Record) bool {
		if isMainStart(r) {
			holders[slotOf(t, prefix, r)] = r
		}
		return len(holders) == n
	})
	listed := func(what string) {
		t.Helper()
		var want []string
		for _, r := range holders {
			want = append(want, lbUpstreamOf(t, a, r.AllocID))
		}
		slices.Sort(want)
		lbWaitUpstreamsSet(t, lb, service, 60*time.Second, what, want)
	}
	listed("both slots' holders")

	// A graceful stop of slot 0's holder, then a SIGKILL of slot 1's gate
	// supervisor: each slot's next holder's ADD swaps out its previous one.
	for slot, how := range []string{"graceful stop", "gate supervisor killed"} {
		old := holders[slot]
		oldUp := lbUpstreamOf(t, a, old.AllocID)
		t0 := harness.MonoNow()
		if slot == 0 {
			if err := a.StopAlloc(old.AllocID); err != nil {
				t.Fatal(err)
			}
		} else {
			j.standby(t, a, holders[0].AllocID)
			if err := syscall.Kill(drvSupervisor(t, old.AllocID).PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		next := waitMainStart(t, j.record, 90*time.Second, func(r harness.Record) bool {
			return r.AllocID != old.AllocID && r.LockPath == old.LockPath && r.Mono > t0
		})
		holders[slot] = next
		add := gateLBRequest(t, lb, service, next.AllocID+"-ADD-", 60*time.Second)
		if nextUp := lbUpstreamOf(t, a, next.AllocID); nextUp != oldUp && !slices.Contains(add.RemoveUpstreams, oldUp) {
			t.Errorf("%s: the ADD of %s on slot %d (%s) removes %q, want slot %d's previous holder's %s swapped out",
				how, drvShort(next.AllocID), slot, add.ID, add.RemoveUpstreams, slot, oldUp)
		}
		listed(how)
		harness.Measure(t, fmt.Sprintf("gate_semaphore_lb_listed_after_%s", strings.ReplaceAll(how, " ", "_")),
			time.Duration(harness.MonoNow()-t0))
	}

	live.halt()
	most := 0
	live.mu.Lock()
	for _, c := range live.changes {
		most = max(most, len(c.ups))
	}
	changes := fmt.Sprint(live.changes)
	live.mu.Unlock()
	if most > n {
		t.Errorf("the LB listed %d upstreams at once, want at most %d: %s", most, n, changes)
	}
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	lbWaitUpstreams(t, lb, service, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for procs, _ := harness.FindProcs(j.marker); len(procs) > 0; procs, _ = harness.FindProcs(j.marker) {
		if time.Now().After(deadline) {
			t.Fatalf("apps still alive 60s after the purge: %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if over := smp.Stop().Over(n); len(over) > 0 {
		t.Errorf("the sampler saw more than %d allocations' apps at once in %d samples", n, len(over))
	}
}

// lbWaitUpstreamsSet waits until the LB's service lists exactly want
// (sorted), in any order.
func lbWaitUpstreamsSet(t *testing.T, lb *harness.LB, service string, timeout time.Duration, what string, want []string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := slices.Clone(lb.Upstreams(service))
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: LB service %s lists %q after %s, want exactly %q; requests:\n%s",
				what, service, got, timeout, want, lbFormatRequests(lb.Requests(service)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testGateSemaphore: count = 4 allocations of a gated app of kind, whose
// gate holds a semaphore of 2 slots. The docker app stops on SIGTERM, so
// every app but the one the plugin kills records its own end.
func testGateSemaphore(t *testing.T, a *harness.Agent, d *harness.Docker, kind, records string) {
	const n = 2
	j := newGateJobID(t, "gsem-"+kind[:3], kind, records)
	j.image, j.termOK = d.Image, true
	j.count, j.holders, j.noService = n+2, n, true
	j.extraArgs = []string{"-lock-env", "${NOMAD_ALLOC_DIR}/nomad-lock.env"}
	prefix := j.lockPath()
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	j.run(t, a)
	t.Cleanup(func() { _ = a.Purge(j.id) })

	holders := map[int]harness.Record{} // by slot
	harness.WaitRecord(t, j.record, 120*time.Second, func(r harness.Record) bool {
		if isMainStart(r) {
			holders[slotOf(t, prefix, r)] = r
		}
		return len(holders) == n
	})
	for s, r := range holders {
		if r.Fence == "" {
			t.Errorf("the app on slot %d read no NOMAD_LOCK_FENCE from the gate's nomad-lock.env: %+v", s, r)
		}
		gateWaitEvent(t, a, j.id, 30*time.Second, fmt.Sprintf("on slot %d of %d (%s)", s, n, r.LockPath))
	}
	// The two other allocations' gates wait; their apps never start.
	for range n {
		j.standby(t, a, holders[0].AllocID)
	}
	if live := mainWorkloads(t, j.marker); len(live) != n {
		t.Fatalf("%d apps run, want %d: %v", len(live), n, live)
	}

	// `nomad alloc restart` of slot 1's holder restarts its gate and app:
	// the restarted gate takes its slot over (same fence), and the app
	// starts again on the same slot.
	restarted := holders[1]
	fence := drvLock(t, a, restarted.LockPath).ModifyIndex
	t0 := harness.MonoNow()
	a.Nomad(t, "alloc", "restart", restarted.AllocID)
	again := waitMainStart(t, j.record, 60*time.Second, func(r harness.Record) bool { return r.Mono > t0 })
	if again.AllocID != restarted.AllocID || again.LockPath != restarted.LockPath {
		t.Fatalf("after nomad alloc restart of %s (slot 1) an app started in %s on %s", drvShort(restarted.AllocID),
			drvShort(again.AllocID), again.LockPath)
	}
	gateWaitEvent(t, a, j.id, 30*time.Second, fmt.Sprintf("Took over lock (fence %d) on slot 1 of %d", fence, n))
	if v := drvLock(t, a, restarted.LockPath); v.Items["holder_alloc_id"] != restarted.AllocID || v.ModifyIndex != fence {
		t.Fatalf("after the restart slot 1 is held by %q at index %d, want %s at %d", v.Items["holder_alloc_id"], v.ModifyIndex,
			drvShort(restarted.AllocID), fence)
	}
	holders[1] = again

	// A graceful stop of slot 0's holder: Nomad stops its app, then its
	// gate, which releases slot 0 clean; a standby's app starts on slot 0.
	old := holders[0]
	t0 = harness.MonoNow()
	if err := a.StopAlloc(old.AllocID); err != nil {
		t.Fatal(err)
	}
	next := waitMainStart(t, j.record, 60*time.Second, func(r harness.Record) bool {
		return r.AllocID != old.AllocID && r.LockPath == old.LockPath && r.Mono > t0
	})
	stop := harness.WaitRecord(t, j.record, 10*time.Second, func(r harness.Record) bool {
		return r.Instance == old.Instance && r.Event == harness.EventStop
	})
	harness.Measure(t, fmt.Sprintf("gate_%s_semaphore_slot_handover", kind), time.Duration(next.Mono-stop.Mono))
	if next.Mono < stop.Mono {
		t.Errorf("the next app on slot 0 started %s before the stopped one ended", time.Duration(stop.Mono-next.Mono))
	}

	// A SIGKILL of slot 1's gate supervisor: the plugin kills the gated
	// app, proves it dead and releases slot 1; a standby's app takes it.
	crashed := holders[1]
	app := j.appProc(t, crashed.AllocID)
	j.standby(t, a, next.AllocID)
	sup := drvSupervisor(t, crashed.AllocID)
	t0 = harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, app.PID, 60*time.Second)
	taken := waitMainStart(t, j.record, 2*drvTTL+drvDelay+60*time.Second, func(r harness.Record) bool {
		return r.AllocID != crashed.AllocID && r.LockPath == crashed.LockPath && r.Mono > t0
	})
	harness.Measure(t, fmt.Sprintf("gate_%s_semaphore_slot_crash_takeover", kind), time.Duration(taken.Mono-t0))
	if taken.Mono < gone {
		t.Errorf("the next app on slot 1 started %s before the crashed gate's app was gone", time.Duration(gone-taken.Mono))
	}
	gateWaitEvent(t, a, j.id, 30*time.Second, "Released lock on behalf of crashed supervisor")

	if live := mainWorkloads(t, j.marker); len(live) > n {
		t.Errorf("%d apps run after the handovers, want at most %d: %v", len(live), n, live)
	}
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for procs, _ := harness.FindProcs(j.marker); len(procs) > 0; procs, _ = harness.FindProcs(j.marker) {
		if time.Now().After(deadline) {
			t.Fatalf("apps still alive 60s after the purge: %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	checkSlots(t, prefix, n, readRecords(t, j.record), sum, harness.KnownEnd{PID: crashed.PID, Mono: gone})
	t.Logf("sampler: %s", sum)
}
