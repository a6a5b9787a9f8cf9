package e2e

// End-to-end tests of "the singleton is behind the load balancer" as a user
// sees it: the singleton driver on a real Nomad dev agent, the reference LB
// API driving a real HAProxy (examples/lbapi's HAProxy backend), and a
// client loop (harness.Probe) sending requests through HAProxy's frontend.
// The testworkload answers "alloc <its alloc ID>", so every answer names the
// allocation that served it.
//
// Measured numbers are logged as `MEASURE name=value` lines:
//
//	go -C e2e test . -run 'TestHAProxy' -count=1 -v | grep MEASURE

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
)

// TestHAProxy runs every HAProxy scenario concurrently on one dev agent;
// each has its own HAProxy and LB API, since one of them restarts HAProxy.
func TestHAProxy(t *testing.T) {
	t.Parallel()
	harness.Smoke(t, "graceful_handover", "crash_swaps_upstream")
	haproxytest.Binary(t) // fails here, before an agent starts, if haproxy is missing
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))

	runConcurrently(t, []subtest{
		{"only_the_holder_answers", func(t *testing.T) { testHAProxyOnlyHolderAnswers(t, a) }},
		{"graceful_handover", func(t *testing.T) { testHAProxyGracefulHandover(t, a) }},
		{"crash_swaps_upstream", func(t *testing.T) { testHAProxyCrashSwapsUpstream(t, a) }},
		{"restart_reconciled_by_lbapi", func(t *testing.T) { testHAProxyRestart(t, a, lbapi.DefaultReconcileInterval) }},
		{"restart_repaired_by_recheck", func(t *testing.T) { testHAProxyRestart(t, a, -1) }},
		{"failovers_under_load", func(t *testing.T) { testHAProxyFailoversUnderLoad(t, a) }},
	})
}

// haJob is an lbJob whose LB API drives a real HAProxy with a backend for
// the job's service, routed by its base path.
type haJob struct {
	*lbJob
	lb *harness.HAProxyLB
}

// newHAJob starts HAProxy and the LB API for a new job (not yet run).
// reconcile is the LB API's ReconcileInterval.
func newHAJob(t *testing.T, name string, count int, reconcile time.Duration) *haJob {
	j := newLBJob(t, nil, "ha-"+name, count)
	lb := harness.StartHAProxyLB(t, lbapi.Options{
		Groups:            []lbapi.Group{{Name: lbGroup}},
		WorkerInterval:    lbWorkerInterval,
		ReconcileInterval: reconcile,
	}, haproxy.Service{Backend: haproxy.Name(j.service), PathPrefix: j.basePath()})
	j.lb = lb.LB
	return &haJob{lbJob: j, lb: lb}
}

// url is the service behind HAProxy's frontend.
func (j *haJob) url() string { return j.lb.HAProxy.URL + j.basePath() + "/" }

