package e2e

// "Never two at once" for workloads that misbehave as real ones do: a start
// script that daemonizes (setsid) and exits, whose daemon ignores SIGTERM; and
// a graceful shutdown that takes longer than two TTLs.

import (
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

func TestDriverProofOfDeath(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"daemonizing_workload_never_twice", func(t *testing.T) { testDaemonNeverTwice(t, a) }},
		{"slow_graceful_stop_gets_its_kill_timeout", func(t *testing.T) { testSlowGracefulStop(t, a) }},
		{"lock_daemonizing_workload_never_twice", func(t *testing.T) { testLockDaemonNeverTwice(t, a) }},
		{"dotted_job_id_holds_its_default_lock", func(t *testing.T) { testDottedJobID(t, a) }},
	})
}

// testDottedJobID: Nomad allows "api.v2" as a job ID, its variable paths do
// not allow the dot; the default lock path escapes it, and the task holds it.
func testDottedJobID(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "api.v2", 1)
	j.run(t, a)
	start := j.waitStart(t, 60*time.Second, nil)
	drvCheckLockHeld(t, a, "nomad/jobs/drv-api~2ev2/g/t/lock", start.AllocID, drvFence(t, start))
}

// daemonArgs make the testworkload a start script that daemonizes: one
// grandchild in its own session that ignores SIGTERM, and a main process
// that exits 0 after 2 s.
var daemonArgs = []string{"-children", "1", "-daemon", "-ignore-term", "-exit", "0", "-after", "2s"}

// daemonRestart restarts the task quickly after each exit, many times.
const daemonRestart = "restart {\n      attempts = 20\n      interval = \"10m\"\n      delay = \"1s\"\n      mode = \"delay\"\n    }"

// testLockDaemonNeverTwice: the same daemonizing workload under `lock` with
// raw_exec, count = 2. lock is a child subreaper, so the daemon stays its
// descendant and is proven dead before the release. Nomad does not kill a
// raw_exec task's cgroup between restarts, so nothing else would.
func testLockDaemonNeverTwice(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "daemon")
	g := s.lockGroup(t, 2, nil, daemonArgs)
	g.extra = daemonRestart
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: func(p harness.Proc) bool { return !isLockExe(p) }})
	a.RunJobHCL(t, jobHCL(s.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.job) })
	const runs = 5
	deadline := time.Now().Add(3 * time.Minute)
	for countStarts(readRecords(t, s.record), harness.RoleMain) < runs {
		if time.Now().After(deadline) {
			t.Fatalf("only %d workload starts within 3m", countStarts(readRecords(t, s.record), harness.RoleMain))
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopJobWait(t, a, s.job, 90*time.Second)
	checkNoTwoAllocs(t, s.marker, s.record, smp, runs-1)
}

func countStarts(recs []harness.Record, role string) int {
	n := 0
	for _, r := range recs {
		if r.Event == harness.EventStart && r.Role == role {
			n++
		}
	}
	return n
}

// checkNoTwoAllocs waits until the job's processes are gone, then fails the
// test if processes (main and daemons alike) of two allocations ever ran at
// once: by their records, with a SIGKILLed daemon's end from the sampler's
// pidfd, and by the sampler's scans. At least minDaemons daemons must have
// started, or the check proves nothing.
func checkNoTwoAllocs(t *testing.T, marker, record string, smp *harness.Sampler, minDaemons int, known ...harness.KnownEnd) {
	t.Helper()
	gone := time.Now().Add(60 * time.Second)
	for procs, _ := harness.FindProcs(marker); len(procs) > 0; procs, _ = harness.FindProcs(marker) {
		if time.Now().After(gone) {
			t.Fatalf("processes of the job still alive 60s after its purge: %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	recs := readRecords(t, record)
	if n := countStarts(recs, "child"); n < minDaemons {
		t.Fatalf("only %d daemons started: the test proves nothing", n)
	}
	checkAllocsApart(t, recs, sum, known...)
	t.Logf("%d workload runs, %d daemons, no two allocations at once; sampler: %s",
		countStarts(recs, harness.RoleMain), countStarts(recs, "child"), sum)
}

// testDaemonNeverTwice: count = 2. Each run's main process starts a daemon
// in its own session (which ignores SIGTERM), then exits 0 after 2 s, and
// Nomad restarts the task. The supervisor must kill the daemon, proven
// through the task cgroup, before it releases, so the other allocation's
// copy never runs beside it: across exits and restarts, and an alloc stop.
func testDaemonNeverTwice(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "daemon", 2)
	j.args = daemonArgs
	j.groupExtra = daemonRestart
	// Every process of the job, daemons included (they carry the marker).
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker})
	j.run(t, a)

	// Several handovers through workload exits and restarts.
	const handovers = 4
	deadline := time.Now().Add(3 * time.Minute)
	for len(drvStarts(j.records(t))) < handovers+1 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d workload starts within 3m", len(drvStarts(j.records(t))))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Then an alloc stop of the current holder, while its daemon runs.
	starts := drvStarts(j.records(t))
	last := starts[len(starts)-1]
	harness.WaitRecord(t, j.record, 30*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == "child" && r.AllocID == last.AllocID && r.Fence == last.Fence
	})
	if err := a.StopAlloc(last.AllocID); err != nil {
		t.Fatal(err)
	}
	j.waitStart(t, 60*time.Second, func(r harness.Record) bool { return r.AllocID != last.AllocID && r.Mono > last.Mono })
	stopJobWait(t, a, j.id, 90*time.Second)
	checkNoTwoAllocs(t, j.marker, j.record, smp, handovers)
}

