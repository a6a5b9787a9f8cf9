package e2e

// Lease mode under two more faults (docs/lease.md): the holder's task
// frozen longer than L (its cgroup freezer and SIGSTOP of its supervisor),
// and Nomad leader elections while a lease-mode holder holds.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// leaseTaskCgroup is the holder's task cgroup and how to freeze and thaw
// it: v1 its freezer cgroup (freezer.state), v2 its unified cgroup
// (cgroup.freeze).
func leaseTaskCgroup(t *testing.T, allocID string) (dir, file, frozen, thawed string) {
	t.Helper()
	switch cgroupslib.GetMode() {
	case cgroupslib.CG1:
		return cgroupslib.PathCG1(allocID, drvTask, "freezer"), "freezer.state", "FROZEN", "THAWED"
	case cgroupslib.CG2:
		return cgroupslib.LinuxResourcesPath(allocID, drvTask, false), "cgroup.freeze", "1", "0"
	}
	t.Fatal("no cgroups on this host: the task cannot be frozen")
	return
}

// leaseCgroupPIDs lists the processes of the task cgroup dir.
func leaseCgroupPIDs(dir string) map[int]bool {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	out := map[int]bool{}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out[pid] = true
		}
	}
	return out
}

// leaseDescendants lists pid and every process descended from it.
func leaseDescendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		if f := strings.Fields(rest); len(f) > 1 {
			if pp, err := strconv.Atoi(f[1]); err == nil {
				parent[p] = pp
			}
		}
	}
	out := []int{pid}
	for grew := true; grew; {
		grew = false
		for p, pp := range parent {
			if slices.Contains(out, pp) && !slices.Contains(out, p) {
				out = append(out, p)
				grew = true
			}
		}
	}
	return out
}

// leaseFrozen is the state leaseFreezeTask left for leaseThaw.
type leaseFrozen struct {
	state, thawed string
	stopped       []int
}

// leaseFrozenTasks maps a frozen holder's allocation ID to its freeze.
// Guarded: trials of tests that run side by side share it.
var leaseFrozenTasks = struct {
	sync.Mutex
	m map[string]*leaseFrozen
}{m: map[string]*leaseFrozen{}}

