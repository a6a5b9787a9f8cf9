package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Variant labels. Every ratio refers to VariantAnchor.
const (
	VariantAnchor = "(a) nomad var lock"
	VariantLock   = "(b) lock"
	VariantDriver = "(c) singleton driver"
	// VariantGate is a gate (a singleton task with config { gate = true })
	// holding the lock for a docker task of its group: handover and crash
	// only.
	VariantGate = "(d) gate + docker app"
	// VariantGateRaw is a gate holding the lock for a raw_exec task: crash
	// only.
	VariantGateRaw = "(e) gate + raw_exec app"
	// VariantLockSlot and VariantDriverSlot hold one slot of a semaphore of
	// SlotHolders (`lock -n`, lock { holders }): semaphore only.
	VariantLockSlot   = "(b) lock -n 2, one slot"
	VariantDriverSlot = "(c) singleton driver, holders = 2, one slot"
	// Baselines: the same workload without any lock.
	VariantRawExec   = "plain raw_exec job"
	VariantPlainExec = "plain process"
	// Scale variants.
	VariantAnchorProcs = "(a) nomad var lock processes"
	VariantLockProcs   = "(b) lock processes"
	VariantLockClient  = "(b) lockclient goroutines"
	// VariantLeaseClient: lockclient leases in lease mode (docs/lease.md).
	VariantLeaseClient = "(b) lockclient goroutines, lease mode"
	// VariantDriverLease and VariantDriverLeaseAggressive: the singleton
	// driver with lock { mode = "lease" } (docs/lease.md), the default and
	// the aggressive profile.
	VariantDriverLease           = "(c) singleton driver, lease mode"
	VariantDriverLeaseAggressive = "(c) singleton driver, lease mode, aggressive"
	// VariantDriverMetrics: the singleton driver with the plugin's
	// metrics_addr set (metrics scenario).
	VariantDriverMetrics = "(c) singleton driver, metrics_addr set"
)

// SlotHolders is N of the semaphore variants (VariantLockSlot,
// VariantDriverSlot).
const SlotHolders = 2

// IsAnchor reports whether a variant label is the anchor of its scenario.
func IsAnchor(variant string) bool {
	return variant == VariantAnchor || variant == VariantAnchorProcs
}

// Unit of a row's values.
type Unit int

// Units.
const (
	Seconds Unit = iota
	MiB
	Count
	PerSecond
	Percent
)