// testSlowGracefulStop: TTL 10 s, kill_timeout 30 s, kill_signal SIGINT,
// and a workload that needs 25 s to flush on SIGINT. A stop while the lock
// is healthy must give it all of that: it exits 0 with its stop record, and
// nothing says the lock was lost.
func testSlowGracefulStop(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "slowstop", 1)
	j.args = []string{"-stop-after", "25s"}
	j.groupExtra = ""
	j.configExtra = ""
	j.killTimeout, j.killSignal = "30s", "SIGINT"
	j.run(t, a)
	start := j.waitStart(t, 60*time.Second, func(harness.Record) bool { return true })
	stopped := time.Now()
	if err := a.StopAlloc(start.AllocID); err != nil {
		t.Fatal(err)
	}
	end := j.waitEnd(t, start.Instance, 90*time.Second)
	if end.Event != "stop" {
		t.Fatalf("the workload ended with %q, want its own clean stop after the 25 s flush: %+v", end.Event, end)
	}
	if took := time.Since(stopped); took < 20*time.Second {
		t.Fatalf("stop finished after %s, before the workload's 25 s flush", took)
	}
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusComplete, 60*time.Second)
	evs := drvEvents(t, a, start.AllocID)
	for _, bad := range []string{"Lock lost", "watchdog", "Exit Code: 137"} {
		if m := drvMatching(evs, bad); len(m) > 0 {
			t.Errorf("a graceful stop within kill_timeout shows %q: %s", bad, drvFormatEvents(m))
		}
	}
	// The replacement's workload also takes 25 s to stop: wait for it,
	// so that nothing of the job outlives the test's agent.
	stopJobWait(t, a, j.id, 90*time.Second)
}

// checkAllocsApart fails the test if processes (main and daemons alike) of
// two allocations ran at once, by their records (an end from the sampler's
// pidfd, from known, or, for a process in a PID namespace of its own, from
// the sampler's view of its allocation) and by the sampler's scans, or if a
// run's end is unknown. Call it once every process of the job is gone and
// the sampler stopped. It returns the runs and how many overlapping pairs
// (at least 1 if only the sampler saw two allocations at once) it found.
func checkAllocsApart(t *testing.T, recs []harness.Record, sum harness.SampleSummary, known ...harness.KnownEnd) ([]harness.Interval, int) {
	t.Helper()
	asMain := make([]harness.Record, len(recs))
	for i, r := range recs {
		r.Role = harness.RoleMain
		asMain[i] = r
	}
	byPID, byAlloc := sum.GoneByPIDOr(known...), sum.GoneByAlloc()
	ivs := harness.Intervals(asMain, func(iv harness.Interval) (int64, bool) {
		if end, ok := byPID(iv); ok {
			return end, true
		}
		// In a PID namespace of its own (exec, docker) a process records
		// its PID there: the allocation's last process seen gone ends it.
		return byAlloc(iv)
	})
	for _, iv := range ivs {
		if !iv.Ended {
			t.Errorf("no end known for %+v", iv)
		}
	}
	return ivs, countAllocOverlaps(t, ivs, sum)
}