// leaseFreezeTask freezes the holder's whole task at once: the workload in
// its cgroup (the freezer) and the supervisor and its process-group guard
// (outside the cgroup: SIGSTOP). The node's agent and plugin run on. It
// waits until the workload is gone (the plugin's watchdog) or leaseFreezeFor
// has passed, and returns when the freeze began and when the workload was
// seen gone (0: still there). leaseThaw ends the freeze.
func leaseFreezeTask(t *testing.T, holder harness.Record, tr *chaosTrial) (at, gone int64) {
	t.Helper()
	sup := drvSupervisor(t, holder.AllocID).PID
	dir, file, frozen, thawed := leaseTaskCgroup(t, holder.AllocID)
	state := filepath.Join(dir, file)
	in := leaseCgroupPIDs(dir)
	if !in[holder.PID] {
		t.Fatalf("the holder's workload %d is not in its task cgroup %s (%v)", holder.PID, dir, in)
	}
	var stop []int
	for _, pid := range leaseDescendants(sup) {
		if !in[pid] {
			stop = append(stop, pid)
		}
	}
	f := &leaseFrozen{state: state, thawed: thawed, stopped: stop}
	leaseFrozenTasks.Lock()
	leaseFrozenTasks.m[holder.AllocID] = f
	leaseFrozenTasks.Unlock()
	t.Cleanup(func() { leaseThawNow(f) })

	at = harness.MonoNow()
	if err := os.WriteFile(state, []byte(frozen), 0o644); err != nil {
		t.Fatalf("freeze %s: %v", state, err)
	}
	for _, pid := range stop {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Logf("froze the task cgroup %s (%v) and SIGSTOPped the supervisor and its guard %v", dir, slices.Sorted(func(yield func(int) bool) {
		for p := range in {
			if !yield(p) {
				return
			}
		}
	}), stop)
	for time.Duration(harness.MonoNow()-at) < leaseFreezeFor {
		if !drvAlive(holder.PID) {
			gone = harness.MonoNow()
			killed := time.Duration(gone - at)
			harness.Measure(t, "freeze_workload_killed", killed)
			tr.Note = "frozen workload killed " + harness.Millis(killed) + " after the freeze (the node's plugin watchdog)"
			return at, gone
		}
		time.Sleep(10 * time.Millisecond)
	}
	tr.Note = "frozen workload still there at the thaw"
	return at, 0
}

func leaseThawNow(f *leaseFrozen) {
	_ = os.WriteFile(f.state, []byte(f.thawed), 0o644)
	for _, pid := range f.stopped {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// leaseThaw ends leaseFreezeTask's freeze no earlier than leaseFreezeFor
// after it began, then checks that the old holder never ran again: no
// workload start with its fence after the thaw, its supervisor and guard
// gone within a bound.
func leaseThaw(t *testing.T, s *chaosSubject, holder harness.Record, at int64, next harness.Record) {
	t.Helper()
	leaseFrozenTasks.Lock()
	f := leaseFrozenTasks.m[holder.AllocID]
	delete(leaseFrozenTasks.m, holder.AllocID)
	leaseFrozenTasks.Unlock()
	for time.Duration(harness.MonoNow()-at) < leaseFreezeFor {
		time.Sleep(50 * time.Millisecond)
	}
	thawAt := harness.MonoNow()
	leaseThawNow(f)
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range f.stopped {
		for drvAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if drvAlive(pid) {
			t.Errorf("process %d of the thawed holder (supervisor or guard) still alive 30s after the thaw", pid)
		}
	}
	for _, r := range s.records(t) {
		if isMainStart(r) && r.Mono > thawAt && r.Fence == holder.Fence {
			t.Errorf("the old holder ran again with its old fence %s after the thaw: %+v", holder.Fence, r)
		}
	}
	if drvAlive(holder.PID) {
		t.Errorf("the frozen holder's workload %d runs after the thaw, beside the new holder %d", holder.PID, next.PID)
	}
}

// Leader elections during a lease (row 10-leader-election-lease): three
// servers and one client, a lease-mode driver job of two allocations on
// it (the holder, and the standby that the client's plugin watches for).

// leaseElectionAgentOptions: three servers, one client with the plugin
// and a release_token_file.
func leaseElectionAgentOptions(t *testing.T) harness.AgentOptions {
	t.Helper()
	harness.BuildTestWorkload(t)
	opts := chaosElectionAgentOptions(t)
	leaseWithReleaseToken(t, &opts)
	return opts
}

// leaseElections is how many times a trial kills the leader.
const leaseElections = 6

// leaseElectionTrial kills the Raft leader leaseElections times while a
// lease-mode holder holds (the next election once a heartbeat has been
// written since the restart, at a random phase of the heartbeats). An
// election longer than D may fence the holder (a spurious fence, counted):
// then its workload stops and the standby takes over; never two workloads
// at once.
func leaseElectionTrial(t *testing.T, a *harness.Agent, lockBlock, name string, tr *chaosTrial) {
	j := newDrvJob(t, name, 2)
	j.lockBlock = lockBlock
	// Every election may fence the holder (an aggressive lease's fence is
	// 2 s, and an election here takes up to 3.5 s), and each fence is a
	// task restart: Nomad's default policy (2 attempts in 30 min, then the
	// allocation fails and its replacement waits for the reschedule delay)
	// ran out by the third election. Enough attempts for one a fence.
	j.groupExtra = fmt.Sprintf("restart {\n      attempts = %d\n      interval = \"30m\"\n      delay    = \"1s\"\n      mode     = \"fail\"\n    }", 2*leaseElections)
	j.run(t, a)
	s := &chaosSubject{variant: "driver", a: a, drv: j}
	defer s.purge(t)
	holder := s.holder(t)
	l := "L = 9s"
	if strings.Contains(lockBlock, "aggressive") {
		l = "L = 4s"
	}
	drvWaitEvent(t, a, holder.AllocID, 30*time.Second, "Lease mode: ", l)
	smp := s.sampler(t)
	smp.WaitSeen(t, 30*time.Second, holder.PID)
	beat := j.lockPath() + "/lease"

	var worst time.Duration
	var kills []int64 // CLOCK_MONOTONIC
	began := time.Now()
	for e := 1; e <= leaseElections; e++ {
		old := chaosWaitLeader(t, a, nil)
		at := time.Now()
		kills = append(kills, harness.MonoNow())
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		nl := chaosWaitLeader(t, a, old)
		took := time.Since(at)
		worst = max(worst, took)
		t.Logf("election %d: killed leader %s, new leader %s after %s", e, old.Name(), nl.Name(), took.Round(time.Millisecond))
		if err := old.Start(); err != nil {
			t.Fatal(err)
		}
		// Settled: a heartbeat written (by whichever allocation holds)
		// after the restart, and both tasks running again (a fenced
		// holder's task exits and Nomad restarts it after its restart
		// delay: until then there is no standby to hand over to); then a
		// random phase of the heartbeats.
		leaseWaitBeat(t, a, beat, time.Now(), chaosElectionBound+chaosTakeoverBound)
		leaseWaitTasksRunning(t, a, j.id, 2, 90*time.Second)
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
	}
	elapsed := time.Since(began)
	// Let any fence the last election caused run its course: the standby
	// takes over within L; then a heartbeat since.
	time.Sleep(10 * time.Second)
	leaseWaitBeat(t, a, beat, time.Now(), chaosTakeoverBound)

	recs := s.records(t)
	starts := drvStarts(recs)
	fences := len(starts) - 1
	sum := smp.Stop()
	chaosCheck(t, tr, recs, sum)
	// Each handover: from the kill of the leader that caused it to the
	// standby's workload start. No handover follows its election by less
	// than D (2 s at the least: the heartbeat outage that fences), so a
	// start is laid to the last kill at least that long before it (the
	// next election may come just before the start record of a takeover
	// whose first heartbeat ended the wait for it).
	minD := lockclient.DefaultHeartbeat.Fence
	if strings.Contains(lockBlock, "aggressive") {
		minD = lockclient.AggressiveHeartbeat.Fence
	}
	var handovers []time.Duration
	for i := 1; i < len(starts); i++ {
		if starts[i].AllocID == starts[i-1].AllocID && starts[i].Fence == starts[i-1].Fence {
			t.Errorf("workload start %d reuses the fence %s of the one before", i, starts[i].Fence)
		}
		var kill int64
		for _, k := range kills {
			if k <= starts[i].Mono-int64(minD) {
				kill = k
			}
		}
		if kill != 0 {
			handovers = append(handovers, time.Duration(starts[i].Mono-kill))
			harness.Measure(t, "lease_election_handover", handovers[len(handovers)-1])
		}
	}
	handoverText := "none"
	if len(handovers) > 0 {
		tr.Takeover = handovers[0]
		sorted := slices.Sorted(slices.Values(handovers))
		handoverText = fmt.Sprintf("%s to %s, median %s (leader killed → the standby's workload start)",
			harness.Millis(sorted[0]), harness.Millis(sorted[len(sorted)-1]), harness.Millis(sorted[len(sorted)/2]))
	}
	// What the holders logged: failed heartbeats, and how close the
	// closest came to its fence deadline.
	log := chaosTaskLog(t, a, j.id, drvTask)
	failed := strings.Count(log, "heartbeat failed")
	closest := time.Duration(-1)
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "heartbeat failed") {
			continue
		}
		if m := regexp.MustCompile(`fence_deadline_in=(\S+)`).FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil && (closest < 0 || d < closest) {
				closest = d
			}
		}
	}
	tr.Recovery = worst
	tr.Note = fmt.Sprintf("%d elections in %s, worst kill → new leader %s; spurious fences (handovers to the standby): %d, handovers %s; "+
		"failed heartbeats in the holders' logs: %d, the closest %s before its fence deadline",
		leaseElections, elapsed.Round(time.Second), harness.Millis(worst), fences, handoverText, failed, closest)
	harness.Measure(t, "lease_election_worst", worst)
	harness.Measure(t, "lease_election_spurious_fences", fences)
}

