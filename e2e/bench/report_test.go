package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Unit tests of the report, statistics, configuration and pictures. They
// need no agent and run with `go test ./...` in e2e/.

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{3, 1, math.NaN(), 2, 10})
	if s.N != 4 || s.Median != 2.5 || s.Min != 1 || s.Max != 10 || s.Sum != 16 {
		t.Errorf("Summarize = %+v", s)
	}
	if s := Summarize([]float64{5, 1, 3}); s.Median != 3 {
		t.Errorf("odd median = %v, want 3", s.Median)
	}
	if s := Summarize([]float64{math.NaN()}); s.N != 0 || !math.IsNaN(s.Median) {
		t.Errorf("all-NaN = %+v", s)
	}
}

func TestVerdictAndRatio(t *testing.T) {
	goal := Below(0.3, Seconds, "bound")
	anchor := &Row{Scenario: "s", Metric: "m", Variant: VariantAnchor, Values: []float64{8, 9, 10}, Planned: 3}
	ok := &Row{Scenario: "s", Metric: "m", Variant: VariantLock, Values: []float64{0.1, 0.2, 0.25}, Planned: 3, Goal: goal}
	miss := &Row{Scenario: "s", Metric: "m", Variant: VariantDriver, Values: []float64{0.1, 0.4, math.NaN()}, Planned: 3, Goal: goal}
	rows := []*Row{anchor, ok, miss}
	if v := ok.Verdict(); v != "met" {
		t.Errorf("ok verdict %q", v)
	}
	if v := miss.Verdict(); v != "NOT met (1 of 2 runs)" {
		t.Errorf("miss verdict %q", v)
	}
	if x, good := Ratio(rows, ok); !good || math.Abs(x-0.2/9) > 1e-9 {
		t.Errorf("ratio %v %v", x, good)
	}
	if _, good := Ratio(rows, anchor); good {
		t.Error("the anchor has no ratio to itself")
	}
	sum := &Row{Scenario: "s", Metric: "losses", Variant: VariantLock, Agg: AggSum, Unit: Count, Values: []float64{0, 0, 1}, Goal: Zero("b")}
	if sum.Verdict() != "NOT met" {
		t.Errorf("sum verdict %q", sum.Verdict())
	}
	med := MedianAtMost(1, Seconds, "b")
	if r := (&Row{Values: []float64{0.4, 0.9, 1.7}, Goal: med}); r.Verdict() != "met" {
		t.Errorf("a median goal met by the median run (one run above): %q", r.Verdict())
	}
	if r := (&Row{Values: []float64{0.4, 1.2, 1.7}, Goal: med}); r.Verdict() != "NOT met (median)" {
		t.Errorf("a median goal missed by the median run: %q", r.Verdict())
	}
	if c := cells(rows, anchor)[6]; c != "1 (anchor)" {
		t.Errorf("anchor ratio cell %q", c)
	}
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	cfg, err := FromEnv(get)
	if err != nil || cfg.Runs != 5 || len(cfg.Scale) != 3 || cfg.Quick || cfg.Out != "docs/benchmarks.md" {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	env[EnvQuick] = "1"
	env[EnvScale] = "10, 20"
	env[EnvScenarios] = "scale,handover"
	cfg, err = FromEnv(get)
	if err != nil || !cfg.Quick || cfg.Runs != 1 || cfg.Scale[1] != 20 || strings.Join(cfg.Scenarios, ",") != "handover,scale" {
		t.Fatalf("quick: %+v %v", cfg, err)
	}
	env[EnvRuns] = "0"
	env[EnvScenarios] = "nope"
	if _, err := FromEnv(get); err == nil || !strings.Contains(err.Error(), EnvRuns) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("want errors naming %s and the bad scenario, got %v", EnvRuns, err)
	}
}

