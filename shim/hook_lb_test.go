package shim

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Table tests of the load balancer's hook (hook_lb.go), one per phase it
// takes part in, each a whole run (Supervisor.Run over the in-memory lock)
// against the reference LB API over real HTTP (examples/lbapi): what the
// load balancer serves, and the run's events and exit code.

// lbPeer is the reference LB API a run registers with, and the run's
// record of its registration (the driver's lb.json).
type lbPeer struct {
	t   *testing.T
	api *lbapi.Server
	ts  *httptest.Server
	rec *lbRecords
	lb  *LoadBalancer
}

// ourUpstream is the run's upstream; prevUpstream the previous holder's.
const (
	ourUpstream  = "127.0.0.1:8080"
	prevUpstream = "127.0.0.1:9090"
)

// startLBAPI serves the reference LB API over HTTP until the test ends.
func startLBAPI(t *testing.T) (*lbapi.Server, *httptest.Server) {
	t.Helper()
	api, err := lbapi.NewServer(lbapi.Options{WorkerInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api)
	t.Cleanup(func() {
		ts.Close()
		_ = api.Close()
	})
	return api, ts
}

// withLB attaches an LB registration to r's run (change adjusts it).
func withLB(t *testing.T, r *runRig, change func(lb *LoadBalancer)) *lbPeer {
	t.Helper()
	api, ts := startLBAPI(t)
	lb := &LoadBalancer{Config: lbhook.Config{URI: api.RequestURL(ts.URL), ServiceID: "web", BasePath: "/web",
		Groups: []string{lbapi.DefaultGroup}, PortLabel: "http", RequestTimeout: time.Second,
		PollInterval: lbhook.MinPollInterval, AddDeadline: 5 * time.Second, RemoveDeadline: 2 * time.Second}.WithDefaults(),
		Upstream: ourUpstream, Recheck: time.Second}
	if change != nil {
		change(lb)
	}
	p := &lbPeer{t: t, api: api, ts: ts, rec: &lbRecords{}, lb: lb}
	r.spec.LB, r.env.LBRecords = lb, p.rec
	return p
}

// lbRecords is an LBRecorder that counts what it is told.
type lbRecords struct {
	mu              sync.Mutex
	posted, removed int
}

func (c *lbRecords) LBPosted(lbhook.Config, *lbhook.Hook, lbhook.UpstreamInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.posted++
}

func (c *lbRecords) LBRemoved() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed++
}

func (c *lbRecords) counts() (posted, removed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posted, c.removed
}

// serving is what the LB serves for the service.
func (p *lbPeer) serving() []string { return p.api.Upstreams("web") }

// requests counts the run's requests of kind ("ADD", "REMOVE").
func (p *lbPeer) requests(kind string) int {
	n := 0
	for _, rec := range p.api.Requests("web") {
		if strings.HasPrefix(rec.ID, "alloc-self-"+kind+"-") {
			n++
		}
	}
	return n
}

// other registers or removes upstream as another client of the LB would
// (a previous holder; an operator).
func (p *lbPeer) other(kind lbhook.RequestKind, upstream string) {
	p.t.Helper()
	client, err := lbhook.NewClient(p.lb.Config, lbhook.ClientOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	hook, err := client.ForAlloc("other", 1)
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ceiling)
	defer cancel()
	self := lbhook.UpstreamInfo{Upstream: upstream}
	if kind == lbhook.KindAdd {
		_, err = hook.Add(ctx, self, nil)
	} else {
		_, err = hook.Remove(ctx, self)
	}
	if err != nil {
		p.t.Fatalf("%s %s: %v", kind, upstream, err)
	}
}

// waitServing waits until the LB serves want.
func (p *lbPeer) waitServing(r *runRig, want ...string) {
	p.t.Helper()
	for deadline := time.Now().Add(ceiling); !slices.Equal(p.serving(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			p.t.Fatalf("the LB serves %v, want %v; events:\n%s", p.serving(), want, r.eventLog())
		}
	}
}

// eventIndex is the index of the first event whose message begins with
// prefix (-1: none).
func (r *runRig) eventIndex(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, ev := range r.events {
		if strings.HasPrefix(ev.Message, prefix) {
			return i
		}
	}
	return -1
}

