package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// rec builds a record whose instance is derived from alloc and pid.
func rec(event, role string, pid int, mono int64, alloc string) Record {
	return Record{Event: event, Instance: fmt.Sprintf("%s-%d", alloc, pid), Role: role, PID: pid, Mono: mono, AllocID: alloc}
}

func goneFromMap(m map[int]int64) GoneFunc {
	if m == nil {
		return nil
	}
	return func(iv Interval) (int64, bool) {
		v, ok := m[iv.PID]
		return v, ok
	}
}

func TestIntervals(t *testing.T) {
	const s = int64(time.Second)
	tests := []struct {
		name   string
		recs   []Record
		goneAt map[int]int64
		want   []Interval
	}{
		{
			name: "start and stop",
			recs: []Record{rec("start", RoleMain, 10, 1*s, "a"), rec("stop", RoleMain, 10, 3*s, "a")},
			want: []Interval{{PID: 10, AllocID: "a", Start: 1 * s, End: 3 * s, Ended: true, EndedBy: "stop"}},
		},
		{
			name: "exit ends an interval",
			recs: []Record{rec("start", RoleMain, 10, 1*s, "a"), rec("exit", RoleMain, 10, 2*s, "a")},
			want: []Interval{{PID: 10, AllocID: "a", Start: 1 * s, End: 2 * s, Ended: true, EndedBy: "exit"}},
		},
		{
			name: "signal does not end it, killed process stays open",
			recs: []Record{rec("start", RoleMain, 10, 1*s, "a"), rec("signal", RoleMain, 10, 2*s, "a")},
			want: []Interval{{PID: 10, AllocID: "a", Start: 1 * s}},
		},
		{
			name:   "observed end for a SIGKILLed process",
			recs:   []Record{rec("start", RoleMain, 10, 1*s, "a")},
			goneAt: map[int]int64{10: 4 * s},
			want:   []Interval{{PID: 10, AllocID: "a", Start: 1 * s, End: 4 * s, Ended: true, EndedBy: "observed"}},
		},
		{
			name:   "observation older than the start is ignored (PID reuse)",
			recs:   []Record{rec("start", RoleMain, 10, 5*s, "b")},
			goneAt: map[int]int64{10: 4 * s},
			want:   []Interval{{PID: 10, AllocID: "b", Start: 5 * s}},
		},
		{
			name: "same PID in two PID namespaces: paired by instance",
			recs: []Record{
				rec("start", RoleMain, 1, 1*s, "a"),
				rec("start", RoleMain, 1, 2*s, "b"),
				rec("stop", RoleMain, 1, 3*s, "a"),
			},
			want: []Interval{
				{PID: 1, AllocID: "a", Start: 1 * s, End: 3 * s, Ended: true, EndedBy: "stop"},
				{PID: 1, AllocID: "b", Start: 2 * s},
			},
		},
		{
			name: "children are ignored, unsorted input is sorted",
			recs: []Record{
				rec("stop", RoleMain, 20, 9*s, "b"),
				rec("start", RoleChild, 11, 2*s, "a"),
				rec("start", RoleMain, 20, 6*s, "b"),
				rec("start", RoleMain, 10, 1*s, "a"),
				rec("stop", RoleMain, 10, 5*s, "a"),
			},
			want: []Interval{
				{PID: 10, AllocID: "a", Start: 1 * s, End: 5 * s, Ended: true, EndedBy: "stop"},
				{PID: 20, AllocID: "b", Start: 6 * s, End: 9 * s, Ended: true, EndedBy: "stop"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Intervals(tc.recs, goneFromMap(tc.goneAt))
			for i := range got {
				got[i].Instance = "" // checked in the PID-namespace case below
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d intervals %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("interval %d: got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestOverlapsAndHandovers(t *testing.T) {
	const s = int64(time.Second)
	iv := func(pid int, start, end int64) Interval {
		return Interval{Instance: fmt.Sprint(pid), PID: pid, Start: start, End: end, Ended: end != 0}
	}
	tests := []struct {
		name         string
		ivs          []Interval
		wantOverlaps []time.Duration // Overlap.For of each overlap, in order
		wantGaps     []time.Duration // Handover.Gap of each handover
		wantOverlap  []bool          // Handover.Overlap of each handover
	}{
		{
			name:        "clean handover",
			ivs:         []Interval{iv(1, 1*s, 3*s), iv(2, 4*s, 6*s)},
			wantGaps:    []time.Duration{time.Second},
			wantOverlap: []bool{false},
		},
		{
			name:        "touching is not overlapping",
			ivs:         []Interval{iv(1, 1*s, 3*s), iv(2, 3*s, 6*s)},
			wantGaps:    []time.Duration{0},
			wantOverlap: []bool{false},
		},
		{
			name:         "overlap",
			ivs:          []Interval{iv(2, 2*s, 6*s), iv(1, 1*s, 3*s)},
			wantOverlaps: []time.Duration{time.Second},
			wantGaps:     []time.Duration{-time.Second},
			wantOverlap:  []bool{true},
		},
		{
			name:         "open interval overlaps everything after it",
			ivs:          []Interval{iv(1, 1*s, 0), iv(2, 5*s, 6*s)},
			wantOverlaps: []time.Duration{time.Second},
			wantGaps:     []time.Duration{0},
			wantOverlap:  []bool{true},
		},
		{
			name:         "two open intervals",
			ivs:          []Interval{iv(1, 1*s, 0), iv(2, 5*s, 0)},
			wantOverlaps: []time.Duration{-1},
			wantGaps:     []time.Duration{0},
			wantOverlap:  []bool{true},
		},
		{
			name:        "same instance never overlaps itself",
			ivs:         []Interval{iv(1, 1*s, 0), iv(1, 5*s, 6*s)},
			wantGaps:    []time.Duration{0},
			wantOverlap: []bool{true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ovs := Overlaps(tc.ivs)
			if len(ovs) != len(tc.wantOverlaps) {
				t.Fatalf("got %d overlaps %+v, want %d", len(ovs), ovs, len(tc.wantOverlaps))
			}
			for i, o := range ovs {
				if o.For != tc.wantOverlaps[i] {
					t.Errorf("overlap %d: For=%s, want %s", i, o.For, tc.wantOverlaps[i])
				}
			}
			hs := Handovers(tc.ivs)
			if len(hs) != len(tc.wantGaps) {
				t.Fatalf("got %d handovers, want %d", len(hs), len(tc.wantGaps))
			}
			for i, h := range hs {
				if h.Overlap != tc.wantOverlap[i] {
					t.Errorf("handover %d: Overlap=%t, want %t", i, h.Overlap, tc.wantOverlap[i])
				}
				if !h.Overlap || h.From.Ended {
					if h.Gap != tc.wantGaps[i] {
						t.Errorf("handover %d: Gap=%s, want %s", i, h.Gap, tc.wantGaps[i])
					}
				}
			}
		})
	}
}

func TestReadRecords(t *testing.T) {
	dir := t.TempDir()
	missing, err := ReadRecords(filepath.Join(dir, "missing"))
	if err != nil || missing != nil {
		t.Fatalf("missing file: got %v, %v; want nil, nil", missing, err)
	}
	good := filepath.Join(dir, "good")
	content := `{"event":"start","mono":5,"wall":"2026-01-02T03:04:05.5Z","pid":7,"role":"main","alloc_id":"x","fence":"42","argv":["a","b c"]}` + "\n\n" +
		`{"event":"stop","mono":9,"wall":"2026-01-02T03:04:06Z","pid":7,"role":"main","signal":"SIGTERM","code":0,"argv":["a"]}` + "\n"
	if err := os.WriteFile(good, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadRecords(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Fence != "42" || recs[0].Argv[1] != "b c" || recs[1].Code == nil || *recs[1].Code != 0 {
		t.Fatalf("unexpected records: %+v", recs)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("{\"event\":\"start\"}\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecords(bad); err == nil {
		t.Fatal("malformed line: want an error")
	}
	// A record half written when the file is read: the lines before it.
	writing := filepath.Join(dir, "writing")
	if err := os.WriteFile(writing, []byte(content+`{"event":"start","mono":12,"pid"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if recs, err := ReadRecords(writing); err != nil || len(recs) != 2 {
		t.Fatalf("a record being written: got %d records, %v; want the 2 before it", len(recs), err)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	tests := map[string]string{
		`/plain`:             "/plain",
		`/with\040space`:     "/with space",
		`/tab\011and\134bs`:  "/tab\tand\\bs",
		`/trailing\04`:       `/trailing\04`,
		`/not\999octal\040x`: `/not\999octal x`,
	}
	for in, want := range tests {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestGoneFuncs(t *testing.T) {
	smp := func(mono int64, pids []int, allocs ...string) Sample {
		return Sample{Mono: mono, Done: mono, PIDs: pids, Allocs: allocs}
	}
	sum := SampleSummary{Samples: []Sample{
		smp(10, []int{5}, "a"),
		smp(20, []int{5, 6}, "a", "b"),
		smp(30, []int{6}, "b"),
		{Mono: 40, Err: fmt.Errorf("scan failed")},
		smp(50, nil),
		smp(60, []int{5}, "c"), // PID 5 reused by another allocation
		smp(70, nil),
	}}
	tests := []struct {
		name   string
		gone   GoneFunc
		iv     Interval
		want   int64
		wantOK bool
	}{
		{"pid gone", sum.GoneByPID(), Interval{PID: 5, Start: 5}, 30, true},
		{"pid gone, error sample skipped", sum.GoneByPID(), Interval{PID: 6, Start: 15}, 50, true},
		{"reused pid: later life", sum.GoneByPID(), Interval{PID: 5, Start: 55}, 70, true},
		{"never seen", sum.GoneByPID(), Interval{PID: 7, Start: 0}, 0, false},
		{"alloc gone", sum.GoneByAlloc(), Interval{AllocID: "b", Start: 15}, 50, true},
		{"alloc still there at the end", SampleSummary{Samples: sum.Samples[:2]}.GoneByAlloc(), Interval{AllocID: "a", Start: 0}, 0, false},
		{"no alloc ID", sum.GoneByAlloc(), Interval{PID: 5}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.gone(tc.iv)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("got %d, %t; want %d, %t", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestFenceViolations(t *testing.T) {
	iv := func(alloc, fence string, start int64) Interval {
		return Interval{Instance: alloc + fence + fmt.Sprint(start), AllocID: alloc, Fence: fence, Start: start, End: start + 1, Ended: true}
	}
	tests := []struct {
		name string
		ivs  []Interval
		want int
	}{
		{"increasing", []Interval{iv("a", "10", 1), iv("b", "12", 3), iv("a", "20", 5)}, 0},
		{"start order, not slice order", []Interval{iv("b", "12", 3), iv("a", "10", 1)}, 0},
		{"equal across holders", []Interval{iv("a", "10", 1), iv("b", "10", 3)}, 1},
		{"decreasing", []Interval{iv("a", "10", 1), iv("b", "9", 3)}, 1},
		{"same alloc new acquisition must grow", []Interval{iv("a", "10", 1), iv("a", "5", 3)}, 1},
		{"same holder twice is one holder", []Interval{iv("a", "10", 1), iv("a", "10", 3)}, 0},
		{"numeric, not lexical", []Interval{iv("a", "9", 1), iv("b", "10", 3)}, 0},
		{"garbage fence", []Interval{iv("a", "x", 1)}, 1},
		{"zero fence", []Interval{iv("a", "0", 1)}, 1},
		{"no fence skipped", []Interval{iv("a", "10", 1), iv("raw", "", 2), iv("b", "11", 3)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FenceViolations(tt.ivs); len(got) != tt.want {
				t.Errorf("%d violations, want %d: %+v", len(got), tt.want, got)
			}
		})
	}
}
