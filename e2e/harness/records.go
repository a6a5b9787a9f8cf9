package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"
)

// Record events written by e2e/testworkload.
const (
	EventStart  = "start"  // process started
	EventStop   = "stop"   // SIGTERM/SIGINT received; exiting 0
	EventSignal = "signal" // another signal (or an ignored SIGTERM/SIGINT)
	EventExit   = "exit"   // exiting on its own (-exit)
)

// Record roles written by e2e/testworkload.
const (
	RoleMain  = "main"  // the process the supervisor started
	RoleChild = "child" // a grandchild started by -children
)

// Record is one line of a testworkload record file.
type Record struct {
	Event string `json:"event"`
	// Instance is random per process. Pair records by it: PID is the PID in
	// the process's own PID namespace (1 under the exec driver).
	Instance string    `json:"instance"`
	Mono     int64     `json:"mono"` // CLOCK_MONOTONIC ns, comparable with MonoNow and Sample.Mono
	Wall     time.Time `json:"wall"`
	PID      int       `json:"pid"`
	PPID     int       `json:"ppid"`
	PGID     int       `json:"pgid"`
	Role     string    `json:"role"`
	AllocID  string    `json:"alloc_id"`  // NOMAD_ALLOC_ID
	Fence    string    `json:"fence"`     // NOMAD_LOCK_FENCE
	LockPath string    `json:"lock_path"` // NOMAD_LOCK_PATH
	Signal   string    `json:"signal"`    // e.g. SIGTERM (stop and signal events)
	Ignored  bool      `json:"ignored"`   // a SIGTERM/SIGINT ignored under -ignore-term
	Code     *int      `json:"code"`      // exit code (stop and exit events)
	Argv     []string  `json:"argv"`
}

// ReadRecords parses a record file. A file that does not exist yet holds no
// records (nil, nil), so callers can poll it; a malformed line is an error.
// A last line without its newline is a record being written (the workload
// writes each line, newline last, in one write, which a concurrent read may
// see half done): it is left for the next read.
func ReadRecords(path string) ([]Record, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	var out []Record
	for n, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n+1, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// WaitRecord polls the record file until a record satisfies match, and returns
// it. The test fails after timeout, listing the records seen.
func WaitRecord(t testing.TB, path string, timeout time.Duration, match func(Record) bool) Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs, err := ReadRecords(path)
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		for _, r := range recs {
			if match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: no matching record in %s after %s; records:\n%s", path, timeout, formatRecords(recs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func formatRecords(recs []Record) string {
	if len(recs) == 0 {
		return "  (none)"
	}
	var s string
	for _, r := range recs {
		s += fmt.Sprintf("  %s %s instance=%s pid=%d role=%s alloc=%s fence=%s signal=%s\n",
			r.Wall.Format("15:04:05.000"), r.Event, r.Instance, r.PID, r.Role, short(r.AllocID), r.Fence, r.Signal)
	}
	return s
}

// Interval is the lifetime of one main-role workload process.
type Interval struct {
	Instance string
	PID      int // as recorded: not the host PID under the exec driver
	AllocID  string
	Fence    string
	LockPath string // NOMAD_LOCK_PATH: a semaphore's slot
	Start    int64  // Mono of the start record
	End      int64  // Mono of the end; meaningless when !Ended
	Ended    bool
	// EndedBy is "stop" or "exit" (from a record), "observed" (from the
	// GoneFunc passed to Intervals: killed without a record) or "" (open).
	EndedBy string
}

// Duration of the interval, or -1 if it has not ended.
func (iv Interval) Duration() time.Duration {
	if !iv.Ended {
		return -1
	}
	return time.Duration(iv.End - iv.Start)
}

// GoneFunc tells when a process that wrote no end record (SIGKILL) was
// observed gone, as CLOCK_MONOTONIC ns. See SampleSummary.GoneByPID and
// SampleSummary.GoneByAlloc.
type GoneFunc func(Interval) (mono int64, ok bool)

// Intervals pairs each main-role start with the same process's stop or exit
// record. A process killed by SIGKILL writes no end record: its end comes
// from gone (may be nil); failing that, the interval stays open (still
// running, or unknown). The result is sorted by start time.
func Intervals(recs []Record, gone GoneFunc) []Interval {
	open := map[string]int{} // instance → index of its open interval
	var out []Interval
	sorted := append([]Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Mono < sorted[j].Mono })
	for _, r := range sorted {
		if r.Role != RoleMain {
			continue
		}
		switch r.Event {
		case EventStart:
			open[r.Instance] = len(out)
			out = append(out, Interval{Instance: r.Instance, PID: r.PID, AllocID: r.AllocID, Fence: r.Fence, LockPath: r.LockPath, Start: r.Mono})
		case EventStop, EventExit:
			if i, ok := open[r.Instance]; ok {
				out[i].End, out[i].Ended, out[i].EndedBy = r.Mono, true, r.Event
				delete(open, r.Instance)
			}
		}
	}
	if gone != nil {
		for _, i := range open {
			if end, ok := gone(out[i]); ok && end >= out[i].Start {
				out[i].End, out[i].Ended, out[i].EndedBy = end, true, "observed"
			}
		}
	}
	return out
}