// healthServer answers a health check with status, counting the checks.
func healthServer(t *testing.T, status int) (addr string, checks *atomic.Int32) {
	checks = &atomic.Int32{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		checks.Add(1)
		w.WriteHeader(status)
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String(), checks
}

// Holding: while it holds the lock the run is in the load balancer: once
// its health check passes, one ADD that also swaps out the previous
// holder's upstream, and a re-add should the upstream vanish. An ADD that
// fails for good stops the workload (exit 74) with no REMOVE; an LB that
// does not answer is a notice while the run holds on.
func TestLBHookHolding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, lb *LoadBalancer)
		// before readies the LB or the lock before the run; then acts once
		// the run holds (or is registered, with registered).
		before     func(t *testing.T, r *runRig, p *lbPeer)
		registered bool
		then       func(t *testing.T, r *runRig, p *lbPeer)
		// says are event prefixes, in order; serving, what the LB serves
		// at the end; code the exit (0: the run goes on).
		says    []string
		serving []string
		code    int
		// posted: the registration recorded before the ADD; removes, the
		// REMOVE requests sent.
		posted, removes int
	}{
		{name: "no health check: ADD at once, registered", registered: true,
			says: []string{"Acquired lock", "Registered " + ourUpstream}, serving: []string{ourUpstream}, posted: 1},
		{name: "a health check that passes: healthy, then registered", registered: true,
			change: func(t *testing.T, lb *LoadBalancer) {
				addr, _ := healthServer(t, http.StatusOK)
				lb.Health = &HealthCheck{Type: "http", Address: addr, Interval: 100 * time.Millisecond, Timeout: time.Second}
			},
			says: []string{"Acquired lock", "Health check passed on ", "Registered " + ourUpstream}, serving: []string{ourUpstream}, posted: 1},
		{name: "the previous holder's upstream: swapped out by the same ADD", registered: true,
			before: func(t *testing.T, r *runRig, p *lbPeer) {
				p.other(lbhook.KindAdd, prevUpstream)
				r.srv.SetItems(map[string]string{"holder_alloc_id": "prev", "holder_upstream": prevUpstream})
			},
			says: []string{"Registered " + ourUpstream}, serving: []string{ourUpstream}, posted: 1},
		{name: "the upstream vanishes from the LB: re-added, a notice", registered: true,
			then:    func(t *testing.T, r *runRig, p *lbPeer) { p.other(lbhook.KindRemove, ourUpstream) },
			says:    []string{"Registered " + ourUpstream, "Re-registered " + ourUpstream},
			serving: []string{ourUpstream}, posted: 1},
		{name: "the LB refuses the ADD (FAILED): the workload stopped, exit 74, no REMOVE, the record dropped",
			before: func(t *testing.T, r *runRig, p *lbPeer) {
				if err := p.api.SetApplyFailure(lbapi.DefaultGroup, true); err != nil {
					t.Fatal(err)
				}
			},
			says: []string{"Acquired lock", evLBAddFailed.Prefix, evStopping.Prefix, "Released lock"}, code: ExitLBFailed, posted: 1},
		{name: "an auth key file that cannot be read: the workload stopped, exit 74, nothing sent",
			change: func(t *testing.T, lb *LoadBalancer) { lb.AuthKeyFile = "/nonexistent/authkey" },
			says:   []string{"Acquired lock", evLBAddFailed.Prefix, evStopping.Prefix}, code: ExitLBFailed},
		{name: "the LB API does not answer: a notice, the run holds on",
			change: func(t *testing.T, lb *LoadBalancer) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				lb.URI = "http://" + l.Addr().String() + lbapi.BasePath + "/request"
				l.Close()
				lb.RemoveDeadline = 200 * time.Millisecond
			},
			then: func(t *testing.T, r *runRig, p *lbPeer) {
				r.event("a notice", func(ev Event) bool { return ev.Notice && strings.HasPrefix(ev.Message, evLBUnanswered.Prefix) })
			},
			says: []string{"Acquired lock", evLBUnanswered.Prefix}, posted: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRunRig(t, sleeper, time.Second)
			p := withLB(t, r, func(lb *LoadBalancer) {
				if tc.change != nil {
					tc.change(t, lb)
				}
			})
			if tc.before != nil {
				tc.before(t, r, p)
			}
			r.run()
			if tc.code != 0 {
				if code := r.exit(); code != tc.code {
					t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
				}
			} else {
				r.holding()
				if tc.registered {
					r.event("registered", func(ev Event) bool { return ev.State == StateRegistered })
				}
				if tc.then != nil {
					tc.then(t, r, p)
				}
			}
			last := -1
			for _, want := range tc.says {
				r.event(want, func(ev Event) bool { return strings.HasPrefix(ev.Message, want) })
				i := r.eventIndex(want)
				if i < last {
					t.Errorf("%q came before the event before it; events:\n%s", want, r.eventLog())
				}
				last = i
			}
			if tc.serving != nil {
				p.waitServing(r, tc.serving...)
			} else if got := p.serving(); len(got) != 0 {
				t.Errorf("the LB serves %v, want nothing", got)
			}
			posted, removed := p.rec.counts()
			if posted != tc.posted {
				t.Errorf("registration recorded %d times, want %d", posted, tc.posted)
			}
			if tc.code == ExitLBFailed && posted > 0 && removed == 0 {
				t.Errorf("the record of a registration the LB refused was kept")
			}
			if n := p.requests("REMOVE"); n != tc.removes {
				t.Errorf("%d REMOVE requests, want %d", n, tc.removes)
			}
		})
	}
}