// sampleResolution bounds how late the sampler dates the end of a process
// it saw only by scanning: a 20 ms interval plus a scan on a busy machine.
const sampleResolution = 50 * time.Millisecond

// countAllocOverlaps fails the test for every pair of runs of two
// allocations that overlapped, and for every sample in which the sampler
// proved two allocations alive at once; it returns how many overlapping
// pairs it found (at least 1 if only the sampler saw them).
//
// A SIGKILLed process writes no end record: its end is what the sampler
// saw, by pidfd or, failing that (a process in a PID namespace of its own),
// by the first scan without it, late by up to sampleResolution. A records
// overlap within that against such an end proves nothing either way and is
// logged; the sampler's check, dated by pidfds, fails on any moment two ran
// at once.
func countAllocOverlaps(t *testing.T, ivs []harness.Interval, sum harness.SampleSummary) int {
	t.Helper()
	n := 0
	for _, o := range harness.Overlaps(ivs) {
		if o.A.AllocID == o.B.AllocID {
			continue
		}
		if unsure := endUncertainty(o.A, sum); o.For <= unsure {
			t.Logf("within the uncertainty of the observed end (%s), not counted: %s between %+v and %+v", unsure, o.For, o.A, o.B)
			continue
		}
		t.Errorf("processes of two allocations overlapped for %s: %+v and %+v", o.For, o.A, o.B)
		n++
	}
	if over := sum.Over(1); len(over) > 0 {
		t.Errorf("the sampler saw two allocations' processes at once in %d samples: %s", len(over), sum)
		n = max(n, 1)
	}
	return n
}

// endUncertainty is how late iv's end may be dated. A record's end is
// exact. A pidfd-dated end (the sampler's exit watch) may be late by
// scheduling, within sampleResolution. An end dated by a scan (a process in
// a PID namespace of its own, as under docker) lies between the last scan
// that saw its allocation's process alive and the first that did not: on a
// busy machine that gap can outgrow sampleResolution, and an overlap inside
// it proves nothing either way (the sampler's own check, which needs two
// allocations seen alive at once, still applies).
func endUncertainty(iv harness.Interval, sum harness.SampleSummary) time.Duration {
	if iv.EndedBy != "observed" {
		return 0
	}
	unsure := sampleResolution
	if _, pidfd := sum.Exits[iv.PID]; !pidfd {
		if seen, ok := sum.LastSeen(iv.AllocID, iv.End); ok {
			unsure = max(unsure, time.Duration(iv.End-seen))
		}
	}
	return unsure
}

// stopJobWait stops the job and waits until its client has reported every
// allocation complete, failed or lost, then purges it. A purge alone leaves
// a standby that took the lock a moment before its own stop arrived to run
// its workload briefly, after a check that found nothing running.
func stopJobWait(t *testing.T, a *harness.Agent, jobID string, timeout time.Duration) {
	t.Helper()
	if _, _, err := a.API().Jobs().Deregister(jobID, false, nil); err != nil {
		t.Fatalf("stop job %s: %v", jobID, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		allocs, err := a.Allocs(jobID)
		done := err == nil
		for _, al := range allocs {
			switch al.ClientStatus {
			case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
			default:
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: allocations not all ended %s after its stop: %s", jobID, timeout, a.Nomad(t, "job", "status", jobID))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := a.Purge(jobID); err != nil {
		t.Fatal(err)
	}
}
