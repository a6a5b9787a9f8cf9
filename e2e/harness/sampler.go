package harness

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// MonoNow returns CLOCK_MONOTONIC in nanoseconds: the clock the testworkload
// records use, shared by every process on the host.
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// SamplerOptions configures StartSampler.
type SamplerOptions struct {
	// Marker selects processes, as in FindProcs. Required.
	Marker string
	// Filter narrows the matches further; nil keeps every match. Usually
	// Proc.IsMainWorkload, so wrappers and grandchildren are not counted.
	Filter func(Proc) bool
	// Interval between samples (default 20ms).
	Interval time.Duration
}

// Sample is one scan of /proc.
type Sample struct {
	Mono int64 // CLOCK_MONOTONIC ns when the scan started
	// Done is when the scan ended: a process missing from the scan may have
	// died at any moment up to Done, so "gone" times use Done (an upper bound).
	Done   int64
	Wall   time.Time // wall time of the same moment
	PIDs   []int     // matching processes, sorted
	Allocs []string  // distinct owners: NOMAD_ALLOC_ID, or "pid:<n>" without one; sorted
	Procs  []Sighted // each matching process with its owner and when it was seen alive
	Err    error     // the scan failed; PIDs and Allocs are empty
}

// Sighted is one process in one scan.
type Sighted struct {
	PID   int
	Owner string // as in Sample.Allocs
	Seen  int64  // CLOCK_MONOTONIC ns at which the scan knew it alive
}

// SampleSummary is what a Sampler saw.
type SampleSummary struct {
	Samples   []Sample
	MaxProcs  int // most matching processes in one sample
	MaxAllocs int // most distinct allocations in one sample
	Errors    int // samples whose scan failed
	// Exits holds when each matching process exited (CLOCK_MONOTONIC ns),
	// from a pidfd opened right after the scan that first saw it.
	Exits map[int]int64
	// AliveAtStop are the matching processes still running when the
	// sampler stopped (watched, no exit seen).
	AliveAtStop map[int]bool
}

// Sampler scans /proc periodically in the background. Create it with
// StartSampler and end it with Stop.
type Sampler struct {
	opts    SamplerOptions
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	summary SampleSummary
	mu      sync.Mutex         // guards watches' keys against Seen
	watches map[int]*ExitWatch // every matching PID seen, from its first scan on
	taken   atomic.Int64       // samples so far
	// notBefore: the next sample's scan starts at this CLOCK_MONOTONIC ns
	// or later (after the sampler's start, after its previous sample's).
	notBefore int64
}

// procScan is one scan of every process on the machine, which every
// Sampler that asks for a sample while it runs shares (sharedScan).
type procScan struct {
	mono, done int64     // CLOCK_MONOTONIC ns at its start and end
	wall       time.Time // wall time at its start
	procs      []Proc
	err        error
	ready      chan struct{} // closed once procs, done and err are set
}

// procScans holds the scan in progress, if any.
var procScans struct {
	sync.Mutex
	running *procScan
}

// sharedScan returns a scan of /proc that started at notBefore or later:
// the one in progress if it did, else a new one. With many tests side by
// side (make e2e), a scan per Sampler every 20 ms would take every core of
// the machine (a scan reads four files of each of hundreds of processes);
// shared, the samplers of one test binary cost one scanner.
func sharedScan(notBefore int64) *procScan {
	procScans.Lock()
	if r := procScans.running; r != nil && r.mono >= notBefore {
		procScans.Unlock()
		<-r.ready
		return r
	}
	r := &procScan{mono: MonoNow(), wall: time.Now(), ready: make(chan struct{})}
	procScans.running = r
	procScans.Unlock()

	r.procs, r.err = scanProcs(func(Proc) bool { return true })
	r.done = MonoNow()
	procScans.Lock()
	if procScans.running == r {
		procScans.running = nil
	}
	procScans.Unlock()
	close(r.ready)
	return r
}

// StartSampler starts sampling at once. t.Cleanup stops it if the test did not.
func StartSampler(t testing.TB, opts SamplerOptions) *Sampler {
	t.Helper()
	if opts.Marker == "" {
		t.Fatalf("harness: StartSampler needs a Marker")
	}
	if opts.Interval <= 0 {
		opts.Interval = 20 * time.Millisecond
	}
	s := &Sampler{opts: opts, stop: make(chan struct{}), done: make(chan struct{}), watches: map[int]*ExitWatch{}, notBefore: MonoNow()}
	go s.run()
	t.Cleanup(func() { s.Stop() })
	return s
}

