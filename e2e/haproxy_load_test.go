package e2e

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
)

// The failover load test: what a user of the demo does, many times over,
// with traffic. Debian's HAProxy 2.6.12 used to crash in it (deleting a
// dynamic server a stream still referred to); the LB API now re-points
// fixed server slots instead.
const (
	// loadFailovers alternate `nomad alloc stop` of the holder and SIGKILL
	// of its supervisor.
	loadFailovers = 20
	// loadClients keep-alive clients send requests the whole time.
	loadClients = 4
	// loadServedBound: from the stop call or the SIGKILL until a client is
	// answered by the new holder. Typically 0.3–0.6 s (release, standby
	// start, a 200 ms health check, the LB API's ADD); the bound leaves room
	// for a 2-core machine shared with other tests.
	loadServedBound = 8 * time.Second
	// loadStandbyWait bounds the wait for a standby before each failover
	// (Nomad placing a replacement, or restarting the killed task).
	loadStandbyWait = 60 * time.Second
)

// failover is one handover of the load test.
type failover struct {
	crash    bool
	from, to string    // alloc IDs
	at       time.Time // the stop call or the SIGKILL
	served   time.Time // when a client first got an answer from `to` (zero: none)
}

// testHAProxyFailoversUnderLoad: loadClients keep-alive clients send
// requests through HAProxy's frontend the whole time while the holder
// changes loadFailovers times, alternately by `nomad alloc stop` and by
// SIGKILL of its supervisor. HAProxy keeps its PID (it never crashed);
// every answer comes from the holder of that moment or its successor (never
// a standby, never an old holder once its successor answered); and after
// each failover a client is answered by the new holder within
// loadServedBound. Failed requests and the longest gap per failover are
// measured, not bounded: a graceful handover removes the old holder before
// the new one is healthy, so HAProxy has no server for a moment.
func testHAProxyFailoversUnderLoad(t *testing.T, a *harness.Agent) {
	j := newHAJob(t, "load", 3, lbapi.DefaultReconcileInterval)
	// A killed supervisor's task restarts at once and waits as a standby.
	j.restart = `      attempts = 100
      interval = "30m"
      delay    = "200ms"
      mode     = "delay"`
	first, _ := j.registered(t, a)
	pid := j.lb.HAProxy.PID()

	tr := startLoadTraffic(t, j.url())
	defer tr.stop()

	holder := first
	var fos []failover
	for i := range loadFailovers {
		j.waitStandby(t, a, holder.AllocID)
		fo := failover{crash: i%2 == 1, from: holder.AllocID}
		var sup harness.Proc
		if fo.crash {
			sup = drvSupervisor(t, holder.AllocID)
		}
		startMono := harness.MonoNow()
		fo.at = time.Now()
		if fo.crash {
			if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
				t.Fatalf("failover %d: kill -9 %d: %v", i+1, sup.PID, err)
			}
		} else if err := a.StopAlloc(holder.AllocID); err != nil {
			t.Fatalf("failover %d: stop %s: %v", i+1, drvShort(holder.AllocID), err)
		}
		next := j.waitStart(t, loadServedBound, func(r harness.Record) bool { return r.Mono > startMono && r.Instance != holder.Instance })
		fo.to = next.AllocID
		// Every client, on its kept-alive connection, reaches the new holder.
		tr.waitAllAnswered(t, "alloc "+next.AllocID, fo.at, loadServedBound)
		select {
		case <-j.lb.HAProxy.Done():
			t.Fatalf("failover %d: HAProxy exited:\n%s", i+1, j.lb.HAProxy.Log())
		default:
		}
		t.Logf("failover %d (%s): %s → %s served after %s", i+1, fo.kind(), drvShort(fo.from), drvShort(fo.to), time.Since(fo.at).Round(time.Millisecond))
		fos = append(fos, fo)
		holder = next
	}
	all := tr.stop()

	if got := j.lb.HAProxy.PID(); got != pid {
		t.Errorf("HAProxy pid %d, was %d: it restarted", got, pid)
	}
	loadServed(fos, all)
	loadCheckAnswers(t, first.AllocID, fos, all)
	loadReport(t, fos, all)
}

// loadTraffic is loadClients clients, each sending one request at a time
// through HAProxy every 10 ms on a kept-alive connection, until stop.
type loadTraffic struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	byC    [][]harness.ProbeResult // per client, in order
}

func startLoadTraffic(t *testing.T, url string) *loadTraffic {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	tr := &loadTraffic{cancel: cancel, byC: make([][]harness.ProbeResult, loadClients)}
	for c := range loadClients {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			// Bounded by count and by ctx; stop ends it.
			harness.Probe(ctx, url, harness.ProbeOptions{Interval: 10 * time.Millisecond, Max: 100_000, Timeout: 10 * time.Second,
				Until: func(rs []harness.ProbeResult) bool {
					if len(rs) > 0 {
						tr.mu.Lock()
						tr.byC[c] = append(tr.byC[c], rs[len(rs)-1])
						tr.mu.Unlock()
					}
					return false
				}})
		}()
	}
	return tr
}

