package e2e

// End-to-end tests of `lock -n N`, a semaphore of N slots, under raw_exec on
// a real agent. What a user must see: never more than N workloads at once,
// never two on one slot (on the workloads' own records: NOMAD_LOCK_PATH is
// their slot's lock), a freed slot taken by a standby, and a replacement
// allocation taking its own slot back when it is free.

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

func TestLockSemaphore(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true})
	runConcurrently(t, []subtest{
		{"two_of_four", func(t *testing.T) { testSemaphoreNOfNPlusTwo(t, a, 2) }},
		{"three_of_five", func(t *testing.T) { testSemaphoreNOfNPlusTwo(t, a, 3) }},
		{"replacement_retakes_its_slot", func(t *testing.T) { testSemaphoreReplacementRetakesItsSlot(t, a) }},
		{"first_contenders_asking_different_n", func(t *testing.T) { testSemaphoreFirstContenders(t, a) }},
	})
}

// testSemaphoreFirstContenders: `lock -n 2` and `lock -n 3` started at
// once on a prefix nobody wrote, a few times: each time exactly one runs
// its workload and the other exits 64 naming both values, having taken
// nothing; the semaphore's record names the N of the one that got in.
func testSemaphoreFirstContenders(t *testing.T, a *harness.Agent) {
	for round := range 4 {
		s := newScenario(t, fmt.Sprintf("sem-first-%d", round))
		ns := []int{2, 3}
		if round%2 == 1 {
			ns = []int{3, 2}
		}
		var procs []*harness.Process
		for _, n := range ns {
			procs = append(procs, startPlainLock(t, a, lockArgs(s.path, "-n", strconv.Itoa(n)), s.workloadArgv(t)...))
		}
		// One of them is refused at once; the other runs on.
		var refused, in int
		select {
		case <-procs[0].Done():
			refused, in = 0, 1
		case <-procs[1].Done():
			refused, in = 1, 0
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: both `lock -n 2` and `lock -n 3` still run after 60s on a new prefix:\n%s\n%s",
				round, procs[0].Stderr(), procs[1].Stderr())
		}
		code, errOut := procs[refused].Wait(time.Second), procs[refused].Stderr()
		want := []string{fmt.Sprintf("has %d holders", ns[in]), fmt.Sprintf("asks for %d", ns[refused])}
		if code != 64 || !strings.Contains(errOut, want[0]) || !strings.Contains(errOut, want[1]) {
			t.Errorf("round %d: lock -n %d exited %d, stderr %q; want 64 naming both values (%q, %q)", round, ns[refused], code, errOut, want[0], want[1])
		}
		started := waitMainStart(t, s.record, 30*time.Second, nil)
		time.Sleep(500 * time.Millisecond) // a refused contender's workload would have started by now
		if starts := countStarts(readRecords(t, s.record), harness.RoleMain); starts != 1 {
			t.Errorf("round %d: %d workloads started, want only the one of lock -n %d", round, starts, ns[in])
		}
		if procs[in].Exited() {
			t.Errorf("round %d: lock -n %d exited too: %s", round, ns[in], procs[in].Stderr())
		}
		if v := readLock(t, a, lockclient.SemaphorePath(s.path)); v == nil || v.Items["semaphore_holders"] != strconv.Itoa(ns[in]) {
			t.Errorf("round %d: the semaphore's record is %+v, want %d holders", round, v, ns[in])
		}
		t.Logf("round %d: lock -n %d got in (slot %s), lock -n %d was refused", round, ns[in], started.LockPath, ns[refused])
		_ = procs[in].Signal(syscall.SIGTERM)
		procs[in].Wait(30 * time.Second)
	}
}

// slotOf is the slot a workload's record names, from its NOMAD_LOCK_PATH.
func slotOf(t *testing.T, prefix string, r harness.Record) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimPrefix(r.LockPath, prefix+"/slot-"))
	if err != nil || lockclient.SlotPath(prefix, n) != r.LockPath {
		t.Fatalf("record of pid %d: NOMAD_LOCK_PATH %q is no slot of %s", r.PID, r.LockPath, prefix)
	}
	return n
}

// checkSlots checks the workloads' records: every one held a slot below n,
// never more than n ran at once, no two overlapped on one slot, and the
// fences of a slot never went back (harness.CheckSemaphore).
func checkSlots(t *testing.T, prefix string, n int, recs []harness.Record, sum harness.SampleSummary, known ...harness.KnownEnd) {
	t.Helper()
	for _, r := range recs {
		if isMainStart(r) {
			if s := slotOf(t, prefix, r); s < 0 || s >= n {
				t.Errorf("a workload held slot %d of a semaphore of %d: %+v", s, n, r)
			}
		}
	}
	harness.CheckSemaphore(t, recs, sum, n, known...)
}