// SampleFor samples for duration d and returns the summary.
func SampleFor(t testing.TB, opts SamplerOptions, d time.Duration) SampleSummary {
	t.Helper()
	s := StartSampler(t, opts)
	time.Sleep(d)
	return s.Stop()
}

// SampleForAtLeast samples for duration d and on until at least n samples
// were taken, and returns the summary; the test fails if that takes longer
// than limit. On a loaded machine a scan of /proc may take a second, so a
// test that asserts over n samples waits longer there rather than fail.
func SampleForAtLeast(t testing.TB, opts SamplerOptions, d time.Duration, n int, limit time.Duration) SampleSummary {
	t.Helper()
	s := StartSampler(t, opts)
	began := time.Now()
	time.Sleep(d)
	for s.taken.Load() < int64(n) {
		if time.Since(began) > limit {
			sum := s.Stop()
			t.Fatalf("harness: the sampler (marker %s) took %d samples in %s, want %d: /proc scans this slow prove little",
				opts.Marker, len(sum.Samples), limit, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s.Stop()
}

// Seen reports whether scans have seen every one of pids (and, for those
// still alive then, opened a pidfd on it, so their exits are dated). A test
// that needs the sampler to have seen a process before it kills it waits on
// this (WaitSeen), never on a sleep of a few sampling periods: a loaded
// machine may not scan /proc that often.
func (s *Sampler) Seen(pids ...int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range pids {
		if _, ok := s.watches[pid]; !ok {
			return false
		}
	}
	return true
}

// WaitSeen waits until Seen(pids...) and fails the test if that takes
// longer than timeout.
func (s *Sampler) WaitSeen(t testing.TB, timeout time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !s.Seen(pids...) {
		if time.Now().After(deadline) {
			t.Fatalf("harness: the sampler (marker %s) did not see pids %v within %s", s.opts.Marker, pids, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watch returns the exit watch of a PID Seen alive (nil otherwise).
func (s *Sampler) watch(pid int) *ExitWatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watches[pid]
}

// Stop ends sampling (after one final sample) and returns the summary. It may
// be called more than once.
func (s *Sampler) Stop() SampleSummary {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return s.summary
}

func (s *Sampler) run() {
	defer close(s.done)
	var sum SampleSummary
	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	stopping := false
	for {
		smp := s.take()
		if smp.Err != nil {
			sum.Errors++
		}
		sum.MaxProcs = max(sum.MaxProcs, len(smp.PIDs))
		sum.MaxAllocs = max(sum.MaxAllocs, len(smp.Allocs))
		sum.Samples = append(sum.Samples, smp)
		s.taken.Add(1)
		for _, pid := range smp.PIDs {
			if _, ok := s.watches[pid]; !ok {
				w, err := WatchExit(pid)
				if err != nil {
					w = nil // gone already: its end is known only from the scans
				}
				s.mu.Lock()
				s.watches[pid] = w
				s.mu.Unlock()
			}
		}
		if stopping {
			sum.Exits, sum.AliveAtStop = map[int]int64{}, map[int]bool{}
			for pid, w := range s.watches {
				if w == nil {
					continue
				}
				if at, ok := w.Exited(); ok {
					sum.Exits[pid] = at
				} else {
					sum.AliveAtStop[pid] = true
				}
				w.Close()
			}
			s.summary = sum
			return
		}
		select {
		case <-s.stop:
			// Take one last sample: the state at Stop, by a scan that
			// started after it.
			stopping = true
			s.notBefore = max(s.notBefore, MonoNow())
		case <-tick.C:
		}
	}
}

func (s *Sampler) take() Sample {
	scan := sharedScan(s.notBefore)
	s.notBefore = scan.mono + 1
	smp := Sample{Mono: scan.mono, Done: scan.done, Wall: scan.wall}
	if scan.err != nil {
		smp.Err = scan.err
		return smp
	}
	owners := map[string]bool{}
	for _, p := range scan.procs {
		if !p.contains(s.opts.Marker) || (s.opts.Filter != nil && !s.opts.Filter(p)) {
			continue
		}
		smp.PIDs = append(smp.PIDs, p.PID)
		owner := p.AllocID
		if owner == "" {
			owner = fmt.Sprintf("pid:%d", p.PID)
		}
		owners[owner] = true
		smp.Procs = append(smp.Procs, Sighted{PID: p.PID, Owner: owner, Seen: p.Seen})
	}
	smp.Allocs = slices.Sorted(maps.Keys(owners))
	sort.Ints(smp.PIDs)
	return smp
}

// Over returns the samples proving that more than limit distinct
// allocations ran at one moment, e.g. Over(1) are the moments a singleton
// was violated. A scan reads processes one after another, so seeing two in
// one scan proves nothing by itself (the first may have exited before the
// second started, on a busy machine tens of ms apart): a sample counts when,
// at the moment one process was seen, processes of more than limit
// allocations were alive, each seen by then and exiting (pidfd) only after.
func (s SampleSummary) Over(limit int) []Sample {
	var out []Sample
	for _, smp := range s.Samples {
		if len(smp.Allocs) > limit && s.provenTogether(smp, limit) {
			out = append(out, smp)
		}
	}
	return out
}

func (s SampleSummary) provenTogether(smp Sample, limit int) bool {
	for _, at := range smp.Procs {
		owners := map[string]bool{}
		for _, p := range smp.Procs {
			if p.Seen <= at.Seen && s.aliveAt(p, at.Seen) {
				owners[p.Owner] = true
			}
		}
		if len(owners) > limit {
			return true
		}
	}
	return false
}

// aliveAt: p was seen alive at p.Seen <= t; was it still at t?
func (s SampleSummary) aliveAt(p Sighted, t int64) bool {
	if p.Seen == t || s.AliveAtStop[p.PID] {
		return true
	}
	exit, ok := s.Exits[p.PID]
	return ok && exit > t
}

// Empty returns the samples in which nothing matched (e.g. handover gaps).
func (s SampleSummary) Empty() []Sample {
	var out []Sample
	for _, smp := range s.Samples {
		if smp.Err == nil && len(smp.PIDs) == 0 {
			out = append(out, smp)
		}
	}
	return out
}

// GoneByPID is a GoneFunc for processes whose recorded PID is the host PID
// (raw_exec, the lock binary, the singleton driver): the first sample
// without the PID after one with it, from the interval's start on.
//
// Both the pidfd's wake-up and the first scan that misses the process are
// upper bounds on its exit; the earlier one is returned.
func (s SampleSummary) GoneByPID() GoneFunc {
	return func(iv Interval) (int64, bool) {
		end, ok := s.goneAfter(iv.Start, func(smp Sample) bool { return slices.Contains(smp.PIDs, iv.PID) })
		if exit, seen := s.Exits[iv.PID]; seen && exit >= iv.Start && (!ok || exit < end) {
			end, ok = exit, true
		}
		return end, ok
	}
}

// GoneByAlloc is a GoneFunc keyed by allocation ID, for tasks in their own
// PID namespace (exec driver): the first sample without any process of the
// allocation after one with it, from the interval's start on.
func (s SampleSummary) GoneByAlloc() GoneFunc {
	return func(iv Interval) (int64, bool) {
		if iv.AllocID == "" {
			return 0, false
		}
		return s.goneAfter(iv.Start, func(smp Sample) bool { return slices.Contains(smp.Allocs, iv.AllocID) })
	}
}

// LastSeen is the last moment before end at which a scan knew a process of
// alloc alive. An end dated by a scan (GoneByAlloc, for a process in a PID
// namespace of its own) lies somewhere between LastSeen and that end.
func (s SampleSummary) LastSeen(alloc string, end int64) (int64, bool) {
	var last int64
	for _, smp := range s.Samples {
		for _, p := range smp.Procs {
			if p.Owner == alloc && p.Seen < end && p.Seen > last {
				last = p.Seen
			}
		}
	}
	return last, last > 0
}

func (s SampleSummary) goneAfter(start int64, present func(Sample) bool) (int64, bool) {
	seen := false
	for _, smp := range s.Samples {
		if smp.Mono < start || smp.Err != nil {
			continue
		}
		if present(smp) {
			seen = true
		} else if seen {
			return smp.Done, true
		}
	}
	return 0, false
}

// String summarises the sampling for test logs, listing up to five
// violations of "at most one allocation".
func (s SampleSummary) String() string {
	var b strings.Builder
	var span time.Duration
	if n := len(s.Samples); n > 1 {
		span = time.Duration(s.Samples[n-1].Mono - s.Samples[0].Mono)
	}
	pids := map[int]bool{}
	for _, smp := range s.Samples {
		for _, pid := range smp.PIDs {
			pids[pid] = true
		}
	}
	fmt.Fprintf(&b, "%d samples over %s: max %d processes, max %d allocations at once, %d empty, %d scan errors, %d distinct PIDs",
		len(s.Samples), span.Round(time.Millisecond), s.MaxProcs, s.MaxAllocs, len(s.Empty()), s.Errors, len(pids))
	for i, smp := range s.Over(1) {
		if i == 5 {
			b.WriteString("\n  ...")
			break
		}
		fmt.Fprintf(&b, "\n  at %s: pids %v allocs %v", smp.Wall.Format("15:04:05.000"), smp.PIDs, smp.Allocs)
	}
	return b.String()
}
