package bench

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// metricsVariants are the singleton driver with the plugin's metrics off
// and on (plugin config metrics_addr).
var metricsVariants = []string{VariantDriver, VariantDriverMetrics}

// Sizes of the metrics scenario.
const (
	// metricsFootprintTasks: a holder and its standbys, whose supervisors'
	// RSS is read.
	metricsFootprintTasks = 10
	// metricsScrapeTasks: the tasks of the plugin whose scrape is timed
	// (the goal's 100; quick mode: 10).
	metricsScrapeTasks = 100
	// metricsScrapes is how many scrapes of it are timed.
	metricsScrapes = 20
)

// metrics measures what the plugin's metrics cost (section TitleMetrics):
// two dev agents with the plugin, one without metrics_addr and one with
// it, in the same run: the supervisors' RSS, a graceful handover, and how
// long a scrape of a plugin supervising 100 tasks takes.
func (b *bench) metrics(t *testing.T) {
	done := b.phase(TitleMetrics)
	defer done()
	gap, rss, hwm, plugin := map[string]*Row{}, map[string]*Row{}, map[string]*Row{}, map[string]*Row{}
	for _, v := range metricsVariants {
		gap[v] = b.row(TitleMetrics, "holder stopped: old workload exit → standby's workload start", v, Seconds, AggStats, nil)
	}
	for _, v := range metricsVariants {
		rss[v] = b.row(TitleMetrics, fmt.Sprintf("supervisor RSS (VmRSS, median of a holder and %d standbys)", metricsFootprintTasks-1), v, MiB, AggStats, nil)
	}
	for _, v := range metricsVariants {
		hwm[v] = b.row(TitleMetrics, "holder's supervisor peak RSS (VmHWM)", v, MiB, AggStats, nil)
	}
	for _, v := range metricsVariants {
		plugin[v] = b.row(TitleMetrics, fmt.Sprintf("plugin process RSS (VmRSS, %d tasks)", metricsFootprintTasks), v, MiB, AggStats, nil)
	}
	within10 := func(what string) *Goal {
		return AtMost(10, Percent, "metrics on costs the "+what+" at most 10 % over metrics off, measured in the same run")
	}
	gapCost := b.row(TitleMetrics, "graceful handover: median with metrics over median without, − 1", VariantDriverMetrics, Percent, AggStats, within10("handover"))
	rssCost := b.row(TitleMetrics, "supervisor RSS: median with metrics over median without, − 1", VariantDriverMetrics, Percent, AggStats, within10("supervisors' memory"))
	gapCost.Planned, rssCost.Planned = 1, 1
	gapCost.NoRatio, rssCost.NoRatio = true, true
	tasks := metricsScrapeTasks
	if b.cfg.Quick {
		tasks = 10
	}
	scrape := b.row(TitleMetrics, fmt.Sprintf("scrape of the plugin's /metrics, %d tasks supervised", tasks), VariantDriverMetrics, Seconds, AggStats,
		Below(0.1, Seconds, "every task's series read from its supervisor's count at each scrape"))
	scrape.Planned, scrape.NoRatio = metricsScrapes, true

	saved := b.a
	defer func() { b.a = saved }()
	agents := map[string]*harness.Agent{}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	for _, v := range metricsVariants {
		opts := harness.SingletonAgentOptions(t, TTL.String(), LockDelay.String())
		opts.Dev, opts.LogLevel = true, "INFO"
		if v == VariantDriverMetrics {
			opts.Config[0] = harness.SingletonPluginConfigWith(TTL.String(), LockDelay.String(), fmt.Sprintf("metrics_addr = %q", metricsAddr))
		}
		agents[v] = harness.StartAgent(t, opts)
	}

	// Handovers: one at a time (sub-second gaps on 2 cores), the variants
	// alternating which goes first.
	for run := 1; run <= b.cfg.Runs; run++ {
		for _, v := range rotate(metricsVariants, run) {
			b.a = agents[v]
			t.Run(fmt.Sprintf("handover/run%d/%s", run, slug(v)), func(t *testing.T) {
				g := b.metricsHandover(t)
				add(gap[v], secondsOf(g))
				b.progress("metrics %s handover run %d/%d: old exit → standby's start %s", v, run, b.cfg.Runs, fmtS(g))
			})
		}
	}
	addCost(gapCost, gap[VariantDriverMetrics], gap[VariantDriver])

	// Footprint: both agents at once (memory, not timing).
	for run := 1; run <= b.cfg.Runs; run++ {
		var names []string
		var fns []func(*testing.T)
		for _, v := range metricsVariants {
			names = append(names, fmt.Sprintf("footprint/run%d/%s", run, slug(v)))
			fns = append(fns, func(t *testing.T) { b.metricsFootprint(t, agents[v], v, run, rss[v], hwm[v], plugin[v]) })
		}
		runConcurrently(t, names, fns)
	}
	addCost(rssCost, rss[VariantDriverMetrics], rss[VariantDriver])

	// The scrape of a plugin supervising `tasks` tasks.
	b.a = agents[VariantDriverMetrics]
	t.Run("scrape", func(t *testing.T) { b.metricsScrape(t, metricsAddr, tasks, scrape) })
}

