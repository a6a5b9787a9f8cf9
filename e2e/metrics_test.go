package e2e

// Operators see every lock: a real Prometheus server scrapes the plugin
// (metrics_addr) and `lock -http-addr` processes through a graceful
// handover and a crash takeover of each, and evaluates the example alert
// rules (docs/operations.md).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/promtooltest"
)

// promInterval is the test Prometheus's scrape and evaluation interval.
const promInterval = time.Second

// TestMetricsPrometheus: the plugin's and lock's metrics, read by a real
// Prometheus server: one holder per job before and after each handover and
// crash takeover, the holder's alloc_id following the lock within two
// scrapes, and the "no holder" alert firing when a job's only holder stops
// and clearing when one starts.
func TestMetricsPrometheus(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	pluginAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	opts := drvAgentOptions(t, true)
	opts.Config[0] = harness.SingletonPluginConfigWith(drvTTLHCL, drvDelayHCL, fmt.Sprintf("metrics_addr = %q", pluginAddr))
	a := harness.StartAgent(t, opts)
	prom := harness.StartPrometheus(t, harness.PrometheusOptions{ScrapeInterval: promInterval,
		Jobs:  map[string][]string{"plugin": {pluginAddr}, "lock": nil},
		Rules: []string{testRules(t)}})
	runConcurrently(t, []subtest{
		{"driver_handover_and_crash", func(t *testing.T) { testMetricsDriver(t, a, prom, pluginAddr) }},
		{"lock_handover_and_crash", func(t *testing.T) { testMetricsLock(t, a, prom) }},
		{"no_holder_alert", func(t *testing.T) { testMetricsNoHolderAlert(t, a, prom) }},
	})
}

// testRules are examples/monitoring's rules with SingletonNoHolder's `for`
// cut to 3s, for a test that cannot wait a minute.
func testRules(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", "monitoring", "singleton-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	rules := string(b)
	i := strings.Index(rules, "alert: SingletonNoHolder")
	j := strings.Index(rules[i:], "for: 1m")
	if i < 0 || j < 0 {
		t.Fatal("singleton-rules.yml: no SingletonNoHolder with for: 1m")
	}
	return rules[:i+j] + "for: 3s" + rules[i+j+len("for: 1m"):]
}

// after matches a start record later than r's.
func after(r harness.Record) func(harness.Record) bool {
	return func(n harness.Record) bool { return n.Instance != r.Instance && n.Mono > r.Mono }
}

// holders are the alloc_ids Prometheus shows holding job's lock now.
func holders(t *testing.T, prom *harness.Prometheus, job string) []string {
	var out []string
	for _, s := range prom.Query(t, fmt.Sprintf(`nomad_singleton_lock_held{job=%q} == 1`, job)) {
		out = append(out, s.Metric["alloc_id"])
	}
	return out
}

// waitOneHolder waits until Prometheus shows job's lock held by allocID
// alone, summed to 1.
func waitOneHolder(t *testing.T, prom *harness.Prometheus, job, allocID string, timeout time.Duration) {
	t.Helper()
	prom.WaitQuery(t, "held by "+drvShort(allocID)+" alone", fmt.Sprintf(`sum(nomad_singleton_lock_held{job=%q})`, job), timeout,
		func(s []harness.PromSample) bool {
			h := holders(t, prom, job)
			return len(s) == 1 && s[0].Value == 1 && len(h) == 1 && h[0] == allocID
		})
}

// checkFollows checks that Prometheus's first sample of allocID holding
// job's lock in this tenure (from a scrape interval before start on: the
// acquire comes just before the workload's start) was scraped within two
// scrape intervals of start, the moment its workload started under the
// lock.
func checkFollows(t *testing.T, prom *harness.Prometheus, job, allocID string, start time.Time) {
	t.Helper()
	series := prom.Query(t, fmt.Sprintf(`nomad_singleton_lock_held{job=%q,alloc_id=%q}[5m]`, job, allocID))
	for _, s := range series {
		for _, p := range s.Values {
			if p.Value != 1 || p.Time.Before(start.Add(-promInterval)) {
				continue
			}
			lag := p.Time.Sub(start)
			t.Logf("MEASURE %s_holder_label_after_start=%s", job, harness.Millis(lag))
			if lag > 2*promInterval {
				t.Errorf("Prometheus first saw %s hold %s's lock %s after its workload started, more than two scrape intervals (%s)",
					drvShort(allocID), job, lag, 2*promInterval)
			}
			return
		}
	}
	t.Errorf("no sample of %s holding %s's lock: %+v", drvShort(allocID), job, series)
}