// waitServing waits until HAProxy serves exactly the upstream up (one ready
// slot) and a request through it is answered by allocID.
func (j *haJob) waitServing(t *testing.T, up, allocID string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ready := j.lb.Servers(t, j.service)
		if slices.Equal(ready, []string{up}) {
			rs := harness.Probe(context.Background(), j.url(), harness.ProbeOptions{Max: 1})
			if len(rs) == 1 && rs[0].OK() && rs[0].Body == "alloc "+allocID {
				return
			}
		}
		if time.Now().After(deadline) {
			rs := harness.Probe(context.Background(), j.url(), harness.ProbeOptions{Max: 1})
			t.Fatalf("HAProxy backend of %s: ready servers %q after %s, want exactly [%s] answering alloc %s; a request got %+v; LB requests:\n%s",
				j.service, ready, timeout, up, drvShort(allocID), rs, lbFormatRequests(j.lb.Requests(j.service)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// registered runs the job and waits until its first holder is registered
// and served by HAProxy; it returns the holder's start record and upstream.
func (j *haJob) registered(t *testing.T, a *harness.Agent) (harness.Record, string) {
	t.Helper()
	j.run(t, a)
	first := j.lbHolder(t, a)
	up := lbUpstreamOf(t, a, first.AllocID)
	lbWaitSuccess(t, j.lb.LB, lbAddID(first.AllocID, drvFence(t, first)), 30*time.Second)
	j.waitServing(t, up, first.AllocID, 10*time.Second)
	return first, up
}

// testHAProxyOnlyHolderAnswers: with three allocations, every request
// through HAProxy over three re-check intervals is answered by the holder,
// never by a standby, and HAProxy holds exactly one server.
func testHAProxyOnlyHolderAnswers(t *testing.T, a *harness.Agent) {
	j := newHAJob(t, "holder", 3, lbapi.DefaultReconcileInterval)
	first, up := j.registered(t, a)
	standbys := slices.DeleteFunc(drvRunning(t, a, j.id), func(id string) bool { return id == first.AllocID })
	if len(standbys) != 2 {
		t.Fatalf("want 2 standbys besides %s, running: %v", drvShort(first.AllocID), drvRunning(t, a, j.id))
	}

	rs := harness.Probe(context.Background(), j.url(), harness.ProbeOptions{Interval: 10 * time.Millisecond, Max: 100_000,
		Until: func(rs []harness.ProbeResult) bool {
			return len(rs) > 0 && rs[len(rs)-1].Start.Sub(rs[0].Start) > 3*lbRecheck
		}})
	sum := harness.Summarize(rs)
	t.Logf("%d requests through HAProxy over %s: %d failed, answers %q", sum.Requests, rs[len(rs)-1].End.Sub(rs[0].Start).Round(time.Millisecond), sum.Failed, sum.Answers)
	if want := []string{"alloc " + first.AllocID}; sum.Failed != 0 || !slices.Equal(sum.Answers, want) {
		t.Errorf("want every request answered by the holder %s; %d failed (first: %s), answers %q", drvShort(first.AllocID), sum.Failed, sum.FirstFail, sum.Answers)
	}
	for _, s := range standbys {
		if slices.Contains(sum.Answers, "alloc "+s) {
			t.Errorf("standby %s answered through HAProxy", drvShort(s))
		}
	}
	if ready := j.lb.Servers(t, j.service); !slices.Equal(ready, []string{up}) {
		t.Errorf("HAProxy backend has %q, want exactly [%s]", ready, up)
	}
}

// testHAProxyGracefulHandover: a client loop runs through HAProxy while
// the holder's allocation is stopped. Answers come from the old holder,
// then only from the new one (never the old one again, never a third); the
// loop counts the failed requests and the longest stretch with no backend.
// The old holder is removed before it is signalled and the new one added
// once healthy, so the gap is expected; it is measured, with a loose bound.
func testHAProxyGracefulHandover(t *testing.T, a *harness.Agent) {
	j := newHAJob(t, "handover", 2, lbapi.DefaultReconcileInterval)
	first, _ := j.registered(t, a)
	holder := "alloc " + first.AllocID

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type out struct{ rs []harness.ProbeResult }
	done := make(chan out, 1)
	answered := make(chan struct{}) // closed at the holder's first answer
	var once sync.Once
	go func() {
		// Ends after 200 answers (1 s) from someone other than the first
		// holder, or at 12,000 requests (60 s).
		rs := harness.Probe(ctx, j.url(), harness.ProbeOptions{Max: 12_000, Until: func(rs []harness.ProbeResult) bool {
			if len(rs) > 0 && rs[len(rs)-1].OK() && rs[len(rs)-1].Body == holder {
				once.Do(func() { close(answered) })
			}
			n := 0
			for i := len(rs) - 1; i >= 0 && rs[i].OK() && rs[i].Body != holder; i-- {
				n++
			}
			return n >= 200
		}})
		done <- out{rs}
	}()
	// The loop must have been answered by the holder before it is stopped.
	select {
	case <-answered:
	case <-ctx.Done():
		t.Fatalf("the client loop got no answer from the holder within 60s")
	}
	stopped := time.Now()
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatal(err)
	}
	rs := (<-done).rs
	sum := harness.Summarize(rs)
	next := j.waitStart(t, 10*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	want := []string{holder, "alloc " + next.AllocID}

	var firstNew time.Time
	for _, r := range rs {
		if r.OK() && r.Body == want[1] {
			firstNew = r.Start
			break
		}
	}
	t.Logf("client loop: %d requests, %d failed (first: %s), answers %q", sum.Requests, sum.Failed, sum.FirstFail, sum.Answers)
	harness.Measure(t, "haproxy_handover_failed_requests", sum.Failed)
	harness.Measure(t, "haproxy_handover_longest_gap", sum.LongestGap)
	if !firstNew.IsZero() {
		harness.Measure(t, "haproxy_handover_stop_to_new_holder_answers", firstNew.Sub(stopped))
	}
	if !slices.Equal(sum.Answers, want) || sum.Switches != 1 {
		t.Errorf("answers %q with %d switches, want %q in that order with one switch (never a standby, never the old holder after the new)",
			sum.Answers, sum.Switches, want)
	}
	if bound := 15 * time.Second; sum.LongestGap > bound {
		t.Errorf("no backend for %s, want under %s", sum.LongestGap, bound)
	}
	j.waitServing(t, lbUpstreamOf(t, a, next.AllocID), next.AllocID, 5*time.Second)
}

// testHAProxyCrashSwapsUpstream: the holder's supervisor is SIGKILLed (its
// workload dies with it). The dead upstream is swapped out by the new
// holder's request (or already removed by the plugin on the dead
// supervisor's behalf), and HAProxy ends with exactly one server: the new
// holder, which answers.
func testHAProxyCrashSwapsUpstream(t *testing.T, a *harness.Agent) {
	j := newHAJob(t, "crash", 2, lbapi.DefaultReconcileInterval)
	first, up1 := j.registered(t, a)
	sup := drvSupervisor(t, first.AllocID)

	killed := time.Now()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", sup.PID, err)
	}
	next := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	up2 := lbUpstreamOf(t, a, next.AllocID)
	add := lbWaitSuccess(t, j.lb.LB, lbAddID(next.AllocID, drvFence(t, next)), 30*time.Second)
	if !slices.Equal(add.AddUpstreams, []string{up2}) || !slices.Contains(add.RemoveUpstreams, up1) {
		t.Errorf("new holder's request adds %q and removes %q, want add [%s] and remove the dead %s", add.AddUpstreams, add.RemoveUpstreams, up2, up1)
	}
	j.waitServing(t, up2, next.AllocID, 10*time.Second)
	harness.Measure(t, "haproxy_crash_to_new_holder_served", time.Since(killed))
	// A re-check interval later, still exactly the new holder.
	time.Sleep(lbRecheck + 500*time.Millisecond)
	if ready := j.lb.Servers(t, j.service); !slices.Equal(ready, []string{up2}) {
		t.Errorf("HAProxy backend has %q, want exactly the new holder [%s]", ready, up2)
	}
	rs := harness.Probe(context.Background(), j.url(), harness.ProbeOptions{Interval: 10 * time.Millisecond, Max: 20})
	if sum := harness.Summarize(rs); sum.Failed != 0 || !slices.Equal(sum.Answers, []string{"alloc " + next.AllocID}) {
		t.Errorf("through HAProxy: %d failed, answers %q; want all from %s", sum.Failed, sum.Answers, drvShort(next.AllocID))
	}
}

// testHAProxyRestart: HAProxy is restarted under the LB API and
// comes back with every server slot in maintenance. With reconcile > 0 the LB API's
// reconcile loop puts the holder back; with reconcile < 0 the loop is off
// and the holder's next re-check (GET /state, which repairs what it reads)
// does. Either way HAProxy then serves exactly the holder, and still does
// after the supervisor's next re-check, with no failed request.
func testHAProxyRestart(t *testing.T, a *harness.Agent, reconcile time.Duration) {
	name := "restart-loop"
	if reconcile < 0 {
		name = "restart-recheck"
	}
	j := newHAJob(t, name, 2, reconcile)
	first, up := j.registered(t, a)
	drvWaitEvent(t, a, first.AllocID, 10*time.Second, "Registered "+up)

	restarted := time.Now()
	j.lb.HAProxy.Restart(t)
	if ready := j.lb.Servers(t, j.service); slices.Contains(ready, up) {
		t.Logf("HAProxy already served %s again when the restart returned", up)
	}
	// The loop runs every second; a supervisor re-check every lbRecheck.
	bound := lbRecheck + 5*time.Second
	if reconcile > 0 {
		bound = reconcile + 5*time.Second
	}
	j.waitServing(t, up, first.AllocID, bound)
	took := time.Since(restarted)
	harness.Measure(t, "haproxy_"+strings.ReplaceAll(name, "-", "_")+"_to_served", took)

	// The next re-check leaves HAProxy correct.
	time.Sleep(lbRecheck + time.Second)
	if ready := j.lb.Servers(t, j.service); !slices.Equal(ready, []string{up}) {
		t.Errorf("after a re-check HAProxy has %q, want exactly [%s]", ready, up)
	}
	_, _, names := lbHTTPState(t, j.lb.LB, j.service)
	if !slices.Equal(names, []string{up}) {
		t.Errorf("GET /state lists %q, want [%s]", names, up)
	}
	for _, r := range j.lb.Requests(j.service) {
		if r.State != "SUCCESS" {
			t.Errorf("request %s ended %s: %s", r.ID, r.State, r.Message)
		}
	}
	if evs := drvMatching(drvEvents(t, a, first.AllocID), "LB add failed"); len(evs) > 0 {
		t.Errorf("holder's LB add failed:\n%s", drvFormatEvents(evs))
	}
	rs := harness.Probe(context.Background(), j.url(), harness.ProbeOptions{Interval: 10 * time.Millisecond, Max: 20})
	if sum := harness.Summarize(rs); sum.Failed != 0 || !slices.Equal(sum.Answers, []string{"alloc " + first.AllocID}) {
		t.Errorf("through HAProxy: %d failed, answers %q; want all from the holder %s", sum.Failed, sum.Answers, drvShort(first.AllocID))
	}
	t.Logf("%s: HAProxy served the holder again %s after the restart began", fmt.Sprint(name), took.Round(time.Millisecond))
}