// Format renders one value in the unit.
func (u Unit) Format(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	switch u {
	case Seconds:
		switch a := math.Abs(v); {
		case a < 10:
			return fmt.Sprintf("%.3f s", v)
		case a < 100:
			return fmt.Sprintf("%.2f s", v)
		}
		return fmt.Sprintf("%.1f s", v)
	case MiB:
		if math.Abs(v) < 10 {
			return fmt.Sprintf("%.2f MiB", v)
		}
		return fmt.Sprintf("%.1f MiB", v)
	case PerSecond:
		return fmt.Sprintf("%.1f /s", v)
	case Percent:
		if math.Abs(v) < 1 {
			return fmt.Sprintf("%.2f %%", v)
		}
		return fmt.Sprintf("%.1f %%", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// Agg says how a row's runs are summarised.
type Agg int

// Aggregations.
const (
	// AggStats shows median, min and max.
	AggStats Agg = iota
	// AggSum shows the total over all runs (counts such as losses).
	AggSum
)

// Goal is the target one row is judged against, with what bounds it (the
// Goals table of the report).
type Goal struct {
	// Text is the target as the table shows it, e.g. "< 0.300 s".
	Text string
	// Check is applied to every run's value (AggStats: the goal is met only
	// if every run meets it) or to the total (AggSum).
	Check func(v float64) bool
	// Bound says what limits the number, for the report's goal section.
	Bound string
	// OnMedian applies Check to the median of the runs instead of to each.
	OnMedian bool
}

// Below is a goal "every run < x".
func Below(x float64, u Unit, bound string) *Goal {
	return &Goal{Text: "< " + u.Format(x), Check: func(v float64) bool { return v < x }, Bound: bound}
}

// AtMost is a goal "every run ≤ x".
func AtMost(x float64, u Unit, bound string) *Goal {
	return &Goal{Text: "≤ " + u.Format(x), Check: func(v float64) bool { return v <= x }, Bound: bound}
}

// MedianAtMost is a goal "the median run ≤ x".
func MedianAtMost(x float64, u Unit, bound string) *Goal {
	return &Goal{Text: "median ≤ " + u.Format(x), Check: func(v float64) bool { return v <= x }, Bound: bound, OnMedian: true}
}

// Zero is a goal "the total is 0".
func Zero(bound string) *Goal {
	return &Goal{Text: "0", Check: func(v float64) bool { return v == 0 }, Bound: bound}
}

// Row is one measured quantity of one variant in one scenario.
type Row struct {
	Scenario string // e.g. "1. Graceful handover"
	Metric   string
	Variant  string
	Unit     Unit
	Agg      Agg
	Values   []float64 // one per run; NaN where a run could not measure
	Planned  int       // runs planned; fewer Values means runs failed
	Goal     *Goal
	Note     string
	// Status replaces the numbers, e.g. "not yet: ...".
	Status string
	// NoRatio suppresses the ratio to the anchor (values near zero).
	NoRatio bool
	// Chart, if set, puts the row's ratio in the ratio chart under this
	// (short) label; "\n" breaks it.
	Chart string
}

// Summary of the row's values.
func (r *Row) Summary() Summary { return Summarize(r.Values) }

// Verdict is "met", "NOT met" or "" (no goal, or nothing measured), with the
// number of runs that missed.
func (r *Row) Verdict() string {
	if r.Goal == nil || r.Status != "" {
		return ""
	}
	s := r.Summary()
	if s.N == 0 {
		return "NOT met (no data)"
	}
	if r.Agg == AggSum {
		if r.Goal.Check(s.Sum) {
			return "met"
		}
		return "NOT met"
	}
	if r.Goal.OnMedian {
		if r.Goal.Check(s.Median) {
			return "met"
		}
		return "NOT met (median)"
	}
	miss := 0
	for _, v := range r.Values {
		if !math.IsNaN(v) && !r.Goal.Check(v) {
			miss++
		}
	}
	switch {
	case miss > 0:
		return fmt.Sprintf("NOT met (%d of %d runs)", miss, s.N)
	case s.N < r.Planned:
		return fmt.Sprintf("met (%d of %d runs measured)", s.N, r.Planned)
	}
	return "met"
}

// Met reports whether the goal was met.
func (r *Row) Met() bool { return strings.HasPrefix(r.Verdict(), "met") }

func (r *Row) key() string { return r.Scenario + "\x00" + r.Metric }

// Report collects rows from concurrently running scenarios and renders them.
type Report struct {
	mu        sync.Mutex
	Config    Config
	Machine   Machine
	Started   time.Time
	Took      time.Duration
	rows      []*Row
	timelines []Timeline
	notes     []string
}

// NewReport starts an empty report.
func NewReport(cfg Config, m Machine, started time.Time) *Report {
	return &Report{Config: cfg, Machine: m, Started: started}
}

// Add appends a row.
func (rep *Report) Add(r *Row) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.rows = append(rep.rows, r)
}

// AddTimeline keeps a timeline for the picture.
func (rep *Report) AddTimeline(tl Timeline) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.timelines = append(rep.timelines, tl)
}

// Note records an observation for the report (failures, surprises).
func (rep *Report) Note(format string, args ...any) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.notes = append(rep.notes, fmt.Sprintf(format, args...))
}

// Rows returns the rows sorted by scenario, in insertion order within one.
func (rep *Report) Rows() []*Row {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	out := slices.Clone(rep.rows)
	slices.SortStableFunc(out, func(a, b *Row) int { return strings.Compare(a.Scenario, b.Scenario) })
	return out
}

// Timelines returns the timelines, sorted by title.
func (rep *Report) Timelines() []Timeline {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	out := slices.Clone(rep.timelines)
	slices.SortFunc(out, func(a, b Timeline) int { return strings.Compare(a.Title, b.Title) })
	return out
}

// Notes returns the recorded observations.
func (rep *Report) Notes() []string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return slices.Clone(rep.notes)
}

// anchorOf finds the anchor row of the same scenario and metric.
func anchorOf(rows []*Row, r *Row) *Row {
	for _, o := range rows {
		if o.key() == r.key() && IsAnchor(o.Variant) {
			return o
		}
	}
	return nil
}

// Ratio is the row's median over its anchor's median.
func Ratio(rows []*Row, r *Row) (float64, bool) {
	if r.Agg != AggStats || r.Status != "" || r.NoRatio {
		return 0, false
	}
	a := anchorOf(rows, r)
	if a == nil || a == r {
		return 0, false
	}
	am, rm := a.Summary().Median, r.Summary().Median
	if math.IsNaN(am) || math.IsNaN(rm) || am == 0 {
		return 0, false
	}
	return rm / am, true
}