// leaseWaitBeat waits (bounded) until the heartbeat variable path is
// written after since (its ModifyTime).
func leaseWaitBeat(t *testing.T, a *harness.Agent, path string, since time.Time, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, _, err := a.API().Variables().Peek(path, nil)
		if err == nil && v != nil && time.Unix(0, v.ModifyTime).After(since) {
			return
		}
		var ue api.UnexpectedResponseError
		if err != nil && !errors.As(err, &ue) && time.Now().After(deadline) {
			t.Fatalf("heartbeat %s: %v", path, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat written to %s within %s of %s (last read: %v, %v)", path, timeout, since.Format("15:04:05.000"), v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLeaseHostPause: every process of the lease-mode holder's client (the
// agent, the plugin, the supervisor, its guard, the workload) stopped at
// once for leaseFreezeFor, longer than L, as a hypervisor pauses a VM, and
// then resumed, the workload first. Nothing on the paused host can kill the
// workload during the pause, so the standby takes over at L while the old
// workload is stopped; on the resume it runs until a kill path on its host
// (supervisor, guard, plugin watchdog) sees its passed deadline. That is
// the case docs/lease.md leaves to fencing tokens: this test measures how
// long the resumed workload ran beside the new holder, and checks that it
// is killed at once (well under a second here), that it never starts again
// with its old fence, and that the new holder keeps the lock.
func TestLeaseHostPause(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	j := newDrvJob(t, "lease-hp", 2)
	j.lockBlock = leaseLockBlock
	j.groupExtra = "constraint {\n      operator = \"distinct_hosts\"\n      value    = \"true\"\n    }"
	j.run(t, a)
	s := &chaosSubject{variant: "driver", a: a, drv: j}
	holder := s.holder(t)
	host := a.ClientOf(chaosAllocNode(t, a, holder.AllocID))
	var standby string
	for _, id := range drvRunning(t, a, j.id) {
		if id != holder.AllocID {
			standby = id
		}
	}
	drvWaitEvent(t, a, standby, 30*time.Second, "Lease mode: ", "L = 9s")
	time.Sleep(4 * time.Second)
	w, err := harness.WatchExit(holder.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", host.PID()))
	if err != nil {
		t.Fatal(err)
	}
	at := harness.MonoNow()
	stopped := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		fresh := 0
		for _, pid := range harness.NetnsPIDs(ns) {
			if !stopped[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	resume := func() {
		_ = syscall.Kill(holder.PID, syscall.SIGCONT)
		for pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	if !stopped[holder.PID] {
		t.Fatalf("the holder's workload %d is not among the paused host's processes", holder.PID)
	}

	next := s.next(t, holder, chaosTakeoverBound)
	harness.Measure(t, "host_pause_takeover", time.Duration(next.Mono-at))
	if next.AllocID != standby {
		t.Errorf("the new holder is %s, want the standby %s", drvShort(next.AllocID), drvShort(standby))
	}
	for time.Duration(harness.MonoNow()-at) < leaseFreezeFor {
		time.Sleep(50 * time.Millisecond)
	}
	resumed := harness.MonoNow()
	resume()
	death, died := w.Wait(10 * time.Second)
	if !died {
		t.Fatalf("the resumed holder's workload %d still runs 10s after the resume", holder.PID)
	}
	ran := time.Duration(death - resumed)
	harness.Measure(t, "host_pause_old_workload_ran_after_resume", ran)
	t.Logf("host paused %s; the standby's workload started %s after the pause began; the resumed old workload ran %s beside it",
		leaseFreezeFor, time.Duration(next.Mono-at).Round(time.Millisecond), ran)
	if ran > time.Second {
		t.Errorf("the resumed holder's workload ran %s beside the new holder, want it killed at once (its deadlines had all passed)", ran)
	}
	// The host's kill paths act at once; its agent and the old allocation
	// settle; the old holder never starts again with its old fence, and
	// the new holder keeps running.
	time.Sleep(5 * time.Second)
	for _, r := range s.records(t) {
		if isMainStart(r) && r.Mono > resumed && r.Fence == holder.Fence {
			t.Errorf("the old holder ran again with its old fence %s after the resume: %+v", holder.Fence, r)
		}
	}
	if !drvAlive(next.PID) {
		t.Errorf("the new holder's workload %d is gone after the old host resumed", next.PID)
	}
	s.purge(t)
	leaseWaitNodeQuiet(t, host, 45*time.Second)
}

// leaseWaitTasksRunning waits (bounded) until n allocations of the job have
// their task running, for a second at least (a standby waits for the lock).
func leaseWaitTasksRunning(t *testing.T, a *harness.Agent, jobID string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		allocs, _, err := a.API().Jobs().Allocations(jobID, false, nil)
		running := 0
		for _, al := range allocs {
			if ts := al.TaskStates[drvTask]; al.DesiredStatus == api.AllocDesiredStatusRun && ts != nil &&
				ts.State == "running" && time.Since(ts.StartedAt) > time.Second {
				running++
			}
		}
		if err == nil && running >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d allocations with their task running after %s, want %d (err %v)", jobID, running, timeout, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
