package e2e

// The semaphore under faults that cost a holder its slot's lock: a frozen
// supervisor (its slot expires at the server) and a partition of the
// client holding the slots. What a user must see, on the workloads' own
// records: never more than N workloads at once, never two on one slot,
// every freed slot taken again, and a replacement allocation taking its
// own slot (NOMAD_ALLOC_INDEX mod N) when it is free.

import (
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// semSubject is one semaphore job: the driver (lock { holders = n }) or
// `lock -n n` under raw_exec, count allocations.
type semSubject struct {
	a      *harness.Agent
	n      int
	count  int
	driver bool
	drv    *drvJob  // driver
	sc     scenario // lock
}

// startSemSubject registers the job; failFast: no task restart and no
// reschedule (a fault's victim does not come back to compete).
func startSemSubject(t *testing.T, a *harness.Agent, driver bool, name string, n, count int, failFast bool) *semSubject {
	s := &semSubject{a: a, n: n, count: count, driver: driver}
	if driver {
		s.drv = newDrvJob(t, name, count)
		s.drv.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q\n          holders = %d", drvTTLHCL, drvDelayHCL, n)
		s.drv.failFast = failFast
		s.drv.run(t, a)
		return s
	}
	s.sc = newScenario(t, name)
	g := s.sc.lockGroup(t, count, []string{"-n", strconv.Itoa(n)}, nil)
	g.failFast = failFast
	a.RunJobHCL(t, jobHCL(s.sc.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.sc.job) })
	return s
}

func (s *semSubject) jobID() string {
	if s.driver {
		return s.drv.id
	}
	return s.sc.job
}

func (s *semSubject) marker() string {
	if s.driver {
		return s.drv.marker
	}
	return s.sc.marker
}

func (s *semSubject) record() string {
	if s.driver {
		return s.drv.record
	}
	return s.sc.record
}

// prefix is the semaphore's path: its slots are prefix/slot-<i>.
func (s *semSubject) prefix() string {
	if s.driver {
		return s.drv.lockPath()
	}
	return s.sc.path
}

func (s *semSubject) kind() string {
	if s.driver {
		return "driver"
	}
	return "lock"
}

func (s *semSubject) records(t *testing.T) []harness.Record { return readRecords(t, s.record()) }

func (s *semSubject) sampler(t *testing.T) *harness.Sampler {
	return harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker(), Filter: harness.Proc.IsMainWorkload})
}

// supervisor is the PID of the holder's supervisor (driver) or `lock`.
func (s *semSubject) supervisor(t *testing.T, holder harness.Record) int {
	t.Helper()
	if s.driver {
		return drvSupervisor(t, holder.AllocID).PID
	}
	lock, _ := lockOf(t, s.marker(), holder.PID)
	return lock.PID
}

// holders waits until every slot has a workload that started after since
// (CLOCK_MONOTONIC ns) and returns them by slot.
func (s *semSubject) holders(t *testing.T, since int64, timeout time.Duration) map[int]harness.Record {
	t.Helper()
	out := map[int]harness.Record{}
	harness.WaitRecord(t, s.record(), timeout, func(r harness.Record) bool {
		if isMainStart(r) && r.Mono > since {
			out[slotOf(t, s.prefix(), r)] = r
		}
		return len(out) == s.n
	})
	return out
}

// check is checkSlots on the job's records: every workload on a slot
// below n, never more than n at once, never two on one slot, fences
// increasing per slot (records and sampler).
func (s *semSubject) check(t *testing.T, sum harness.SampleSummary, known ...harness.KnownEnd) {
	t.Helper()
	checkSlots(t, s.prefix(), s.n, s.records(t), sum, known...)
}

// TestSemaphoreLockLoss: a holder's supervisor (the driver's, and `lock`)
// frozen with SIGSTOP past its fence deadline, for N = 2 and N = 3 with
// count = N + 2. The frozen holder's workload is killed before the server
// can expire the slot (the plugin's watchdog by the fence deadline, `lock`'s
// process-group guard by the stop deadline); a standby takes the slot once
// it is free (the plugin releases it for the killed supervisor, `lock`'s
// slot expires); after SIGCONT the old holder never runs again.
func TestSemaphoreLockLoss(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	var subs []subtest
	for _, driver := range []bool{true, false} {
		for _, n := range []int{2, 3} {
			kind := map[bool]string{true: "driver", false: "lock"}[driver]
			subs = append(subs, subtest{fmt.Sprintf("%s_%d_of_%d", kind, n, n+2), func(t *testing.T) {
				testSemaphoreFrozenHolder(t, a, driver, n)
			}})
		}
	}
	runConcurrently(t, subs)
}

