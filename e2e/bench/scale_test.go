package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// renewMetric is the server's timing of lock renew RPCs; its Prometheus
// _count is the number of renews served.
const renewMetric = "nomad_nomad_variables_lock_renew_count"

// scaleRows are the rows of one (N, variant).
type scaleRows struct {
	acquire, rate, errs, losses, cpu, rss, holders, rest *Row
}

// scaleResult is one run of one (N, variant).
type scaleResult struct {
	acquireAll  float64 // seconds
	renewRate   float64 // per second, server side
	renewErrors float64 // NaN where not observable
	losses      float64
	cpuPct      float64
	rssMiB      float64
	holdersPct  float64 // CPU of the lease holders: N supervisor processes, or this process
	restPct     float64 // the rest of the machine: workloads, guards, and anything else running
}

// scale measures N leases held at once on one agent (section TitleScale).
func (b *bench) scale(t *testing.T) {
	for _, n := range b.cfg.Scale {
		var variants []string
		if n <= b.cfg.ScaleAnchorMax {
			variants = append(variants, VariantAnchorProcs)
		}
		if n <= b.cfg.ScaleProcsMax {
			variants = append(variants, VariantLockProcs)
		}
		variants = append(variants, VariantLockClient)

		rows := map[string]*scaleRows{}
		for _, v := range variants {
			rows[v] = &scaleRows{}
		}
		m := func(s string) string { return fmt.Sprintf("N=%d: %s", n, s) }
		for _, v := range variants {
			rows[v].acquire = b.row(TitleScale, m("time to acquire all"), v, Seconds, AggStats, nil)
		}
		for _, v := range variants {
			r := b.row(TitleScale, m("renew rate at the server"), v, PerSecond, AggStats, nil)
			r.Note = fmt.Sprintf("expected %s", PerSecond.Format(float64(n)/renewPeriod(v).Seconds()))
			rows[v].rate = r
		}
		for _, v := range variants {
			var g *Goal
			if v != VariantAnchorProcs {
				g = Zero("renews every TTL/2 with a deadline each, fence at TTL − TTL/10: a lease is lost only if " +
					"no renew succeeds for 9 s, or the server answers 409/404.")
			}
			rows[v].losses = b.row(TitleScale, m("spurious losses"), v, Count, AggSum, g)
		}
		for _, v := range variants {
			if v == VariantAnchorProcs {
				continue // nomad var lock does not log failed renews
			}
			rows[v].errs = b.row(TitleScale, m("failed renew attempts (retried)"), v, Count, AggSum, nil)
		}
		for _, v := range variants {
			rows[v].cpu = b.row(TitleScale, m("agent CPU while holding (% of one core)"), v, Percent, AggStats, nil)
		}
		for _, v := range variants {
			rows[v].rss = b.row(TitleScale, m("agent RSS at the end of the hold"), v, MiB, AggStats, nil)
		}
		for _, v := range variants {
			r := b.row(TitleScale, m("holders' CPU while holding (% of one core)"), v, Percent, AggStats, nil)
			r.Note = "the N supervisor processes"
			if v == VariantLockClient {
				r.Note = "the bench process"
			}
			rows[v].holders = r
		}
		for _, v := range variants {
			r := b.row(TitleScale, m("rest of the machine while holding (% of one core)"), v, Percent, AggStats, nil)
			r.Note = "workloads, guards, other users' work"
			r.NoRatio = true
			rows[v].rest = r
		}

		// shared is nil when every run gets a fresh agent.
		runVariant := func(t *testing.T, shared *harness.Agent, v string) {
			for run := 1; run <= b.cfg.Runs; run++ {
				ok := t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
					a := shared
					if a == nil {
						a = b.scaleAgent(t)
					}
					res := b.scaleRun(t, a, n, v, run)
					r := rows[v]
					add(r.acquire, res.acquireAll)
					add(r.rate, res.renewRate)
					add(r.losses, res.losses)
					if r.errs != nil {
						add(r.errs, res.renewErrors)
					}
					add(r.cpu, res.cpuPct)
					add(r.rss, res.rssMiB)
					add(r.holders, res.holdersPct)
					add(r.rest, res.restPct)
					b.progress("scale N=%d %s run %d/%d: all acquired in %s, renews %s (%s), losses %.0f, renew errors %s, agent CPU %s, agent RSS %s, holders' CPU %s, rest of the machine %s",
						n, v, run, b.cfg.Runs, Seconds.Format(res.acquireAll), PerSecond.Format(res.renewRate), r.rate.Note,
						res.losses, Count.Format(res.renewErrors), Percent.Format(res.cpuPct), MiB.Format(res.rssMiB), Percent.Format(res.holdersPct), Percent.Format(res.restPct))
				})
				if !ok {
					break // a broken run leaves the agent in an unknown state
				}
			}
		}
		if b.cfg.FreshScaleAgent {
			for _, v := range variants {
				done := b.phase(fmt.Sprintf("%s N=%d %s", TitleScale, n, v))
				t.Run(fmt.Sprintf("N=%d/%s", n, slug(v)), func(t *testing.T) { runVariant(t, nil, v) })
				done()
			}
		} else {
			done := b.phase(fmt.Sprintf("%s N=%d", TitleScale, n))
			t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
				a := b.scaleAgent(t)
				for _, v := range variants {
					t.Run(slug(v), func(t *testing.T) { runVariant(t, a, v) })
				}
			})
			done()
		}
	}
}