// testSemaphoreNOfNPlusTwo: n+2 allocations contend for n slots. n
// workloads run, one per slot; a graceful stop of a holder hands its slot
// to a standby at once, a SIGKILL of a holder's `lock` after the server's
// expiry; never more than n at once, never two on a slot.
func testSemaphoreNOfNPlusTwo(t *testing.T, a *harness.Agent, n int) {
	s := newScenario(t, fmt.Sprintf("sem-%d-of-%d", n, n+2))
	g := s.lockGroup(t, n+2, []string{"-n", strconv.Itoa(n)}, nil)
	g.failFast = true // the crashed allocation must not come back and compete
	a.RunJobHCL(t, jobHCL(s.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	a.WaitAllocs(t, s.job, n+2, api.AllocClientStatusRunning, 60*time.Second)
	holders := map[int]harness.Record{} // by slot
	harness.WaitRecord(t, s.record, 60*time.Second, func(r harness.Record) bool {
		if isMainStart(r) {
			holders[slotOf(t, s.path, r)] = r
		}
		return len(holders) == n
	})
	sampler := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	holding := map[string]bool{}
	for _, r := range holders {
		sampler.WaitSeen(t, 30*time.Second, r.PID)
		holding[r.AllocID] = true
	}
	allocs := a.WaitAllocs(t, s.job, n+2, api.AllocClientStatusRunning, 10*time.Second)
	for _, al := range allocs {
		if !holding[al.ID] {
			a.WaitAllocLog(t, al.ID, taskName, "stderr", 30*time.Second, "semaphore slots are held, waiting")
		}
	}

	// A graceful stop of slot 0's holder: a standby takes slot 0.
	old := holders[0]
	if err := a.StopAlloc(old.AllocID); err != nil {
		t.Fatalf("stop alloc %s: %v", old.AllocID, err)
	}
	next := waitMainStart(t, s.record, 30*time.Second, func(r harness.Record) bool {
		return r.Instance != old.Instance && r.LockPath == old.LockPath
	})
	stop := harness.WaitRecord(t, s.record, 10*time.Second, func(r harness.Record) bool {
		return r.Instance == old.Instance && r.Event == harness.EventStop
	})
	handover := time.Duration(next.Mono - stop.Mono)
	harness.Measure(t, fmt.Sprintf("semaphore_n%d_slot_handover", n), handover)
	if handover < 0 || handover > 3*time.Second {
		t.Errorf("slot 0 handed over %s after its workload stopped, want 0 ≤ gap < 3s", handover)
	}

	// A SIGKILL of slot 1's holder's lock: its workload dies with it, and a
	// standby takes slot 1 once the server expires it (2×TTL + delay).
	crashed := holders[1]
	lock, _ := lockOf(t, s.marker, crashed.PID)
	killAt := harness.MonoNow()
	if err := syscall.Kill(lock.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL lock %d: %v", lock.PID, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(crashed.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("the workload %d still runs 5s after SIGKILL to its lock", crashed.PID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	goneAt := harness.MonoNow()
	taken := waitMainStart(t, s.record, 45*time.Second, func(r harness.Record) bool {
		return r.Instance != crashed.Instance && r.LockPath == crashed.LockPath
	})
	takeover := time.Duration(taken.Mono - killAt)
	harness.Measure(t, fmt.Sprintf("semaphore_n%d_slot_crash_takeover", n), takeover)
	if takeover > 30*time.Second {
		t.Errorf("slot 1 taken %s after the crash, want < 30s (2×TTL + delay + slack)", takeover)
	}
	if taken.AllocID == crashed.AllocID {
		t.Errorf("the crashed allocation %s took slot 1 again", crashed.AllocID)
	}
	time.Sleep(300 * time.Millisecond)
	sum := sampler.Stop()
	checkSlots(t, s.path, n, readRecords(t, s.record), sum, harness.KnownEnd{PID: crashed.PID, Mono: goneAt})
	if live := mainWorkloads(t, s.marker); len(live) != n {
		t.Errorf("%d workloads run after the handovers, want %d: %v", len(live), n, live)
	}
	t.Logf("sampler: %s", sum)
}

// testSemaphoreReplacementRetakesItsSlot: two allocations of a semaphore
// of 3 take the slots of their allocation indexes; a replacement of index 1
// takes slot 1 again, though slot 2 is free too. `lock status` shows every
// slot.
func testSemaphoreReplacementRetakesItsSlot(t *testing.T, a *harness.Agent) {
	const n = 3
	s := newScenario(t, "sem-replacement")
	a.RunJobHCL(t, jobHCL(s.job, "service", s.lockGroup(t, 2, []string{"-n", strconv.Itoa(n)}, nil)))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	a.WaitAllocs(t, s.job, 2, api.AllocClientStatusRunning, 60*time.Second)
	byIndex := map[int]harness.Record{}
	harness.WaitRecord(t, s.record, 60*time.Second, func(r harness.Record) bool {
		if isMainStart(r) {
			byIndex[allocIndex(t, a, r.AllocID)] = r
		}
		return len(byIndex) == 2
	})
	for i, r := range byIndex {
		if got := slotOf(t, s.path, r); got != i {
			t.Errorf("allocation index %d holds slot %d, want its own", i, got)
		}
	}
	old := byIndex[1]
	if err := a.StopAlloc(old.AllocID); err != nil {
		t.Fatalf("stop alloc %s: %v", old.AllocID, err)
	}
	next := waitMainStart(t, s.record, 60*time.Second, func(r harness.Record) bool { return r.AllocID != old.AllocID && r.AllocID != byIndex[0].AllocID })
	if i := allocIndex(t, a, next.AllocID); i != 1 {
		t.Fatalf("the replacement has allocation index %d, want 1", i)
	}
	if got := slotOf(t, s.path, next); got != 1 {
		t.Errorf("the replacement of index 1 took slot %d, want its own slot 1", got)
	}

	// A contender asking another N is refused, naming both.
	code, _, errOut := runLock(t, a, append(lockArgs(s.path, "-n", "2"), "/bin/true")...)
	if code != 64 || !strings.Contains(errOut, "has 3 holders") || !strings.Contains(errOut, "asks for 2") {
		t.Errorf("lock -n 2 on a semaphore of 3: exit %d, stderr %q; want 64 naming both values", code, errOut)
	}

	code, out, errOut := runLock(t, a, "status", s.path)
	if code != 0 {
		t.Fatalf("lock status exited %d: %s", code, errOut)
	}
	t.Logf("lock status:\n%s", out)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(fmt.Sprintf(`(?m)^Semaphore %s: 3 holders$`, regexp.QuoteMeta(s.path))),
		regexp.MustCompile(`(?m)^0 +held +alloc ` + byIndex[0].AllocID[:8] + `.* ` + byIndex[0].AllocID + ` +` + byIndex[0].Fence + ` `),
		regexp.MustCompile(`(?m)^1 +held +alloc ` + next.AllocID[:8] + `.* ` + next.AllocID + ` +` + next.Fence + ` `),
		regexp.MustCompile(`(?m)^2 +free \(never held\)`),
	} {
		if !want.MatchString(out) {
			t.Errorf("lock status does not match %s", want)
		}
	}
}

// allocIndex is the index of the allocation in its group (its name's [i]).
func allocIndex(t *testing.T, a *harness.Agent, allocID string) int {
	t.Helper()
	al, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("alloc %s: %v", allocID, err)
	}
	i := strings.LastIndex(al.Name, "[")
	n, err := strconv.Atoi(strings.TrimSuffix(al.Name[i+1:], "]"))
	if i < 0 || err != nil {
		t.Fatalf("alloc %s: no index in its name %q", allocID, al.Name)
	}
	return n
}

// TestDriverSemaphore: four allocations of a singleton task with
// lock { holders = 2 }. Two workloads run, one per slot; a graceful stop
// hands a slot over at once, and so does a SIGKILL of a holder's
// supervisor, whose slot the plugin releases once the task is proven dead.
func TestDriverSemaphore(t *testing.T) {
	t.Parallel()
	harness.Smoke(t)
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	const n = 2
	j := newDrvJob(t, "semaphore", 4)
	j.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q\n          holders = %d", drvTTLHCL, drvDelayHCL, n)
	j.failFast = true
	j.run(t, a)
	prefix := j.lockPath()

	a.WaitAllocs(t, j.id, 4, api.AllocClientStatusRunning, 60*time.Second)
	holders := map[int]harness.Record{}
	harness.WaitRecord(t, j.record, 60*time.Second, func(r harness.Record) bool {
		if isMainStart(r) {
			holders[slotOf(t, prefix, r)] = r
		}
		return len(holders) == n
	})
	for _, id := range drvRunning(t, a, j.id) {
		if id != holders[0].AllocID && id != holders[1].AllocID {
			drvWaitEvent(t, a, id, 30*time.Second, "Waiting for lock")
		}
	}
	for s, r := range holders {
		drvWaitEvent(t, a, r.AllocID, 30*time.Second, fmt.Sprintf("Acquired slot %d of %d", s, n))
	}
	sampler := j.sampler(t)
	sampler.WaitSeen(t, 30*time.Second, holders[0].PID, holders[1].PID)

	old := holders[0]
	if err := a.StopAlloc(old.AllocID); err != nil {
		t.Fatalf("stop alloc %s: %v", old.AllocID, err)
	}
	next := j.waitStart(t, 30*time.Second, func(r harness.Record) bool { return r.Instance != old.Instance && r.LockPath == old.LockPath })
	stop := j.waitEnd(t, old.Instance, 10*time.Second)
	handover := time.Duration(next.Mono - stop.Mono)
	harness.Measure(t, "driver_semaphore_slot_handover", handover)
	if handover < 0 || handover > 3*time.Second {
		t.Errorf("slot 0 handed over %s after its workload stopped, want 0 ≤ gap < 3s", handover)
	}

	crashed := holders[1]
	sup := drvSupervisor(t, crashed.AllocID)
	killAt := harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, crashed.PID, 5*time.Second)
	taken := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, func(r harness.Record) bool {
		return r.Instance != crashed.Instance && r.LockPath == crashed.LockPath
	})
	takeover := time.Duration(taken.Mono - killAt)
	harness.Measure(t, "driver_semaphore_slot_crash_takeover", takeover)
	if takeover > crashTakeoverBound {
		t.Errorf("slot 1 taken %s after its supervisor was killed, want < %s (not 2×TTL + delay)", takeover, crashTakeoverBound)
	}
	drvWaitEvent(t, a, crashed.AllocID, 15*time.Second, "Released lock on behalf of crashed supervisor")
	time.Sleep(500 * time.Millisecond)
	sum := sampler.Stop()
	checkSlots(t, prefix, n, j.records(t), sum, harness.KnownEnd{PID: crashed.PID, Mono: gone})
	t.Logf("sampler: %s", sum)
}