// testMetricsDriver: a count=2 singleton job, scraped through the plugin:
// a graceful stop of the holder, then a SIGKILL of the next holder's
// supervisor. (The first holder's label is not timed: Prometheus may find
// its series only as it first scrapes the plugin.)
func testMetricsDriver(t *testing.T, a *harness.Agent, prom *harness.Prometheus, pluginAddr string) {
	j, first := crashJob(t, a, "metrics", nil)
	waitOneHolder(t, prom, j.id, first.AllocID, 30*time.Second)

	// A graceful handover to the standby.
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatal(err)
	}
	second := j.waitStart(t, 60*time.Second, after(first))
	waitOneHolder(t, prom, j.id, second.AllocID, 30*time.Second)
	checkFollows(t, prom, j.id, second.AllocID, second.Wall)
	// The standby saw the previous holder's release recorded.
	prom.WaitQuery(t, "the acquisition counted after a release",
		fmt.Sprintf(`nomad_singleton_lock_acquisitions_total{job=%q,alloc_id=%q,reason="released"}`, j.id, second.AllocID), 30*time.Second,
		func(s []harness.PromSample) bool { return len(s) == 1 && s[0].Value == 1 })

	// A crash: the plugin proves the task dead and releases for it.
	for _, id := range drvRunning(t, a, j.id) {
		if id != second.AllocID {
			drvWaitEvent(t, a, id, 60*time.Second, "Waiting for lock", "held by alloc "+drvShort(second.AllocID))
		}
	}
	sup := drvSupervisor(t, second.AllocID)
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	third := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, after(second))
	waitOneHolder(t, prom, j.id, third.AllocID, 30*time.Second)
	checkFollows(t, prom, j.id, third.AllocID, third.Wall)
	prom.WaitQuery(t, "the plugin's crash release counted",
		fmt.Sprintf(`nomad_singleton_plugin_crash_releases_total{job=%q,alloc_id=%q,result="released"}`, j.id, second.AllocID), 30*time.Second,
		func(s []harness.PromSample) bool { return len(s) == 1 && s[0].Value == 1 })

	metrics := harness.Scrape(t, pluginAddr)
	promtooltest.CheckMetrics(t, metrics)
	checkNoSecret(t, a, "the plugin's /metrics", string(metrics), j.lockPath())
}

// testMetricsLock: a count=2 raw_exec job of `lock -http-addr`, each
// allocation's endpoint scraped: a graceful stop of the holder, then a
// SIGKILL of the next holder's lock (its lock expires on the server).
func testMetricsLock(t *testing.T, a *harness.Agent, prom *harness.Prometheus) {
	s := newScenario(t, "metrics")
	g := s.lockGroup(t, 2, []string{"-http-addr", "${NOMAD_ADDR_metrics}"}, nil)
	g.extra = "network {\n      port \"metrics\" {}\n    }"
	a.RunJobHCL(t, jobHCL(s.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.job) })
	targets := lockTargets(t, a, prom, s.job, 2)
	first := waitMainStart(t, s.record, 60*time.Second, nil)
	waitOneHolder(t, prom, s.job, first.AllocID, 30*time.Second)

	// /holder: 200 on the holder, 503 on the standby; no secret.
	for alloc, addr := range targets {
		code, body := harness.HTTPGet(t, "http://"+addr+"/holder")
		want := http.StatusServiceUnavailable
		if alloc == first.AllocID {
			want = http.StatusOK
			var h struct {
				Held  bool
				Fence uint64
				Path  string
			}
			if err := json.Unmarshal([]byte(body), &h); err != nil || !h.Held || fmt.Sprint(h.Fence) != first.Fence || h.Path != s.path {
				t.Errorf("/holder of the holder: %s (%v); want fence %s", body, err, first.Fence)
			}
		}
		if code != want {
			t.Errorf("/holder of %s: %d %s, want %d", drvShort(alloc), code, body, want)
		}
		checkNoSecret(t, a, "/holder", body, s.path)
	}
	metrics := harness.Scrape(t, targets[first.AllocID])
	promtooltest.CheckMetrics(t, metrics)
	checkNoSecret(t, a, "lock's /metrics", string(metrics), s.path)

	// A graceful handover.
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatal(err)
	}
	second := waitMainStart(t, s.record, 60*time.Second, after(first))
	waitOneHolder(t, prom, s.job, second.AllocID, 30*time.Second)
	checkFollows(t, prom, s.job, second.AllocID, second.Wall)
	lockTargets(t, a, prom, s.job, 2) // the replacement allocation's endpoint

	// A crash of lock itself: its workload dies with it, and the lock
	// expires on the server (2×TTL + delay).
	proc, _ := lockOf(t, s.marker, second.PID)
	if err := syscall.Kill(proc.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	third := waitMainStart(t, s.record, 2*drvTTL+drvDelay+30*time.Second, after(second))
	waitOneHolder(t, prom, s.job, third.AllocID, 60*time.Second)
	checkFollows(t, prom, s.job, third.AllocID, third.Wall)
}