// scaleAgent starts a dev agent for the scale scenario. See Methods for why
// the per-client connection limit is lifted. A full run starts one per run:
// the lockclient leases' idle keep-alive connections outlive their release
// by 90 s (Go's IdleConnTimeout, and Nomad sets no server idle timeout), and
// thousands of them would inflate the next run's agent RSS.
func (b *bench) scaleAgent(t *testing.T) *harness.Agent {
	return harness.StartAgent(t, harness.AgentOptions{
		Dev:      true,
		LogLevel: "INFO",
		Config: []string{
			"telemetry {\n  prometheus_metrics = true\n}",
			"limits {\n  http_max_conns_per_client = 0\n}",
		},
	})
}

func (b *bench) scaleRun(t *testing.T, a *harness.Agent, n int, v string, run int) scaleResult {
	prefix := fmt.Sprintf("bench/scale-%s-%d-%d", slug(v), n, b.seq.Add(1))
	if v == VariantLockClient {
		return b.scaleGoroutines(t, a, n, prefix)
	}
	return b.scaleProcs(t, a, n, v, prefix)
}

// renewPeriod is how often each lease of the variant renews.
func renewPeriod(v string) time.Duration {
	if v == VariantAnchorProcs {
		return TTL * 7 / 10 // api.LockLeaser: 0.7×TTL
	}
	return TTL / 2
}

// holdWindow holds for the configured window, rounded up to a whole number
// of the variant's renew periods (so every lease renews equally often in
// it), and measures the agent.
func (b *bench) holdWindow(t *testing.T, a *harness.Agent, v string, holders []int) (res scaleResult) {
	period := renewPeriod(v)
	window := time.Duration(math.Ceil(float64(b.cfg.Hold)/float64(period))) * period
	// Leases acquired together renew in phase; start half a period later so
	// that the window's edges fall between renews, not on them.
	time.Sleep(period / 2)
	pid := a.Server().PID()
	c0 := renewCount(t, a)
	agent, hold, machine := startCPU(pid), startCPU(holders...), StartMachineCPU()
	h0 := harness.MonoNow()
	time.Sleep(window)
	c1 := renewCount(t, a)
	res.cpuPct, res.holdersPct = agent.percent(), hold.percent()
	res.restPct = max(0, machine.Percent()-res.cpuPct-res.holdersPct)
	w := secondsOf(harness.MonoNow() - h0)
	rss, err := readMiB(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	res.renewRate, res.rssMiB = (c1-c0)/w, rss
	return res
}

// renewCount reads the server's renew count from its Prometheus metrics.
func renewCount(t *testing.T, a *harness.Agent) float64 {
	t.Helper()
	x, err := promValue(a.Addr(), renewMetric)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// promValue is the sum of a metric over its label sets on the agent at addr
// (Prometheus format), 0 if the agent has not reported it yet (a summary
// exists only once observed).
func promValue(addr, metric string) (float64, error) {
	cl := &http.Client{Timeout: 20 * time.Second}
	resp, err := cl.Get(addr + "/v1/metrics?format=prometheus")
	if err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: HTTP %s", resp.Status)
	}
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric) {
			continue
		}
		f := strings.Fields(line)
		if f[0] != metric && !strings.HasPrefix(f[0], metric+"{") {
			continue
		}
		x, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: %q: %w", line, err)
		}
		total += x
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	return total, nil
}

