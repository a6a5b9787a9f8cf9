package harness

import (
	"strings"
	"testing"
	"time"
)

func TestSemaphoreViolations(t *testing.T) {
	const s = int64(time.Second)
	// slotRec is a main-role record of alloc on slot.
	slotRec := func(event string, pid int, mono int64, alloc, slot, fence string) Record {
		r := rec(event, RoleMain, pid, mono, alloc)
		r.LockPath, r.Fence = "sem/slot-"+slot, fence
		return r
	}
	tests := []struct {
		name string
		n    int
		recs []Record
		gone map[int]int64
		want []string // a substring of each violation, in order; none for a sound set
	}{
		{
			name: "two slots handed over cleanly",
			n:    2,
			recs: []Record{
				slotRec("start", 1, 1*s, "a", "0", "10"), slotRec("start", 2, 1*s, "b", "1", "11"),
				slotRec("stop", 1, 3*s, "a", "0", ""), slotRec("start", 3, 3*s, "c", "0", "12"),
				slotRec("stop", 2, 4*s, "b", "1", ""), slotRec("start", 4, 5*s, "d", "1", "13"),
			},
		},
		{
			name: "a workload killed without a record ends when it was seen gone",
			n:    1,
			recs: []Record{slotRec("start", 1, 1*s, "a", "0", "10"), slotRec("start", 2, 5*s, "b", "0", "11")},
			gone: map[int]int64{1: 4 * s},
		},
		{
			name: "three at once on three slots of a semaphore of two",
			n:    2,
			recs: []Record{
				slotRec("start", 1, 1*s, "a", "0", "10"), slotRec("start", 2, 2*s, "b", "1", "11"),
				slotRec("start", 3, 3*s, "c", "2", "12"), slotRec("stop", 1, 4*s, "a", "0", ""),
			},
			want: []string{"3 workloads ran at once (at most 2 allowed)"},
		},
		{
			name: "two on one slot, though never more than n",
			n:    2,
			recs: []Record{
				slotRec("start", 1, 1*s, "a", "0", "10"), slotRec("start", 2, 2*s, "b", "0", "11"),
				slotRec("stop", 1, 3*s, "a", "0", ""), slotRec("stop", 2, 4*s, "b", "0", ""),
			},
			want: []string{"two workloads on slot sem/slot-0 at once for 1s"},
		},
		{
			name: "a SIGKILLed holder never seen gone runs on",
			n:    1,
			recs: []Record{slotRec("start", 1, 1*s, "a", "0", "10"), slotRec("start", 2, 5*s, "b", "0", "11")},
			want: []string{"2 workloads ran at once", "two workloads on slot sem/slot-0"},
		},
		{
			name: "a slot's fence went back, another slot's lower fence is fine",
			n:    2,
			recs: []Record{
				slotRec("start", 1, 1*s, "a", "0", "20"), slotRec("start", 2, 1*s, "b", "1", "5"),
				slotRec("stop", 1, 2*s, "a", "0", ""), slotRec("start", 3, 3*s, "c", "0", "19"),
			},
			want: []string{"slot sem/slot-0: fencing: fence went from 20"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := SemaphoreViolations(Intervals(tc.recs, goneFromMap(tc.gone)), tc.n)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d violations %q, want %d like %q", len(got), got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("violation %d: %q, want it to contain %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestMaxConcurrent(t *testing.T) {
	const s = int64(time.Second)
	iv := func(start, end int64) Interval { return Interval{Start: start, End: end, Ended: end != 0} }
	for _, tc := range []struct {
		name     string
		ivs      []Interval
		most     int
		mostAtMo int64
	}{
		{"none", nil, 0, 0},
		{"touching is not concurrent", []Interval{iv(1*s, 2*s), iv(2*s, 3*s), iv(3*s, 4*s)}, 1, 1 * s},
		{"nested", []Interval{iv(1*s, 9*s), iv(2*s, 3*s), iv(2*s, 8*s)}, 3, 2 * s},
		{"open intervals run on", []Interval{iv(1*s, 0), iv(2*s, 3*s), iv(5*s, 0)}, 2, 2 * s},
	} {
		if most, at := MaxConcurrent(tc.ivs); most != tc.most || at != tc.mostAtMo {
			t.Errorf("%s: MaxConcurrent = %d at %d, want %d at %d", tc.name, most, at, tc.most, tc.mostAtMo)
		}
	}
}
