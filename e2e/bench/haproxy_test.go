package bench

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
)

// haproxyWorker is the LB API's worker period in this scenario.
const haproxyWorker = 50 * time.Millisecond

// haproxyVariants are the variants with LB integration.
var haproxyVariants = []string{VariantLock, VariantDriver}

// haproxy measures graceful handover as a client sees it through a real
// HAProxy (section TitleHAProxy): see Methods[TitleHAProxy].
func (b *bench) haproxy(t *testing.T) {
	const prefix = "alloc stop in a count = 2 group: "
	b.rep.Add(&Row{Scenario: TitleHAProxy, Metric: prefix + "what a client sees through HAProxy", Variant: VariantAnchor,
		Status: "n/a: nomad var lock has no LB integration"})
	if _, err := haproxy.Binary(); err != nil {
		r := &Row{Scenario: TitleHAProxy, Metric: prefix + "what a client sees through HAProxy", Variant: "(b) lock, (c) singleton driver",
			Status: "not measured: haproxy not installed (make haproxy, or apt-get install -y haproxy)"}
		b.rep.Add(r)
		b.rep.Note("HAProxy scenario skipped: haproxy is not installed and could not be installed here (%v).", err)
		b.progress("HAProxy: %s", r.Status)
		return
	}
	type rows struct{ failed, gap, first, wrong *Row }
	phases := []struct {
		crash       bool
		prefix, act string
		rs          map[string]*rows
	}{
		{false, prefix, "stop call", map[string]*rows{}},
		{true, "SIGKILL to the holder's supervisor in a count = 2 group: ", "SIGKILL", map[string]*rows{}},
	}
	for _, ph := range phases {
		for _, v := range haproxyVariants {
			ph.rs[v] = &rows{failed: b.row(TitleHAProxy, ph.prefix+"failed requests", v, Count, AggStats, nil)}
		}
		for _, v := range haproxyVariants {
			ph.rs[v].gap = b.row(TitleHAProxy, ph.prefix+"longest stretch with no backend", v, Seconds, AggStats, nil)
		}
		for _, v := range haproxyVariants {
			ph.rs[v].first = b.row(TitleHAProxy, ph.prefix+ph.act+" → first answer from the new holder", v, Seconds, AggStats, nil)
		}
		for _, v := range haproxyVariants {
			ph.rs[v].wrong = b.row(TitleHAProxy, ph.prefix+"runs with a wrong answer (not the holder or its successor, or the old after the new)",
				v, Count, AggSum, Zero("a standby's workload does not run; the old holder is removed before it is signalled, or dies with its supervisor"))
		}
	}

	jobs := map[string]*job{}
	var services []haproxy.Service
	for _, v := range haproxyVariants {
		j := b.newJob("haproxy", v, 2)
		j.lbService = j.id
		jobs[v] = j
		services = append(services, haproxy.Service{Backend: haproxy.Name(j.lbService), PathPrefix: "/" + j.lbService})
	}
	lb := harness.StartHAProxyLB(t, lbapi.Options{Groups: []lbapi.Group{{Name: lbGroup}}, WorkerInterval: haproxyWorker}, services...)
	for _, v := range haproxyVariants {
		jobs[v].lbURI = lb.URI
	}
	b.progress("HAProxy on %s, driven by the LB API (worker every %s)", lb.HAProxy.URL, haproxyWorker)

	// One variant at a time: sub-second gaps on 2 cores. Graceful runs,
	// then crash runs, on one job.
	pid := lb.HAProxy.PID()
	for _, v := range haproxyVariants {
		t.Run(slug(v), func(t *testing.T) {
			g, c := phases[0].rs[v], phases[1].rs[v]
			b.haproxyHandovers(t, jobs[v], lb.HAProxy.URL+"/"+jobs[v].lbService+"/",
				[2][4]*Row{{g.failed, g.gap, g.first, g.wrong}, {c.failed, c.gap, c.first, c.wrong}})
		})
	}
	if got := lb.HAProxy.PID(); got != pid {
		b.rep.Note("HAProxy scenario: HAProxy's pid changed from %d to %d: it crashed and was restarted.", pid, got)
		t.Errorf("HAProxy pid %d, was %d", got, pid)
	}
}