func sampleReport() *Report {
	cfg := DefaultConfig
	cfg.Command = "make bench RUNS=3"
	rep := NewReport(cfg, Machine{Cores: 2, Nomad: "Nomad v1.11.2", Kernel: "Linux"}, time.Unix(0, 0))
	rep.Took = 90 * time.Second
	for _, v := range []struct {
		variant string
		vals    []float64
	}{{VariantAnchor, []float64{8.5, 3, 10}}, {VariantLock, []float64{0.1, 0.12, 0.09}}, {VariantDriver, []float64{0.15, 0.2, 0.31}}} {
		var g *Goal
		if v.variant != VariantAnchor {
			g = Below(0.3, Seconds, "blocking query")
		}
		rep.Add(&Row{Scenario: TitleHandover, Metric: "gap", Variant: v.variant, Values: v.vals, Planned: 3, Goal: g, Chart: "handover\ngap"})
		rep.Add(&Row{Scenario: TitleFootprint, Metric: "RSS", Variant: v.variant, Unit: MiB, Values: []float64{100 / (v.vals[0] + 1)}, Planned: 1, Chart: "RSS"})
	}
	rep.Add(&Row{Scenario: TitleLB, Metric: "lb", Variant: "(b)", Status: "not yet: x | y"})
	rep.AddTimeline(Timeline{
		Title: VariantLock, Caption: "gap 0.1 s", End: 30,
		Lanes: []string{"lock", "alloc a", "alloc b"},
		Spans: []Span{
			{Lane: 0, From: 0, To: 5, Kind: Held, Color: 0},
			{Lane: 0, From: 5.1, To: 12, Kind: Held, Color: 1},
			{Lane: 0, From: 12, To: 28, Kind: HeldDead, Color: 1},
			{Lane: 1, From: 0, To: 5, Kind: Running, Color: 0},
			{Lane: 2, From: 0, To: 5.1, Kind: Waiting, Color: 1},
			{Lane: 2, From: 5.1, To: 12, Kind: Running, Color: 1},
		},
		Marks: []Mark{{At: 4.9, Label: "stop"}, {At: 12, Label: "SIGKILL"}},
	})
	rep.Note("a note")
	return rep
}

func TestTextAndMarkdown(t *testing.T) {
	rep := sampleReport()
	txt := rep.Text()
	for _, want := range []string{TitleHandover, "1 (anchor)", "met", "NOT met (1 of 3 runs)", "not yet: x | y"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}
	if w := NotBetter(rep.Rows()); len(w) != 2 || !strings.Contains(w[0], "RSS") {
		t.Errorf("NotBetter = %q, want the two RSS rows", w)
	}
	md := rep.Markdown([]string{TimelineImage, RatiosImage})
	for _, want := range []string{"make bench RUNS=3", "![Timeline", "(" + TimelineImage + ")", `not yet: x \| y`,
		"## Machine", "Nomad v1.11.2", "- a note", "| (c) singleton driver |",
		"\n- [Goals](#goals)\n", "\n- [Machine](#machine)\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

func TestWriteDocDrawsPictures(t *testing.T) {
	dir := t.TempDir()
	written, err := WriteDoc(sampleReport(), filepath.Join(dir, "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 3 {
		t.Fatalf("written %v, want the doc and two pictures", written)
	}
	for _, p := range written[1:] {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG")) || len(b) < 10_000 {
			t.Errorf("%s: %d bytes, not a plausible PNG", p, len(b))
		}
	}
}

func TestMonitor(t *testing.T) {
	w := StartMachineCPU()
	m := StartMonitor(time.Now(), 20*time.Millisecond)
	time.Sleep(120 * time.Millisecond)
	lines := m.Stop() // other people's builds may show up; this process and its parents must not
	if otherBenchRunning() {
		t.Logf("another bench.test runs on this machine; not checking that the monitor leaves ours out: %q", lines)
	} else {
		for _, w := range lines {
			if slices.Contains(w.What, "bench.test") {
				t.Errorf("the monitor reports the bench itself: %s", w)
			}
		}
	}
	if p := w.Percent(); math.IsNaN(p) || p < 0 {
		t.Errorf("machine CPU %v", p)
	}
	if !m.mine[os.Getpid()] || !m.mine[os.Getppid()] {
		t.Errorf("this process and its parent must count as ours: %v", m.mine)
	}
}

// otherBenchRunning reports whether a bench.test other than this process
// runs (e.g. `make bench` beside `go test ./...`): its name would then show
// up in the monitor's lines legitimately.
func otherBenchRunning() bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if comm, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(comm)) == "bench.test" {
			return true
		}
	}
	return false
}
