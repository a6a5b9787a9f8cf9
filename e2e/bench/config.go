package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scenario names, as accepted by BENCH_SCENARIOS.
const (
	ScenarioHandover  = "handover"
	ScenarioCrash     = "crash"
	ScenarioStart     = "start"
	ScenarioFootprint = "footprint"
	ScenarioScale     = "scale"
	ScenarioLB        = "lb"
	ScenarioHAProxy   = "haproxy"
	ScenarioTimeline  = "timeline"
	ScenarioSemaphore = "semaphore"
	ScenarioUpdate    = "update"
	ScenarioLeaseCost = "leasecost"
	ScenarioNodeDeath = "nodedeath"
	ScenarioMetrics   = "metrics"
)

// AllScenarios in the order they run.
var AllScenarios = []string{
	ScenarioHandover, ScenarioCrash, ScenarioTimeline, ScenarioStart, ScenarioFootprint, ScenarioLB, ScenarioHAProxy, ScenarioSemaphore,
	ScenarioUpdate, ScenarioScale, ScenarioLeaseCost, ScenarioNodeDeath, ScenarioMetrics,
}

// Environment variables read by FromEnv. The GNUmakefile sets them from its
// own variables (RUNS, SCALE, QUICK, HOLD, SCENARIOS).
const (
	EnvEnable         = "BENCH"                  // "1" runs TestBench; anything else skips it
	EnvQuick          = "BENCH_QUICK"            // "1": smoke mode
	EnvRuns           = "BENCH_RUNS"             // runs per scenario and variant
	EnvScale          = "BENCH_SCALE"            // comma-separated N for the scale scenario
	EnvLeaseCost      = "BENCH_LEASE_COST"       // comma-separated N for the leasecost scenario
	EnvHold           = "BENCH_HOLD"             // scale: how long the N leases are held and measured
	EnvFootprintHold  = "BENCH_FOOTPRINT_HOLD"   // footprint: how long a holder holds before its RSS is read
	EnvScaleProcsMax  = "BENCH_SCALE_PROCS_MAX"  // scale: largest N run as `lock` processes
	EnvScaleAnchorMax = "BENCH_SCALE_ANCHOR_MAX" // scale: largest N run as `nomad var lock` processes
	EnvOut            = "BENCH_OUT"              // Markdown report path
	EnvCommand        = "BENCH_COMMAND"          // the command line shown in the report
	EnvScenarios      = "BENCH_SCENARIOS"        // comma-separated subset of AllScenarios
	EnvMerge          = "BENCH_MERGE"            // "1": put a subset's sections into the existing report
)

// Lease timing of every scenario: the shortest TTL Nomad accepts, so runs are
// short, and a small positive lock delay (0 would silently become 15 s). Every
// variant uses the same values, so they compare like for like.
const (
	TTL       = 10 * time.Second
	LockDelay = 1 * time.Second
)

// Config is one bench run's settings.
type Config struct {
	Quick bool
	Runs  int
	Scale []int
	// LeaseCost are the numbers of locks held at once in the leasecost
	// scenario, on a three-server cluster.
	LeaseCost     []int
	Hold          time.Duration
	FootprintHold time.Duration
	// ScaleProcsMax is the largest N for which the scale scenario runs N
	// `lock` processes; lockclient goroutines run at every N. Each `lock`
	// lease is three Go processes on this host (lock, its group guard, the
	// workload): at N = 500 on 2 cores their start alone saturates the CPUs
	// for about a minute, which measures the bench machine, not the agent.
	ScaleProcsMax int
	// ScaleAnchorMax is the largest N for which it runs N `nomad var lock`
	// processes, the anchor.
	ScaleAnchorMax int
	// FreshScaleAgent starts a new agent for every run of the scale
	// scenario, so that agent CPU and RSS are not inherited from the previous
	// run. Quick mode uses one agent per N.
	FreshScaleAgent bool
	Out             string
	Command         string
	Scenarios       []string
	// Merge puts the sections of a run of some scenarios into the report
	// already at Out instead of writing a report of its own (MergeIntoDoc).
	Merge bool
}