// addCost adds to cost the median of on over the median of off, − 1, in
// percent.
func addCost(cost, on, off *Row) {
	a, b := on.Summary(), off.Summary()
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return
	}
	add(cost, 100*(a.Median/b.Median-1))
}

// metricsHandover is one graceful handover on b.a: a holder job and a
// standby job on one lock; the holder's job is stopped once the standby
// waits. It returns old workload exit → standby's workload start (ns).
func (b *bench) metricsHandover(t *testing.T) int64 {
	holderJob := b.newJob("metrics-handover", VariantDriver, 1)
	holderJob.failFast = true
	b.register(t, holderJob)
	standbyJob := b.sibling(holderJob, "metrics-handover-standby", 1)
	defer b.stopJob(t, standbyJob, 30*time.Second)
	defer b.stopJob(t, holderJob, 0)
	holder := waitStart(t, holderJob.record, 0, 90*time.Second)
	b.register(t, standbyJob)
	b.waitStandbys(t, standbyJob, "", 1, 1500*time.Millisecond, 90*time.Second)
	_, g, _ := b.handoverOnce(t, holderJob, holder, b.stopCall(t, holderJob.id))
	return g
}

// metricsFootprint runs metricsFootprintTasks allocations on one lock on
// a, and once the holder has held for FootprintHold reads every
// supervisor's RSS, the holder's peak, and the plugin's RSS.
func (b *bench) metricsFootprint(t *testing.T, a *harness.Agent, v string, run int, rss, hwm, plugin *Row) {
	j := b.newJob("metrics-footprint", VariantDriver, metricsFootprintTasks)
	register := func() {
		parsed, err := a.API().Jobs().ParseHCL(b.hcl(j), true)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.API().Jobs().Register(parsed, nil); err != nil {
			t.Fatal(err)
		}
	}
	register()
	defer func() { _ = a.Purge(j.id) }()
	st := waitStart(t, j.record, 0, 120*time.Second)
	a.WaitAllocs(t, j.id, metricsFootprintTasks, api.AllocClientStatusRunning, 120*time.Second)
	time.Sleep(b.cfg.FootprintHold)
	allocs, err := a.Allocs(j.id)
	if err != nil {
		t.Fatal(err)
	}
	var all []float64
	for _, al := range allocs {
		procs, err := harness.SupervisorProcs(al.ID)
		if err != nil || len(procs) != 1 {
			t.Fatalf("alloc %s: supervisor %v (%v)", short(al.ID), procs, err)
		}
		m, err := readMiB(procs[0].PID, "VmRSS")
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, m)
		if al.ID == st.AllocID {
			if peak, err := readMiB(procs[0].PID, "VmHWM"); err == nil {
				add(hwm, peak)
			}
		}
	}
	slices.Sort(all)
	add(rss, all[len(all)/2])
	if procs, err := harness.PluginProcs(a.Client().PID(), b.pluginBin); err == nil && len(procs) == 1 {
		if m, err := readMiB(procs[0].PID, "VmRSS"); err == nil {
			add(plugin, m)
		}
	}
	b.progress("metrics %s footprint run %d/%d: supervisor RSS median %s", v, run, b.cfg.Runs, MiB.Format(all[len(all)/2]))
}

// metricsScrape starts tasks allocations on one lock, waits until the
// plugin's /metrics shows every one, and times metricsScrapes scrapes.
func (b *bench) metricsScrape(t *testing.T, addr string, tasks int, scrape *Row) {
	j := b.newJob("metrics-scrape", VariantDriver, tasks)
	j.small = true
	b.register(t, j)
	defer b.stopJob(t, j, 60*time.Second)
	b.a.WaitAllocs(t, j.id, tasks, api.AllocClientStatusRunning, 10*time.Minute)
	get := func() (string, time.Duration) {
		began := time.Now()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape: %d %v", resp.StatusCode, err)
		}
		return string(body), time.Since(began)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		body, _ := get()
		if n := strings.Count(body, "nomad_singleton_lock_held{"); n >= tasks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics shows fewer than %d tasks 5 min after they run", tasks)
		}
		time.Sleep(time.Second)
	}
	var worst time.Duration
	for range metricsScrapes {
		_, took := get()
		add(scrape, took.Seconds())
		worst = max(worst, took)
		time.Sleep(100 * time.Millisecond)
	}
	b.progress("metrics: %d scrapes of a plugin supervising %d tasks: median %s, worst %s", metricsScrapes, tasks,
		Seconds.Format(scrape.Summary().Median), Seconds.Format(worst.Seconds()))
	if math.IsNaN(scrape.Summary().Median) {
		t.Error("no scrape timed")
	}
}