// lineCounter counts log lines of the lockclient leases by phrase.
type lineCounter struct {
	mu     sync.Mutex
	counts map[string]int
	first  map[string]string
}

var countedPhrases = []string{"renew failed", "lock API error", "release failed"}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts, c.first = map[string]int{}, map[string]string{}
	}
	s := string(p)
	for _, ph := range countedPhrases {
		if k := strings.Count(s, ph); k > 0 {
			c.counts[ph] += k
			if c.first[ph] == "" {
				c.first[ph] = strings.TrimSpace(s)
			}
		}
	}
	return len(p), nil
}

func (c *lineCounter) count(ph string) (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[ph], c.first[ph]
}

// scaleGoroutines holds n leases with the lockclient package in this
// process: the code `lock` runs, without n processes around it.
func (b *bench) scaleGoroutines(t *testing.T, a *harness.Agent, n int, prefix string) scaleResult {
	counter := &lineCounter{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "bench-scale", Level: hclog.Warn, Output: counter})
	host, _ := os.Hostname()
	leases := make([]*lockclient.Lease, n)
	acquired := make([]int64, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	spawn := harness.MonoNow()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := lockclient.New(lockclient.Config{
				Endpoint: lockclient.Endpoint{Address: a.Addr()},
				Path:     fmt.Sprintf("%s/%d", prefix, i),
				Timing:   lockclient.Timing{TTL: TTL, LockDelay: LockDelay},
				Holder:   lockclient.Holder{JobID: "bench-scale", Hostname: host, PID: os.Getpid()},
				Logger:   logger,
			})
			if err != nil {
				errs[i] = err
				return
			}
			leases[i], errs[i] = l.Acquire(ctx, lockclient.AcquireOptions{Wait: 3 * time.Minute})
			acquired[i] = harness.MonoNow()
		}()
	}
	wg.Wait()
	defer releaseAll(leases)
	if err := errors.Join(errs...); err != nil {
		failed := 0
		for _, e := range errs {
			if e != nil {
				failed++
			}
		}
		t.Fatalf("%d of %d leases not acquired; errors: %v", failed, n, err)
	}
	last := spawn
	for _, m := range acquired {
		last = max(last, m)
	}
	res := scaleResult{acquireAll: secondsOf(last - spawn)}
	if k, first := counter.count("lock API error"); k > 0 {
		b.rep.Note("%s N=%d: %d API errors while acquiring (retried), first: %s", VariantLockClient, n, k, first)
	}
	hw := b.holdWindow(t, a, VariantLockClient, []int{os.Getpid()})
	res.renewRate, res.cpuPct, res.rssMiB, res.holdersPct, res.restPct = hw.renewRate, hw.cpuPct, hw.rssMiB, hw.holdersPct, hw.restPct
	for _, ls := range leases {
		select {
		case <-ls.Lost():
			res.losses++
			if res.losses == 1 {
				b.rep.Note("%s N=%d: a lease was lost: %v", VariantLockClient, n, ls.Err())
			}
		default:
		}
	}
	k, first := counter.count("renew failed")
	res.renewErrors = float64(k)
	if k > 0 {
		b.rep.Note("%s N=%d: %d failed renew attempts (retried), first: %s", VariantLockClient, n, k, first)
	}
	return res
}