// PreKill: the run leaves the load balancer before its workload is
// signalled, on every ending: a stop, a lost lock, a gate's drain (while
// the gate still holds, before Nomad kills its gated tasks), once only.
// A REMOVE that fails, or that no time is left for, is said, and the
// workload is stopped anyway; nothing is sent for a run never posted.
func TestLBHookPreKill(t *testing.T) {
	stop := func(r *runRig) { r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second} }
	for _, tc := range []lbPreKillRow{
		{name: "a stop request: REMOVE, then the kill signal", registered: true, end: func(r *runRig, p *lbPeer) { stop(r) },
			code: 128 + int(syscall.SIGTERM), says: []string{"Registered ", "Removed " + ourUpstream, evStopping.Prefix, "Released lock"}, removes: 1},
		{name: "the lock lost: REMOVE within the stop deadline, then the kill signal", registered: true,
			end:  func(r *runRig, p *lbPeer) { r.srv.TakeOver(time.Second) },
			code: ExitLost, says: []string{"Registered ", "Lock lost: ", "Removed " + ourUpstream, evStopping.Prefix}, removes: 1},
		{name: "the LB API gone by the stop: the REMOVE fails within its deadline, said; the workload stopped anyway", registered: true,
			change: func(lb *LoadBalancer) { lb.RemoveDeadline = 300 * time.Millisecond },
			end: func(r *runRig, p *lbPeer) {
				p.ts.CloseClientConnections()
				p.ts.Listener.Close()
				stop(r)
			},
			code: 128 + int(syscall.SIGTERM), says: []string{"Registered ", evLBRemoveFailed.Prefix, evStopping.Prefix}, serving: []string{ourUpstream}},
		{name: "never posted (its health check never passed): no REMOVE", unhealthy: true,
			end:  func(r *runRig, p *lbPeer) { stop(r) },
			code: 128 + int(syscall.SIGTERM), says: []string{"Acquired lock", evStopping.Prefix}},
		{name: "a gate's allocation stopped: drained (REMOVE) while the gate holds; its stop sends no second REMOVE", gate: true, registered: true,
			end: func(r *runRig, p *lbPeer) {
				(&gateRig{runRig: r}).setAlloc(gateJob{desired: "stop", gatedState: "running"})
				p.waitServing(r)
				if !r.srv.Held() {
					r.t.Errorf("the lock was free when the drained gate left the LB (%s)", r.srv)
				}
				select {
				case code := <-r.code:
					r.t.Errorf("the gate ended (exit %d) on the drain; events:\n%s", code, r.eventLog())
					r.code <- code
				default:
				}
				stop(r)
			},
			says: []string{"Registered ", "Removed " + ourUpstream, "Released lock"}, removes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

// lbPreKillRow is a row of TestLBHookPreKill.
type lbPreKillRow struct {
	name   string
	gate   bool // the run is a gate's
	change func(lb *LoadBalancer)
	// unhealthy: the run's health check never passes (end comes once it
	// failed twice).
	unhealthy bool
	// registered: the run is in the LB before end; end ends it (or, for
	// a gate, drains it first).
	registered bool
	end        func(r *runRig, p *lbPeer)
	code       int
	// says are event prefixes in order: the REMOVE's event comes before
	// the workload's kill signal (evStopping) where both are named.
	// removes is the REMOVE requests sent; serving what the LB serves at
	// the end.
	says    []string
	removes int
	serving []string
}

func (tc lbPreKillRow) run(t *testing.T) {
	var r *runRig
	var g *gateRig
	if tc.gate {
		g = newGateRig(t, gateJob{gatedState: "running"})
		r = g.runRig
	} else {
		r = newRunRig(t, sleeper, time.Second)
	}
	var checks *atomic.Int32
	p := withLB(t, r, func(lb *LoadBalancer) {
		if tc.change != nil {
			tc.change(lb)
		}
		if tc.unhealthy {
			var addr string
			addr, checks = healthServer(t, http.StatusServiceUnavailable)
			lb.Health = &HealthCheck{Type: "http", Address: addr, Interval: 100 * time.Millisecond, Timeout: time.Second}
		}
	})
	if g != nil {
		g.run()
	} else {
		r.run()
	}
	r.event("holding", func(ev Event) bool { return ev.State.Holds() })
	if tc.registered {
		r.event("registered", func(ev Event) bool { return ev.State == StateRegistered })
		p.waitServing(r, ourUpstream)
	}
	for deadline := time.Now().Add(ceiling); checks != nil && checks.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the health check was not tried twice within %s", ceiling)
		}
	}
	tc.end(r, p)
	if got := r.exit(); got != tc.code {
		t.Errorf("exit %d, want %d; events:\n%s", got, tc.code, r.eventLog())
	}
	last := -1
	for _, want := range tc.says {
		i := r.eventIndex(want)
		switch {
		case i < 0:
			t.Errorf("no event says %q; events:\n%s", want, r.eventLog())
		case i < last:
			t.Errorf("%q came before the event before it; events:\n%s", want, r.eventLog())
		}
		last = max(last, i)
	}
	if n := p.requests("REMOVE"); n != tc.removes {
		t.Errorf("%d REMOVE requests, want %d; events:\n%s", n, tc.removes, r.eventLog())
	}
	if got := p.serving(); !slices.Equal(got, tc.serving) {
		t.Errorf("the LB serves %v, want %v", got, tc.serving)
	}
	if posted, removed := p.rec.counts(); posted != min(tc.removes+len(tc.serving), 1) || removed != tc.removes {
		t.Errorf("registration recorded %d times, dropped %d times; want %d, %d", posted, removed, min(tc.removes+len(tc.serving), 1), tc.removes)
	}
}

