package harness

import (
	"fmt"
	"sort"
	"testing"
)

// A semaphore of N slots (`lock -n N`, the driver's lock.holders): each
// workload's NOMAD_LOCK_PATH (Interval.LockPath) is its slot's lock. Its
// records must show at most N workloads at once, never two on one slot,
// and fences that strictly increase per slot.

// MaxConcurrent is the largest number of intervals that ran at one time,
// and the first moment (Mono) it was reached. An open interval runs
// forever; an interval that ends when another starts does not overlap it.
func MaxConcurrent(ivs []Interval) (most int, at int64) {
	type edge struct {
		mono  int64
		delta int
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.Start, +1})
		if iv.Ended {
			edges = append(edges, edge{max(iv.End, iv.Start), -1})
		}
	}
	// Ends before starts at the same moment: touching is not overlapping.
	sort.SliceStable(edges, func(i, j int) bool {
		return edges[i].mono < edges[j].mono || edges[i].mono == edges[j].mono && edges[i].delta < edges[j].delta
	})
	cur := 0
	for _, e := range edges {
		cur += e.delta
		if cur > most {
			most, at = cur, e.mono
		}
	}
	return most, at
}

// SlotOverlaps are the overlapping pairs of intervals on the same slot
// (the same LockPath).
func SlotOverlaps(ivs []Interval) []Overlap {
	var out []Overlap
	for _, slot := range slotsOf(ivs) {
		out = append(out, Overlaps(slot)...)
	}
	return out
}

// slotsOf groups intervals by LockPath, in the order of the paths.
func slotsOf(ivs []Interval) [][]Interval {
	by := map[string][]Interval{}
	var paths []string
	for _, iv := range ivs {
		if _, ok := by[iv.LockPath]; !ok {
			paths = append(paths, iv.LockPath)
		}
		by[iv.LockPath] = append(by[iv.LockPath], iv)
	}
	sort.Strings(paths)
	out := make([][]Interval, 0, len(paths))
	for _, p := range paths {
		out = append(out, by[p])
	}
	return out
}

// SemaphoreViolations is what breaks a semaphore of n slots in ivs: more
// than n workloads at once, two workloads on one slot, a slot's fence that
// did not strictly increase. Empty for a sound record set.
func SemaphoreViolations(ivs []Interval, n int) []string {
	var out []string
	if most, at := MaxConcurrent(ivs); most > n {
		var open []string
		for _, iv := range ivs {
			if iv.Start <= at && (!iv.Ended || iv.End > at) {
				open = append(open, fmt.Sprintf("pid %d of %s on %s", iv.PID, short(iv.AllocID), iv.LockPath))
			}
		}
		out = append(out, fmt.Sprintf("%d workloads ran at once (at most %d allowed) at mono %d: %v", most, n, at, open))
	}
	for _, o := range SlotOverlaps(ivs) {
		out = append(out, fmt.Sprintf("two workloads on slot %s at once for %s: pid %d of %s and pid %d of %s",
			o.A.LockPath, o.For, o.A.PID, short(o.A.AllocID), o.B.PID, short(o.B.AllocID)))
	}
	for _, slot := range slotsOf(ivs) {
		for _, v := range FenceViolations(slot) {
			out = append(out, fmt.Sprintf("slot %s: fencing: %s", v.To.LockPath, v.Reason))
		}
	}
	return out
}

// CheckSemaphore fails the test for every SemaphoreViolations of the
// workloads' records (a SIGKILLed workload's end comes from the sampler or
// known), and if the sampler ever saw more than n allocations' workloads
// at once. It returns the intervals.
func CheckSemaphore(t testing.TB, recs []Record, sum SampleSummary, n int, known ...KnownEnd) []Interval {
	t.Helper()
	ivs := Intervals(recs, sum.GoneByPIDOr(known...))
	for _, v := range SemaphoreViolations(ivs, n) {
		t.Errorf("semaphore of %d: %s", n, v)
	}
	if over := sum.Over(n); len(over) > 0 {
		t.Errorf("the sampler saw more than %d allocations' workloads at once in %d samples: %s", n, len(over), sum)
	}
	return ivs
}