// lockTargets waits until n allocations of job run and are meant to (an
// allocation being stopped reports "running" until its task ends, and
// would hide its replacement's endpoint), points Prometheus's "lock" job at
// their metrics ports, and returns them by allocation.
func lockTargets(t *testing.T, a *harness.Agent, prom *harness.Prometheus, job string, n int) map[string]string {
	t.Helper()
	var ids []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		allocs, err := a.Allocs(job)
		ids = ids[:0]
		for _, al := range allocs {
			if al.ClientStatus == api.AllocClientStatusRunning && al.DesiredStatus == api.AllocDesiredStatusRun {
				ids = append(ids, al.ID)
			}
		}
		if err == nil && len(ids) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d allocations running and meant to, want %d, after 60s (err %v)", job, len(ids), n, err)
		}
	}
	out := map[string]string{}
	var addrs []string
	for _, id := range ids {
		alloc, _, err := a.API().Allocations().Info(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range alloc.AllocatedResources.Shared.Ports {
			if p.Label == "metrics" {
				addr := fmt.Sprintf("%s:%d", p.HostIP, p.Value)
				out[id] = addr
				addrs = append(addrs, addr)
			}
		}
	}
	prom.SetTargets(t, "lock", addrs...)
	return out
}

// testMetricsNoHolderAlert: a job's only holder is stopped with no standby:
// the (test copy of the) SingletonNoHolder alert fires, and clears once the
// job runs again and its new allocation holds the lock.
func testMetricsNoHolderAlert(t *testing.T, a *harness.Agent, prom *harness.Prometheus) {
	j := newDrvJob(t, "noholder", 1)
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	waitOneHolder(t, prom, j.id, first.AllocID, 30*time.Second)
	firing := fmt.Sprintf(`ALERTS{alertname="SingletonNoHolder",alertstate="firing",job=%q}`, j.id)
	if s := prom.Query(t, firing); len(s) != 0 {
		t.Errorf("SingletonNoHolder fires while %s holds the lock: %+v", drvShort(first.AllocID), s)
	}

	if _, _, err := a.API().Jobs().Deregister(j.id, false, nil); err != nil {
		t.Fatal(err)
	}
	j.waitEnd(t, first.Instance, 60*time.Second)
	prom.WaitQuery(t, "SingletonNoHolder firing", firing, 60*time.Second, func(s []harness.PromSample) bool { return len(s) == 1 })

	j.run(t, a)
	next := j.waitStart(t, 60*time.Second, after(first))
	waitOneHolder(t, prom, j.id, next.AllocID, 30*time.Second)
	prom.WaitQuery(t, "SingletonNoHolder cleared", firing, 30*time.Second, func(s []harness.PromSample) bool { return len(s) == 0 })
}

// jwtPattern matches a JWT, as workload identities are.
var jwtPattern = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)

// checkNoSecret fails if text shows a lock ID (the variable's, as the
// management token reads it) or a token.
func checkNoSecret(t *testing.T, a *harness.Agent, what, text, lockPath string) {
	t.Helper()
	if v, _, err := a.API().Variables().Peek(lockPath, nil); err == nil && v != nil && v.Lock != nil && v.Lock.ID != "" &&
		strings.Contains(text, v.Lock.ID) {
		t.Errorf("%s shows the lock ID of %s", what, lockPath)
	}
	if tok := a.Token(); tok != "" && strings.Contains(text, tok) {
		t.Errorf("%s shows the management token", what)
	}
	if jwtPattern.MatchString(text) {
		t.Errorf("%s shows a workload identity token", what)
	}
}