// PreKillBound, and the REMOVE's budget: the remove deadline while the
// lease is held; after a loss no more than half the time left to the stop
// deadline, less what the workload's kill needs of it; none left, and the
// REMOVE is skipped, saying so, and nothing is sent.
func TestLBHookPreKillBudget(t *testing.T) {
	srv := locktest.New()
	lease, err := srv.Locker(t, lockclient.Config{Path: "locks/web", Timing: locktest.Timing()}).Acquire(context.Background(), lockclient.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	cfg := (&LoadBalancer{Config: lbhook.Config{RemoveDeadline: 5 * time.Second, RequestTimeout: time.Second}.WithDefaults()})
	h := &lbHook{cfg: cfg}
	held := h.removeBudget(PreKillRequest{Lease: lease})
	if held != 5*time.Second || h.PreKillBound(PreKillRequest{Lease: lease}) != 6*time.Second {
		t.Errorf("held: budget %s, bound %s; want the remove deadline (5s), and the one read more (6s)", held, h.PreKillBound(PreKillRequest{Lease: lease}))
	}
	srv.TakeOver(time.Second)
	select {
	case <-lease.Lost():
	case <-time.After(ceiling):
		t.Fatal("the lease was not lost")
	}
	left := lockclient.BootUntil(lease.StopDeadline())
	for _, tc := range []struct {
		name      string
		killBound time.Duration
		max       time.Duration
		skipped   bool
	}{
		{"lost: at most half the time left to the stop deadline", 0, left / 2, false},
		{"lost, a kill that needs most of it: what it leaves", left - 2*time.Second, time.Second, false},
		{"lost, a kill that needs all of it: none, skipped", time.Hour, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := PreKillRequest{Lease: lease, KillBound: tc.killBound}
			got := h.removeBudget(req)
			if got > tc.max || (tc.skipped != (got == 0)) {
				t.Errorf("budget %s, want at most %s (skipped %v)", got, tc.max, tc.skipped)
			}
			if tc.skipped {
				var posts atomic.Int32
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { posts.Add(1) }))
				defer ts.Close()
				lb := testSession(t, ts.URL)
				lb.posted.Store(true)
				hook := testLBHook(lb, nil)
				var resp PreKillResponse
				hook.PreKill(context.Background(), req, &resp)
				if posts.Load() != 0 || len(resp.Events) != 1 || !strings.HasPrefix(resp.Events[0].Message, evLBRemoveSkipped.Prefix) {
					t.Errorf("%d requests, events %+v; want none sent and one event that says it was skipped", posts.Load(), resp.Events)
				}
			}
		})
	}
}