func testSemaphoreFrozenHolder(t *testing.T, a *harness.Agent, driver bool, n int) {
	kind := map[bool]string{true: "d", false: "l"}[driver]
	s := startSemSubject(t, a, driver, fmt.Sprintf("semloss-%s%d", kind, n), n, n+2, true)
	a.WaitAllocs(t, s.jobID(), n+2, api.AllocClientStatusRunning, 90*time.Second)
	holders := s.holders(t, 0, 90*time.Second)
	smp := s.sampler(t)
	for _, r := range holders {
		smp.WaitSeen(t, 30*time.Second, r.PID)
	}

	victim := holders[n-1]
	sup := s.supervisor(t, victim)
	drvSIGCONTCleanup(t, sup)
	at := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Its workload must be gone by the fence deadline (TTL − margin after
	// the last renew), before the server can expire the slot (2×TTL).
	for deadline := time.Now().Add(drvTTL + 10*time.Second); drvAlive(victim.PID) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	gone := harness.MonoNow()
	var known []harness.KnownEnd
	if drvAlive(victim.PID) {
		t.Errorf("the frozen holder's workload %d still runs %s after SIGSTOP of its supervisor", victim.PID, time.Duration(gone-at))
	} else {
		known = append(known, harness.KnownEnd{PID: victim.PID, Mono: gone})
		harness.Measure(t, fmt.Sprintf("semaphore_%s_n%d_fenced_after_sigstop", s.kind(), n), time.Duration(gone-at))
		// The plugin's watchdog kills by the fence deadline (TTL − margin
		// after the last renew); `lock`'s process-group guard by the stop
		// deadline, still before the server can expire the slot (2×TTL).
		bound, by := drvTTL, "TTL (the plugin's watchdog)"
		if !driver {
			bound, by = 2*drvTTL, "2×TTL (lock's guard)"
		}
		if killed := time.Duration(gone - at); killed >= bound {
			t.Errorf("the frozen holder's workload was killed %s after SIGSTOP, want before %s", killed, by)
		}
	}

	// A standby takes the freed slot: the driver's plugin releases it on
	// behalf of the supervisor its watchdog killed; `lock`'s expires.
	next := waitMainStart(t, s.record(), chaosTakeoverBound, func(r harness.Record) bool {
		return r.Instance != victim.Instance && r.LockPath == victim.LockPath && r.Mono > victim.Mono
	})
	takeover := time.Duration(next.Mono - at)
	harness.Measure(t, fmt.Sprintf("semaphore_%s_n%d_slot_taken_after_sigstop", s.kind(), n), takeover)
	if next.AllocID == victim.AllocID {
		t.Errorf("the frozen holder's allocation %s took its slot again", drvShort(victim.AllocID))
	}
	if len(known) > 0 && next.Mono < gone {
		t.Errorf("slot %s was taken %s before the frozen holder's workload was gone", victim.LockPath, time.Duration(gone-next.Mono))
	}
	// Keep it frozen past TTL in any case, then thaw it: it must not run
	// again (the driver's watchdog has killed it; `lock` finds its slot
	// lost and exits).
	for time.Duration(harness.MonoNow()-at) < drvTTL+time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	contAt := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	recs := s.records(t)
	for _, r := range recs {
		if isMainStart(r) && r.Mono > contAt && r.AllocID == victim.AllocID {
			t.Errorf("the frozen holder's allocation ran a workload again after SIGCONT: %+v", r)
		}
	}
	// Every slot is held again, one workload each.
	live := mainWorkloads(t, s.marker())
	if len(live) != n {
		t.Errorf("%d workloads run after the loss, want %d: %v", len(live), n, live)
	}
	s.check(t, smp.Stop(), known...)
}

// TestSemaphorePartition: the client holding every slot cut off from the
// servers (server and two clients as separate agents, clients in network
// namespaces), for the driver with N = 2 and N = 3 at count = N + 2, and
// for jobs of count = N (the driver with N = 2, `lock -n 3`) whose
// replacements must each take their own slot. Every holder self-fences by
// its fence deadline; the servers expire the slots; the replacements on
// the second client take every slot (each its own where it is free); after
// the heal the replacements stay the holders and the old allocations'
// workloads never run again.
//
// Slow on purpose (over a minute): the replacements can take the slots only
// once the servers have marked the client down and expired its slots
// (2×TTL + delay after the last renew).
func TestSemaphorePartition(t *testing.T) {
	t.Parallel()
	if skip := chaosPartitionSkip(); skip != "" {
		t.Skip(skip)
	}
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, chaosPartitionAgentOptions(t))
	cut, other := chaosPartitionClients(t, a)

	subjects := []*semSubject{
		startSemSubject(t, a, true, "sempart-d2", 2, 4, false),
		startSemSubject(t, a, true, "sempart-d3", 3, 5, false),
		startSemSubject(t, a, true, "sempart-own-d2", 2, 2, false),
		startSemSubject(t, a, false, "sempart-own-l3", 3, 3, false),
	}
	ownSlot := func(s *semSubject) bool { return s.count == s.n }

	type state struct {
		holders map[int]harness.Record
		smp     *harness.Sampler
		old     []string // the job's allocations on the cut client
	}
	st := map[*semSubject]*state{}
	for _, s := range subjects {
		allocs := a.WaitAllocs(t, s.jobID(), s.count, api.AllocClientStatusRunning, 120*time.Second)
		x := &state{holders: s.holders(t, 0, 90*time.Second), smp: s.sampler(t)}
		for _, al := range allocs {
			if al.NodeID != cut.NodeID() {
				t.Fatalf("%s: allocation %s runs on node %s, want %s (%s)", s.jobID(), drvShort(al.ID), drvShort(al.NodeID), drvShort(cut.NodeID()), cut.Name())
			}
			x.old = append(x.old, al.ID)
		}
		for slot, r := range x.holders {
			x.smp.WaitSeen(t, 30*time.Second, r.PID)
			if ownSlot(s) {
				if i := allocIndex(t, a, r.AllocID); i%s.n != slot {
					t.Errorf("%s: allocation index %d took slot %d, want its own (%d)", s.jobID(), i, slot, i%s.n)
				}
			}
		}
		st[s] = x
	}

	var markers []string
	var oldAllocs []string
	var watched [][]harness.Record
	for _, s := range subjects {
		markers = append(markers, s.marker())
		oldAllocs = append(oldAllocs, st[s].old...)
		for _, r := range st[s].holders {
			watched = append(watched, []harness.Record{r})
		}
	}
	oldGone := chaosWatchAllocsGone(t, markers, oldAllocs...)
	at := chaosCut(t, cut)
	known, fenced := chaosWaitSelfFence(t, at, watched...)
	t.Logf("every holder self-fenced: %v after the cut", fenced)

	// The servers expire every slot (2×TTL after its last renew, then the
	// delay). Only then may the second client take the replacements, so
	// that each replacement of a count = N job finds its own slot free.
	for _, s := range subjects {
		for i := range s.n {
			waitReleased(t, a, s.prefix()+"/slot-"+strconv.Itoa(i), chaosTakeoverBound)
		}
	}
	expiredAt := harness.MonoNow()
	harness.Measure(t, "semaphore_partition_slots_expired_after_cut", time.Duration(expiredAt-at))
	chaosSetEligible(t, a, other, true)

	bound := 3*chaosPartitionHeartbeat + 90*time.Second
	for _, s := range subjects {
		x := st[s]
		next := s.holders(t, expiredAt, bound)
		taken := int64(0)
		for slot, r := range next {
			taken = max(taken, r.Mono)
			if slices.Contains(x.old, r.AllocID) {
				t.Errorf("%s: slot %d taken by the cut-off allocation %s", s.jobID(), slot, drvShort(r.AllocID))
				continue
			}
			if node := chaosAllocNode(t, a, r.AllocID); node != other.NodeID() {
				t.Errorf("%s: slot %d's new holder %s runs on node %s, want the second client", s.jobID(), slot, drvShort(r.AllocID), drvShort(node))
			}
			if ownSlot(s) {
				if i := allocIndex(t, a, r.AllocID); i%s.n != slot {
					t.Errorf("%s: the replacement of index %d took slot %d, though its own slot %d was free", s.jobID(), i, slot, i%s.n)
				}
			}
		}
		harness.Measure(t, fmt.Sprintf("semaphore_partition_%s_every_slot_retaken_after_cut", s.jobID()), time.Duration(taken-at))
		x.holders = next
	}

	healAt := harness.MonoNow()
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	chaosWaitNodeReady(t, a, cut, 90*time.Second)
	harness.Measure(t, "semaphore_partition_node_ready_after_heal", time.Duration(harness.MonoNow()-healAt))
	goneAt := oldGone(90 * time.Second)
	harness.Measure(t, "semaphore_partition_old_allocations_gone_after_cut", time.Duration(goneAt-at))
	// Give the healed client time to act on its allocations' fate; the
	// replacements must stay the holders.
	time.Sleep(5 * time.Second)
	for _, s := range subjects {
		x := st[s]
		for slot, r := range x.holders {
			v := readLock(t, a, s.prefix()+"/slot-"+strconv.Itoa(slot))
			if v == nil || v.Lock == nil || v.Items["holder_alloc_id"] != r.AllocID {
				t.Errorf("%s: after the heal slot %d is %+v, want it held by the replacement %s", s.jobID(), slot, v, drvShort(r.AllocID))
			}
		}
		live := mainWorkloads(t, s.marker())
		if len(live) != s.n {
			t.Errorf("%s: %d workloads run after the heal, want %d: %v", s.jobID(), len(live), s.n, live)
		}
		for _, p := range live {
			if slices.Contains(x.old, p.AllocID) {
				t.Errorf("%s: a workload of the cut-off allocation %s runs after the heal (pid %d)", s.jobID(), drvShort(p.AllocID), p.PID)
			}
		}
		s.check(t, x.smp.Stop(), known...)
	}
}
