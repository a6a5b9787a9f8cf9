package harness

import (
	"strconv"
	"testing"
	"time"
)

// CheckNoOverlap fails the test if two workload intervals in recs overlapped
// (a SIGKILLed workload's end comes from the sampler), if the sampler ever
// saw two allocations' workloads at once, or if the fences did not strictly
// increase from one holder to the next (see FenceViolations). It returns the
// intervals.
func CheckNoOverlap(t testing.TB, recs []Record, sum SampleSummary, known ...KnownEnd) []Interval {
	t.Helper()
	return CheckNoOverlapBy(t, recs, sum, sum.GoneByPIDOr(known...))
}

// CheckNoOverlapBy is CheckNoOverlap with the ends gone tells (GoneByAlloc
// for workloads in a PID namespace of their own, whose records' PIDs are
// not the host's).
func CheckNoOverlapBy(t testing.TB, recs []Record, sum SampleSummary, gone GoneFunc) []Interval {
	t.Helper()
	ivs := Intervals(recs, gone)
	for _, o := range Overlaps(ivs) {
		t.Errorf("two workloads overlapped for %s: %+v and %+v", o.For, o.A, o.B)
	}
	if over := sum.Over(1); len(over) > 0 {
		t.Errorf("sampler saw more than one allocation's workload at once in %d samples: %s", len(over), sum)
	}
	CheckFences(t, ivs)
	return ivs
}

// Millis formats a duration in whole milliseconds, for MEASURE lines.
func Millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// Measure logs a greppable `MEASURE name=value` line; durations in ms.
func Measure(t testing.TB, name string, value any) {
	t.Helper()
	if d, ok := value.(time.Duration); ok {
		value = Millis(d)
	}
	t.Logf("MEASURE %s=%v", name, value)
}

// KnownEnd is when the test itself saw a killed workload gone (an upper
// bound on its end): a sampler on a busy machine may not have scanned /proc
// while it lived, and then cannot close its interval.
type KnownEnd struct {
	PID  int
	Mono int64
}

// GoneByPIDOr is GoneByPID combined with the test's own observations. All
// are upper bounds on the end, so the earliest wins.
func (s SampleSummary) GoneByPIDOr(known ...KnownEnd) GoneFunc {
	byPID := s.GoneByPID()
	return func(iv Interval) (int64, bool) {
		end, ok := byPID(iv)
		for _, k := range known {
			if k.PID == iv.PID && k.Mono >= iv.Start && (!ok || k.Mono < end) {
				end, ok = k.Mono, true
			}
		}
		return end, ok
	}
}

// CheckFences fails the test for every FenceViolation in ivs and returns
// how many there were.
func CheckFences(t testing.TB, ivs []Interval) int {
	t.Helper()
	vs := FenceViolations(ivs)
	for _, v := range vs {
		t.Errorf("fencing: %s (from %+v to %+v)", v.Reason, v.From, v.To)
	}
	return len(vs)
}