// TestLockSemaphoreWaitCost: three `lock -n 3` holders and twenty waiters
// against one agent. Parked waiters send nothing until a slot changes: the
// agent's CPU while they wait is about what the holders' renews cost alone.
//
// Slow on purpose (a minute): the agent's and the waiters' CPU is measured
// over three windows of 20 s, long enough for renews every TTL/2 to show.
func TestLockSemaphoreWaitCost(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true})
	s := newScenario(t, "sem-wait-cost")
	flags := lockArgs(s.path, "-n", "3")
	var procs []*harness.Process
	for range 3 {
		procs = append(procs, startPlainLock(t, a, flags, s.workloadArgv(t)...))
	}
	harness.WaitRecord(t, s.record, 60*time.Second, func(harness.Record) bool {
		return countStarts(readRecords(t, s.record), harness.RoleMain) == 3
	})
	t.Cleanup(func() {
		for _, p := range procs {
			_ = p.Signal(syscall.SIGTERM)
		}
	})
	const window = 20 * time.Second
	agentPID := a.Server().PID()
	base := cpuOver(t, window, agentPID)

	var waiters []int
	for range 20 {
		p := startPlainLock(t, a, flags, s.workloadArgv(t)...)
		procs = append(procs, p)
		waiters = append(waiters, p.PID())
	}
	for _, p := range procs[3:] {
		p.WaitOutput("semaphore slots are held, waiting", 60*time.Second)
	}
	time.Sleep(time.Second) // every waiter has parked its blocking queries
	parked := cpuOver(t, window, agentPID)
	waiting := cpuOver(t, window, waiters...)
	harness.Measure(t, "semaphore_agent_cpu_3_holders", fmt.Sprintf("%.2f%%", base*100))
	harness.Measure(t, "semaphore_agent_cpu_3_holders_20_waiters", fmt.Sprintf("%.2f%%", parked*100))
	harness.Measure(t, "semaphore_20_waiters_own_cpu", fmt.Sprintf("%.2f%%", waiting*100))
	if parked-base > 0.05 {
		t.Errorf("20 parked waiters cost the agent %.1f%% of a core more than the holders alone (%.1f%% → %.1f%%), want < 5%%",
			(parked-base)*100, base*100, parked*100)
	}
	if n := countStarts(readRecords(t, s.record), harness.RoleMain); n != 3 {
		t.Errorf("%d workloads started, want the 3 holders only", n)
	}
}

// cpuOver is the CPU the processes used over d, as a fraction of one core.
func cpuOver(t *testing.T, d time.Duration, pids ...int) float64 {
	t.Helper()
	ticks := func() uint64 {
		var sum uint64
		for _, pid := range pids {
			st, err := procfs.Read(pid)
			if err != nil {
				t.Fatalf("read /proc/%d/stat: %v", pid, err)
			}
			sum += st.UTime + st.STime
		}
		return sum
	}
	before, began := ticks(), time.Now()
	time.Sleep(d)
	used := time.Duration(ticks()-before) * procfs.ClockTick
	return float64(used) / float64(time.Since(began))
}