// waitAllAnswered waits until every client got body in answer to a
// request it sent at or after since.
func (tr *loadTraffic) waitAllAnswered(t *testing.T, body string, since time.Time, timeout time.Duration) {
	t.Helper()
	deadline := since.Add(timeout)
	for {
		n := 0
		tr.mu.Lock()
		for _, rs := range tr.byC {
			if slices.ContainsFunc(rs, func(r harness.ProbeResult) bool { return r.OK() && r.Body == body && !r.Start.Before(since) }) {
				n++
			}
		}
		tr.mu.Unlock()
		if n == loadClients {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d clients answered %q within %s", n, loadClients, body, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the clients and returns every result, by start time.
func (tr *loadTraffic) stop() []harness.ProbeResult {
	tr.cancel()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var all []harness.ProbeResult
	for _, rs := range tr.byC {
		all = append(all, rs...)
	}
	slices.SortFunc(all, func(x, y harness.ProbeResult) int { return x.Start.Compare(y.Start) })
	return all
}

func (f failover) kind() string {
	if f.crash {
		return "SIGKILL supervisor"
	}
	return "alloc stop"
}

// waitStandby waits until an allocation other than the holder's waits for
// the lock (its "Waiting for lock" event names the holder).
func (j *haJob) waitStandby(t *testing.T, a *harness.Agent, holder string) {
	t.Helper()
	deadline := time.Now().Add(loadStandbyWait)
	for {
		for _, id := range drvRunning(t, a, j.id) {
			if id != holder && len(drvMatching(drvEvents(t, a, id), "Waiting for lock", "held by alloc "+drvShort(holder))) > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no allocation waits for the lock held by %s after %s (running: %v)", drvShort(holder), loadStandbyWait, drvRunning(t, a, j.id))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loadServed sets each failover's served: the earliest end of a request,
// sent after the failover began, that the new holder answered. (A request
// sent to the dead holder just after a SIGKILL is retried and may be
// answered by its successor a second later: its start says nothing.)
func loadServed(fos []failover, all []harness.ProbeResult) {
	for k := range fos {
		for _, r := range all {
			if r.OK() && r.Body == "alloc "+fos[k].to && !r.Start.Before(fos[k].at) && (fos[k].served.IsZero() || r.End.Before(fos[k].served)) {
				fos[k].served = r.End
			}
		}
	}
}

// loadCheckAnswers: the successor of holder k first answered a client at
// fos[k].served; a request that started before that must be answered by
// holder k or its successor, one that started after it by the successor or
// the one after (never a standby, never an old holder again).
func loadCheckAnswers(t *testing.T, first string, fos []failover, all []harness.ProbeResult) {
	t.Helper()
	holders := []string{first}
	for _, f := range fos {
		holders = append(holders, f.to)
	}
	wrong := 0
	for _, r := range all {
		if !r.OK() {
			continue
		}
		era := 0
		for era < len(fos) && !fos[era].served.IsZero() && !r.Start.Before(fos[era].served) {
			era++
		}
		ok := r.Body == "alloc "+holders[era] || (era+1 < len(holders) && r.Body == "alloc "+holders[era+1])
		if !ok {
			wrong++
			if wrong <= 5 {
				t.Errorf("request at %s answered %q; the holder then was %s (successor %s)", r.Start.Format("15:04:05.000"), r.Body,
					drvShort(holders[era]), drvShort(holders[min(era+1, len(holders)-1)]))
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d answers from neither the holder of the moment nor its successor", wrong)
	}
}

// loadReport checks the bound per failover and logs what the clients saw.
func loadReport(t *testing.T, fos []failover, all []harness.ProbeResult) {
	t.Helper()
	var lines []string
	var worst time.Duration
	failed := map[bool][]int{}
	gaps := map[bool][]time.Duration{}
	for k, f := range fos {
		end := time.Now()
		if k+1 < len(fos) {
			end = fos[k+1].at
		}
		// From the last answer before the failover, so that a gap that
		// begins with it is measured.
		var window []harness.ProbeResult
		for _, r := range all {
			switch {
			case r.Start.Before(f.at) && r.OK():
				window = append(window[:0], r)
			case r.Start.Before(f.at):
			case r.Start.Before(end):
				window = append(window, r)
			}
		}
		sum := harness.Summarize(window)
		took := "never"
		if !f.served.IsZero() {
			d := f.served.Sub(f.at)
			took, worst = d.Round(time.Millisecond).String(), max(worst, d)
			if d > loadServedBound {
				t.Errorf("failover %d (%s): the new holder %s answered %s after it, want within %s", k+1, f.kind(), drvShort(f.to), d, loadServedBound)
			}
		} else {
			t.Errorf("failover %d (%s): no client got an answer from the new holder %s", k+1, f.kind(), drvShort(f.to))
		}
		failed[f.crash] = append(failed[f.crash], sum.Failed)
		gaps[f.crash] = append(gaps[f.crash], sum.LongestGap)
		lines = append(lines, fmt.Sprintf("%2d %-18s %s→%s new holder answered after %-7s %4d requests, %3d failed, longest gap %s %s",
			k+1, f.kind(), drvShort(f.from), drvShort(f.to), took, sum.Requests, sum.Failed, sum.LongestGap.Round(time.Millisecond), sum.FirstFail))
	}
	sum := harness.Summarize(all)
	t.Logf("%d failovers, %d clients: %d requests, %d failed\n%s", len(fos), loadClients, sum.Requests, sum.Failed, strings.Join(lines, "\n"))
	harness.Measure(t, "haproxy_load_requests", sum.Requests)
	harness.Measure(t, "haproxy_load_failed_requests", sum.Failed)
	harness.Measure(t, "haproxy_load_worst_to_new_holder_answers", worst)
	for _, crash := range []bool{false, true} {
		name := "graceful"
		if crash {
			name = "crash"
		}
		harness.Measure(t, "haproxy_load_"+name+"_failed_requests_median", medianInt(failed[crash]))
		harness.Measure(t, "haproxy_load_"+name+"_failed_requests_worst", slices.Max(failed[crash]))
		harness.Measure(t, "haproxy_load_"+name+"_longest_gap_median", medianDur(gaps[crash]))
		harness.Measure(t, "haproxy_load_"+name+"_longest_gap_worst", slices.Max(gaps[crash]))
	}
}

func medianInt(xs []int) int {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

func medianDur(xs []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
