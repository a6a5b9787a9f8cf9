package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestBench is `make bench`. It skips unless BENCH=1: `go test ./...` in
// e2e/ compiles it but leaves the benchmark to make.
func TestBench(t *testing.T) {
	if os.Getenv(EnvEnable) != "1" {
		t.Skipf("the benchmark runs with `make bench` (or %s=1)", EnvEnable)
	}
	cfg, err := FromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	b := &bench{cfg: cfg, began: began, records: t.TempDir()}
	b.root = harness.RepoRoot(t)
	b.workload = harness.BuildTestWorkload(t)
	b.lockBin = resolved(t, harness.LockBin(t))
	b.nomadBin = resolved(t, harness.NomadBin(t))
	b.pluginBin = resolved(t, harness.PluginBin(t))
	b.rep = NewReport(cfg, ReadMachine(b.root, b.nomadBin, b.lockBin), began)
	if !filepath.IsAbs(cfg.Out) {
		cfg.Out = filepath.Join(b.root, cfg.Out)
	}

	// Other people's builds and tests on the same cores distort timings;
	// the report says when they ran.
	mon := StartMonitor(began, 2*time.Second)

	mode := "full"
	if cfg.Quick {
		mode = "quick (smoke)"
	}
	scale := ""
	if cfg.Enabled(ScenarioScale) {
		scale = ", scale N=" + joinInts(cfg.Scale)
	}
	b.progress("%s run: %d run(s) per scenario, scenarios %s%s; %s on %d cores, %s",
		mode, cfg.Runs, strings.Join(cfg.Scenarios, ","), scale, b.rep.Machine.Nomad, b.rep.Machine.Cores, b.rep.Machine.Kernel)

	if cfg.Enabled(ScenarioHandover) || cfg.Enabled(ScenarioCrash) || cfg.Enabled(ScenarioTimeline) ||
		cfg.Enabled(ScenarioStart) || cfg.Enabled(ScenarioFootprint) || cfg.Enabled(ScenarioLB) || cfg.Enabled(ScenarioHAProxy) ||
		cfg.Enabled(ScenarioSemaphore) || cfg.Enabled(ScenarioUpdate) {
		// One dev agent with the plugin for every scenario but scale; it stops (with
		// everything it ran) when this subtest ends, before the scale runs.
		t.Run("agent", func(t *testing.T) {
			began := time.Now()
			opts := harness.SingletonAgentOptions(t, TTL.String(), LockDelay.String())
			opts.Dev = true
			opts.LogLevel = "INFO"
			if cfg.Enabled(ScenarioHandover) || cfg.Enabled(ScenarioCrash) {
				// (d): a gate with a docker app, on the harness's private engine.
				b.docker = harness.StartDocker(t)
				opts.Docker = b.docker
			}
			b.a = harness.StartAgent(t, opts)
			b.progress("dev agent with the singleton plugin ready in %s at %s", time.Since(began).Round(time.Millisecond), b.a.Addr())

			b.runPhase(t, ScenarioHandover, TitleHandover, b.handover)
			// The timeline run waits on the same server timers as the
			// crash runs, so it runs alongside them.
			var names []string
			var fns []func(*testing.T)
			if cfg.Enabled(ScenarioCrash) {
				names, fns = append(names, "crash"), append(fns, b.crash)
			}
			if cfg.Enabled(ScenarioTimeline) {
				names, fns = append(names, "timeline"), append(fns, b.timelines)
			}
			if len(names) > 0 {
				done := b.phase(TitleCrash + " and the timeline picture")
				runConcurrently(t, names, fns)
				done()
			}
			b.runPhase(t, ScenarioStart, TitleStart, b.start)
			b.runPhase(t, ScenarioFootprint, TitleFootprint, b.footprint)
			b.runPhase(t, ScenarioLB, TitleLB, b.lb)
			b.runPhase(t, ScenarioHAProxy, TitleHAProxy, b.haproxy)
			b.runPhase(t, ScenarioSemaphore, TitleSemaphore, b.semaphore)
			b.runPhase(t, ScenarioUpdate, TitleUpdate, b.rollingUpdate)
		})
	}
	if cfg.Enabled(ScenarioScale) {
		t.Run("scale", b.scale)
	}
	if cfg.Enabled(ScenarioLeaseCost) {
		t.Run("leasecost", b.leaseCost)
	}
	if cfg.Enabled(ScenarioNodeDeath) {
		t.Run("nodedeath", b.nodeDeath)
	}
	if cfg.Enabled(ScenarioMetrics) {
		t.Run("metrics", b.metrics)
	}

	b.rep.Took = time.Since(began)
	b.rep.Machine.LoadAtEnd = LoadAvg()
	for _, w := range mon.Stop() {
		while := ""
		if ph := b.during(w.From, w.To); len(ph) > 0 {
			while = ", while the bench ran " + strings.Join(ph, "; ")
		}
		b.rep.Note("Other work shared the machine at %s (minutes:seconds into the run)%s: numbers measured then may be inflated.", w, while)
	}
	if t.Failed() {
		b.rep.Note("Some runs failed (the test log names them); their rows have fewer values than planned.")
	}
	var written []string
	switch {
	case cfg.Merge && !cfg.AllEnabled() && t.Failed():
		// Runs failed: keep the sections the report already has.
		err = fmt.Errorf("runs failed: %s left as it was (nothing merged)", cfg.Out)
	case cfg.Merge && !cfg.AllEnabled():
		err = MergeIntoDoc(b.rep, cfg.Out)
		written = []string{cfg.Out}
	default:
		written, err = WriteDoc(b.rep, cfg.Out)
	}
	fmt.Printf("\nResults (median, min, max over runs; \"vs (a)\" = median / median of nomad var lock):\n%s\n", b.rep.Text())
	fmt.Println("Goals:")
	for _, l := range b.rep.GoalLines() {
		fmt.Println("  " + l)
	}
	for _, n := range b.rep.Notes() {
		fmt.Println("Note: " + n)
	}
	if err != nil {
		t.Errorf("write report: %v", err)
	}
	fmt.Printf("\nWrote %s in %s.\n", strings.Join(relAll(b.root, written), ", "), b.rep.Took.Round(time.Second))
}

func resolved(t *testing.T, path string) string {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func relAll(root string, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		if r, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(r, "..") {
			p = r
		}
		out[i] = p
	}
	return out
}