// haproxyHandovers runs b.cfg.Runs graceful handovers (alloc stop), then
// as many crashes (SIGKILL to the holder's supervisor), each with a client
// loop through HAProxy; rows[0] and rows[1] are their failed, gap, first and
// wrong rows.
func (b *bench) haproxyHandovers(t *testing.T, j *job, url string, rows [2][4]*Row) {
	hcl := b.haproxyHCL(j)
	parsed, err := b.a.API().Jobs().ParseHCL(hcl, true)
	if err != nil {
		t.Fatalf("parse job %s: %v\n%s", j.id, err, hcl)
	}
	if _, _, err := b.a.API().Jobs().Register(parsed, nil); err != nil {
		t.Fatalf("register job %s: %v", j.id, err)
	}
	defer b.stopJob(t, j, 30*time.Second)
	holder := waitStart(t, j.record, 0, 90*time.Second)
	waitAnswer(t, url, "alloc "+holder.AllocID, 60*time.Second)

	for i := 0; i < 2*b.cfg.Runs; i++ {
		crash, run := i >= b.cfg.Runs, i%b.cfg.Runs+1
		failed, gap, first, wrong := rows[0][0], rows[0][1], rows[0][2], rows[0][3]
		kind := "graceful"
		if crash {
			failed, gap, first, wrong = rows[1][0], rows[1][1], rows[1][2], rows[1][3]
			kind = "crash"
		}
		b.waitStandbys(t, j, holder.AllocID, 1, 1500*time.Millisecond, 90*time.Second)
		old := "alloc " + holder.AllocID
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		done := make(chan []harness.ProbeResult, 1)
		answered := make(chan struct{}) // closed at the old holder's first answer
		var once sync.Once
		go func() {
			// Until 200 answers in a row (1 s) came from someone else.
			// A request caught on a dead holder is retried by HAProxy for up
			// to ~3 s: the client waits for it, as a real one would.
			done <- harness.Probe(ctx, url, harness.ProbeOptions{Max: 18_000, Timeout: 10 * time.Second, Until: func(rs []harness.ProbeResult) bool {
				if len(rs) > 0 && rs[len(rs)-1].OK() && rs[len(rs)-1].Body == old {
					once.Do(func() { close(answered) })
				}
				n := 0
				for i := len(rs) - 1; i >= 0 && rs[i].OK() && rs[i].Body != old; i-- {
					n++
				}
				return n >= 200
			}})
		}()
		sup := 0
		if crash {
			sup = b.supervisorPID(t, j, holder.AllocID)
		}
		// The client is answered by the holder before it is stopped (an
		// event, not a sleep a busy machine may not honour).
		select {
		case <-answered:
		case <-ctx.Done():
			cancel()
			t.Fatalf("run %d: the client got no answer from the holder within 90s", run)
		}
		stopAt, stopMono := time.Now(), harness.MonoNow()
		if crash {
			if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
				cancel()
				t.Fatalf("SIGKILL supervisor %d: %v", sup, err)
			}
		} else if err := b.a.StopAlloc(holder.AllocID); err != nil {
			cancel()
			t.Fatalf("stop alloc %s: %v", holder.AllocID, err)
		}
		results := <-done
		cancel()
		sum := harness.Summarize(results)
		// (b)'s crash waits for the server to expire the lock: 2×TTL + delay.
		next := waitStart(t, j.record, stopMono, 2*TTL+LockDelay+30*time.Second)
		successor := "alloc " + next.AllocID
		var firstNew time.Time // when the client first got the new holder's answer
		for _, r := range results {
			if r.OK() && r.Body == successor && (firstNew.IsZero() || r.End.Before(firstNew)) {
				firstNew = r.End
			}
		}
		if firstNew.IsZero() {
			t.Fatalf("%s run %d: the client never reached the new holder %s (%d requests, %d failed, answers %q)",
				kind, run, next.AllocID, sum.Requests, sum.Failed, sum.Answers)
		}
		bad := 0.0
		if sum.Switches != 1 || len(sum.Answers) != 2 || sum.Answers[0] != old || sum.Answers[1] != successor {
			bad = 1
			t.Errorf("%s run %d: answers %q with %d switches, want %q then %q", kind, run, sum.Answers, sum.Switches, old, successor)
		}
		add(failed, float64(sum.Failed))
		add(gap, sum.LongestGap.Seconds())
		add(first, firstNew.Sub(stopAt).Seconds())
		add(wrong, bad)
		b.progress("HAProxy %s %s run %d/%d: %d of %d requests failed, longest stretch with no backend %s, stop or kill → new holder answers %s",
			j.variant, kind, run, b.cfg.Runs, sum.Failed, sum.Requests, Seconds.Format(sum.LongestGap.Seconds()), Seconds.Format(firstNew.Sub(stopAt).Seconds()))
		if next.AllocID == holder.AllocID {
			t.Fatalf("%s run %d: the killed allocation took the lock back; its answers cannot be told from the dead holder's", kind, run)
		}
		holder = next
	}
}

// waitAnswer waits until url answers 200 with body want.
func waitAnswer(t *testing.T, url, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rs := harness.Probe(context.Background(), url, harness.ProbeOptions{Max: 1})
		if len(rs) == 1 && rs[0].OK() && rs[0].Body == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer %q after %s: %+v", url, want, timeout, rs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// haproxyHCL is a count = 2 job whose workload serves HTTP on its "http"
// port and registers it with the LB API once a health check passes: (b)
// `lock` with -lb-* and -health-* flags under raw_exec, (c) the driver's
// load_balancer and health_check blocks.
func (b *bench) haproxyHCL(j *job) string {
	wl := append(b.workloadArgs(j.record, j.marker), "-http", "127.0.0.1:${NOMAD_PORT_http}")
	// A task whose supervisor was SIGKILLed comes back as a standby, but
	// only once the other allocation has taken over (for (b), when the
	// server expires the lock): were it to win the lock itself, its answers
	// would carry the same alloc ID as the dead holder's.
	spec := benchJob{ID: j.id, Task: taskName, Count: j.count, Network: true,
		RestartDelay: (2*TTL + LockDelay + 5*time.Second).String()}
	switch j.variant {
	case VariantLock:
		spec.Driver, spec.Command = "raw_exec", b.lockBin
		spec.Args = append([]string{"-lb-uri", j.lbURI, "-lb-service-id", j.lbService, "-lb-base-path", "/" + j.lbService,
			"-lb-groups", lbGroup, "-lb-port", "http", "-health-type", "http", "-health-interval", "200ms"}, lockArgs(j.path)...)
		spec.Args = append(spec.Args, wl...)
	case VariantDriver:
		spec.Driver, spec.Command, spec.Args = harness.PluginDriverName, wl[0], wl[1:]
		driverBlocks(&spec, j)
		spec.HealthCheck = true
	default:
		panic("bench: no HAProxy job for variant " + j.variant)
	}
	return harness.Jobspec("bench", spec)
}