func ratioCell(rows []*Row, r *Row) string {
	if IsAnchor(r.Variant) && r.Agg == AggStats && r.Status == "" && !r.NoRatio && r.Summary().N > 0 {
		if anchorOf(rows, r) == r {
			// Only an anchor with others to compare is worth the label.
			for _, o := range rows {
				if o != r && o.key() == r.key() {
					return "1 (anchor)"
				}
			}
		}
		return ""
	}
	if x, ok := Ratio(rows, r); ok {
		return formatRatio(x)
	}
	return ""
}

func formatRatio(x float64) string {
	switch {
	case x < 0.01:
		return fmt.Sprintf("%.4f×", x)
	case x < 0.1:
		return fmt.Sprintf("%.3f×", x)
	case x < 10:
		return fmt.Sprintf("%.2f×", x)
	}
	return fmt.Sprintf("%.0f×", x)
}

// cells renders one row's table cells: metric, variant, runs, median, min,
// max, ratio, goal.
func cells(rows []*Row, r *Row) []string {
	s := r.Summary()
	runs := fmt.Sprint(s.N)
	if r.Planned > 0 && s.N != r.Planned {
		runs = fmt.Sprintf("%d of %d", s.N, r.Planned)
	}
	median, lo, hi := r.Unit.Format(s.Median), r.Unit.Format(s.Min), r.Unit.Format(s.Max)
	if r.Agg == AggSum {
		median, lo, hi = "total "+r.Unit.Format(s.Sum), "", ""
	}
	if r.Status != "" {
		runs, median, lo, hi = "", r.Status, "", ""
	}
	goal := ""
	if r.Goal != nil {
		goal = r.Goal.Text
		if v := r.Verdict(); v != "" {
			goal += ": " + v
		}
	}
	metric := r.Metric
	if r.Note != "" {
		metric += " (" + r.Note + ")"
	}
	return []string{metric, r.Variant, runs, median, lo, hi, ratioCell(rows, r), goal}
}

var tableHeader = []string{"metric", "variant", "runs", "median", "min", "max", "vs (a)", "goal"}

// scenarios returns the distinct scenario names in order.
func scenarios(rows []*Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Scenario) {
			out = append(out, r.Scenario)
		}
	}
	return out
}

// Text renders the table for a terminal: one block per scenario, columns
// aligned.
func (rep *Report) Text() string {
	rows := rep.Rows()
	var b strings.Builder
	for _, sc := range scenarios(rows) {
		var table [][]string
		table = append(table, tableHeader)
		for _, r := range rows {
			if r.Scenario == sc {
				table = append(table, cells(rows, r))
			}
		}
		fmt.Fprintf(&b, "\n%s\n", sc)
		widths := make([]int, len(tableHeader))
		for _, row := range table {
			for i, c := range row {
				widths[i] = max(widths[i], len([]rune(c)))
			}
		}
		for i, row := range table {
			var line strings.Builder
			for j, c := range row {
				pad := widths[j] - len([]rune(c))
				if j >= 2 && j <= 6 { // numbers: right-aligned
					line.WriteString(strings.Repeat(" ", pad) + c)
				} else {
					line.WriteString(c + strings.Repeat(" ", pad))
				}
				if j < len(row)-1 {
					line.WriteString("  ")
				}
			}
			b.WriteString("  " + strings.TrimRight(line.String(), " ") + "\n")
			if i == 0 {
				total := 0
				for _, w := range widths {
					total += w + 2
				}
				b.WriteString("  " + strings.Repeat("-", total-2) + "\n")
			}
		}
	}
	return b.String()
}

// GoalLines summarises every goal: met or not, with the median and worst run.
func (rep *Report) GoalLines() []string {
	var out []string
	for _, r := range rep.Rows() {
		if r.Goal == nil && r.Status == "" {
			continue
		}
		if r.Status != "" {
			out = append(out, fmt.Sprintf("%s / %s / %s: %s", r.Scenario, r.Metric, r.Variant, r.Status))
			continue
		}
		out = append(out, fmt.Sprintf("%s / %s / %s: goal %s: %s (%s)",
			r.Scenario, r.Metric, r.Variant, r.Goal.Text, r.Verdict(), measuredText(r)))
	}
	return out
}

func measuredText(r *Row) string {
	s := r.Summary()
	if r.Agg == AggSum {
		return fmt.Sprintf("total %s over %d runs", r.Unit.Format(s.Sum), s.N)
	}
	return fmt.Sprintf("median %s, worst %s", r.Unit.Format(s.Median), r.Unit.Format(worst(r)))
}

// worst is the run furthest from meeting the goal: the max for "below"
// goals, which all of ours are.
func worst(r *Row) float64 { return r.Summary().Max }

// mdEscape makes a cell safe inside a Markdown table.
func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