// Defaults of a full run and of quick (smoke) mode.
var (
	DefaultConfig = Config{
		Runs:            5,
		Scale:           []int{100, 500, 1000},
		LeaseCost:       []int{10, 50, 100},
		Hold:            12 * time.Second,
		FootprintHold:   11 * time.Second,
		ScaleProcsMax:   100,
		ScaleAnchorMax:  100,
		FreshScaleAgent: true,
		Out:             "docs/benchmarks.md",
		Command:         "make bench",
		Scenarios:       AllScenarios,
	}
	QuickConfig = Config{
		Quick:          true,
		Runs:           1,
		Scale:          []int{10},
		LeaseCost:      []int{10},
		Hold:           4 * time.Second,
		FootprintHold:  4 * time.Second,
		ScaleProcsMax:  100,
		ScaleAnchorMax: 100,
		Out:            "bin/bench-quick/benchmarks.md",
		Command:        "make bench QUICK=1",
		Scenarios:      AllScenarios,
	}
)

// FromEnv builds the Config from getenv (os.Getenv in TestBench).
func FromEnv(getenv func(string) string) (Config, error) {
	cfg := DefaultConfig
	if isTrue(getenv(EnvQuick)) {
		cfg = QuickConfig
	}
	var errs []string
	if v := getenv(EnvRuns); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Sprintf("%s=%q: want a positive integer", EnvRuns, v))
		} else {
			cfg.Runs = n
		}
	}
	for _, l := range []struct {
		env string
		dst *[]int
	}{{EnvScale, &cfg.Scale}, {EnvLeaseCost, &cfg.LeaseCost}} {
		if v := getenv(l.env); v != "" {
			ns, err := parseInts(v)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: %v", l.env, v, err))
			} else {
				*l.dst = ns
			}
		}
	}
	for _, d := range []struct {
		env string
		dst *time.Duration
		min time.Duration
	}{{EnvHold, &cfg.Hold, time.Second}, {EnvFootprintHold, &cfg.FootprintHold, time.Second}} {
		if v := getenv(d.env); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil || x < d.min {
				errs = append(errs, fmt.Sprintf("%s=%q: want a duration of at least %s", d.env, v, d.min))
			} else {
				*d.dst = x
			}
		}
	}
	for _, n := range []struct {
		env string
		dst *int
	}{{EnvScaleProcsMax, &cfg.ScaleProcsMax}, {EnvScaleAnchorMax, &cfg.ScaleAnchorMax}} {
		if v := getenv(n.env); v != "" {
			x, err := strconv.Atoi(v)
			if err != nil || x < 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want an integer >= 0", n.env, v))
			} else {
				*n.dst = x
			}
		}
	}
	if v := getenv(EnvOut); v != "" {
		cfg.Out = v
	}
	cfg.Merge = isTrue(getenv(EnvMerge))
	if v := getenv(EnvCommand); v != "" {
		cfg.Command = v
	}
	if v := getenv(EnvScenarios); v != "" && v != "all" {
		var picked []string
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			if !slices.Contains(AllScenarios, s) {
				errs = append(errs, fmt.Sprintf("%s: unknown scenario %q (have %s)", EnvScenarios, s, strings.Join(AllScenarios, ",")))
				continue
			}
			picked = append(picked, s)
		}
		// Keep the canonical order.
		cfg.Scenarios = slices.DeleteFunc(slices.Clone(AllScenarios), func(s string) bool { return !slices.Contains(picked, s) })
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("bench configuration: %s", strings.Join(errs, "; "))
	}
	return cfg, nil
}

// Enabled reports whether scenario s is to run.
func (c Config) Enabled(s string) bool { return slices.Contains(c.Scenarios, s) }

// AllEnabled reports whether every scenario runs.
func (c Config) AllEnabled() bool { return len(c.Scenarios) == len(AllScenarios) }

func isTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func parseInts(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no values")
	}
	return out, nil
}