// scaleProcs holds n leases with n `lock` or `nomad var lock` processes,
// each wrapping a testworkload, against the agent's HTTP address.
func (b *bench) scaleProcs(t *testing.T, a *harness.Agent, n int, v, prefix string) scaleResult {
	record := filepath.Join(b.records, strings.ReplaceAll(prefix, "/", "_")+".jsonl")
	marker := fmt.Sprintf("bench-%s-%d", strings.ReplaceAll(prefix, "/", "-"), time.Now().UnixNano())
	env := append(harness.WithoutNomadEnv(os.Environ()), a.Env()...)
	procs := make([]*harness.Process, 0, n)
	defer func() { stopAll(procs) }()

	spawn := harness.MonoNow()
	for i := range n {
		path := fmt.Sprintf("%s/%d", prefix, i)
		var argv []string
		if v == VariantAnchorProcs {
			argv = append([]string{b.nomadBin}, varLockArgs(path)...)
		} else {
			argv = append([]string{b.lockBin}, lockArgs(path)...)
		}
		argv = append(argv, b.workloadArgs(record, marker)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		procs = append(procs, harness.StartProcess(t, cmd))
	}

	deadline := time.Now().Add(5 * time.Minute)
	var last int64
	for {
		recs, err := harness.ReadRecords(record)
		if err != nil {
			t.Fatal(err)
		}
		starts := 0
		for _, r := range recs {
			if r.Event == harness.EventStart && r.Role == harness.RoleMain {
				starts++
				last = max(last, r.Mono)
			}
		}
		if starts >= n {
			break
		}
		if time.Now().After(deadline) {
			exited := 0
			var sample string
			for _, p := range procs {
				if p.Exited() {
					exited++
					if sample == "" {
						sample = p.Stderr()
					}
				}
			}
			t.Fatalf("%s: %d of %d workloads started after 5 min; %d supervisors exited; one's stderr:\n%s", v, starts, n, exited, sample)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res := scaleResult{acquireAll: secondsOf(last - spawn), renewErrors: nan}
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID()
	}
	hw := b.holdWindow(t, a, v, pids)
	res.renewRate, res.cpuPct, res.rssMiB, res.holdersPct, res.restPct = hw.renewRate, hw.cpuPct, hw.rssMiB, hw.holdersPct, hw.restPct

	exited, ended := 0, 0
	for _, p := range procs {
		if p.Exited() {
			exited++
		}
	}
	recs, err := harness.ReadRecords(record)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Role == harness.RoleMain && (r.Event == harness.EventStop || r.Event == harness.EventExit) {
			ended++
		}
	}
	res.losses = float64(max(exited, ended))
	if res.losses > 0 {
		why := ""
		for _, p := range procs {
			if p.Exited() {
				why = lastLines(p.Stderr(), 3)
				break
			}
		}
		b.rep.Note("%s N=%d: %d supervisors exited and %d workloads ended before the end of the hold; one's last log lines: %s",
			v, n, exited, ended, why)
	}
	if v == VariantLockProcs {
		k := 0
		for _, p := range procs {
			k += strings.Count(p.Stderr(), "renew failed")
		}
		res.renewErrors = float64(k)
	}
	return res
}

// lastLines returns the last n non-empty lines of s, joined with " / ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// stopAll SIGTERMs every process, waits up to 60 s in all, then SIGKILLs the
// process group of each (which also sweeps anything a shell left behind).
func stopAll(procs []*harness.Process) {
	for _, p := range procs {
		if !p.Exited() {
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	end := time.Now().Add(60 * time.Second)
	for _, p := range procs {
		select {
		case <-p.Done():
		case <-time.After(time.Until(end)):
		}
	}
	for _, p := range procs {
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	}
}

// releaseAll releases every acquired lease at once, within a minute.
func releaseAll(leases []*lockclient.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, ls := range leases {
		if ls == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = ls.Release(ctx)
		}()
	}
	wg.Wait()
}