// Overlap is a pair of intervals that ran at the same time.
type Overlap struct {
	A, B Interval
	// For is how long they overlapped; -1 if one is still open.
	For time.Duration
}

// Overlaps returns every pair of intervals of different processes that ran
// at the same time. An open interval extends forever. For a singleton this
// must be empty.
func Overlaps(ivs []Interval) []Overlap {
	var out []Overlap
	for i := range ivs {
		for j := i + 1; j < len(ivs); j++ {
			a, b := ivs[i], ivs[j]
			if a.Instance == b.Instance {
				continue
			}
			aEndsFirst := a.Ended && (!b.Ended || a.End <= b.End)
			end, ended := b.End, b.Ended
			if aEndsFirst {
				end, ended = a.End, true
			}
			start := max(a.Start, b.Start)
			if ended && end <= start {
				continue // disjoint (touching counts as disjoint)
			}
			o := Overlap{A: a, B: b, For: -1}
			if ended {
				o.For = time.Duration(end - start)
			}
			out = append(out, o)
		}
	}
	return out
}

// Handover is the passage from one interval to the next, in start order.
type Handover struct {
	From, To Interval
	// Gap is To.Start - From.End: the time nothing ran. It is negative when
	// they overlapped, and meaningless when From has not ended (Overlap).
	Gap time.Duration
	// Overlap is true when To started before From ended (or From never did).
	Overlap bool
}

// Handovers lists the transitions between consecutive intervals (sorted by
// start), e.g. to assert that takeover after a stop took less than 5s.
func Handovers(ivs []Interval) []Handover {
	sorted := append([]Interval(nil), ivs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	var out []Handover
	for i := 1; i < len(sorted); i++ {
		from, to := sorted[i-1], sorted[i]
		h := Handover{From: from, To: to}
		if from.Ended {
			h.Gap = time.Duration(to.Start - from.End)
			h.Overlap = h.Gap < 0
		} else {
			h.Overlap = true
		}
		out = append(out, h)
	}
	return out
}

// FenceViolation is a handover in start order where the new holder's
// NOMAD_LOCK_FENCE did not strictly exceed the previous holder's.
type FenceViolation struct {
	From, To Interval
	Reason   string
}

// FenceViolations checks the fencing tokens of successive holders: taken in
// start order, every interval of a new holder (a different allocation, or
// the same allocation under a new acquisition) must carry a fence strictly
// greater than the previous holder's. A fence that is not a positive integer
// is a violation too. Intervals with no fence at all (a workload run without
// a lock, e.g. raw_exec baselines) are skipped. Consecutive intervals of the
// same allocation with the same fence are one holder and are not compared.
func FenceViolations(ivs []Interval) []FenceViolation {
	sorted := append([]Interval(nil), ivs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	var out []FenceViolation
	var prev *Interval
	var prevFence uint64
	for i := range sorted {
		iv := sorted[i]
		if iv.Fence == "" {
			continue
		}
		f, err := strconv.ParseUint(iv.Fence, 10, 64)
		if err != nil || f == 0 {
			out = append(out, FenceViolation{To: iv, Reason: fmt.Sprintf("fence %q is not a positive integer", iv.Fence)})
			continue
		}
		if prev != nil && !(prev.AllocID == iv.AllocID && prev.Fence == iv.Fence) && f <= prevFence {
			out = append(out, FenceViolation{From: *prev, To: iv,
				Reason: fmt.Sprintf("fence went from %d (alloc %s) to %d (alloc %s): not strictly increasing", prevFence, short(prev.AllocID), f, short(iv.AllocID))})
		}
		prev, prevFence = &sorted[i], f
	}
	return out
}
