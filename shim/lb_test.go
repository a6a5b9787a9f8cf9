package shim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// TestNoRemoveAfterFinalFailedAdd: an ADD that reached FAILED, CANCELED or
// INVALID_REQUEST_NOOP stops the workload, and on the way out no REMOVE is
// sent (Singularity sends none: one would make the service appear in
// Baragon's state with no upstream) and the driver's record of the
// registration is dropped. An ADD cut short by our own stop (no final state)
// still gets its REMOVE.
func TestNoRemoveAfterFinalFailedAdd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		stopping   bool
		wantRemove bool
	}{
		{"failed", &lbhook.OutcomeError{RequestID: "a-ADD-1", State: lbhook.StateFailed, Message: "apply failed"}, false, false},
		{"canceled", &lbhook.OutcomeError{RequestID: "a-ADD-1", State: lbhook.StateCanceled}, false, false},
		{"invalid", &lbhook.OutcomeError{RequestID: "a-ADD-1", State: lbhook.StateInvalidRequestNoop}, false, false},
		{"never reached the LB API", fmt.Errorf("lb request a-ADD-1: %w", lbhook.ErrNeverReached), false, false},
		{"cut short by our stop", errors.New("context canceled"), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts atomic.Int32
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost {
					posts.Add(1)
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"loadBalancerRequestId":"x","loadBalancerState":"SUCCESS"}`))
			}))
			defer ts.Close()
			cfg := &LoadBalancer{Config: lbhook.Config{URI: ts.URL + "/baragon/v2/request", ServiceID: "web", BasePath: "/web",
				Groups: []string{"g"}, PortLabel: "http"}.WithDefaults(), Upstream: "127.0.0.1:8080"}
			client, err := lbhook.NewClient(cfg.Config, lbhook.ClientOptions{})
			if err != nil {
				t.Fatal(err)
			}
			hook, err := client.ForAlloc("a", 1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			lb := &lbSession{cfg: cfg, client: client, hook: hook, self: lbhook.UpstreamInfo{Upstream: cfg.Upstream},
				ctx: ctx, cancel: cancel, events: make(chan lbEvent, 4), recheck: time.NewTicker(time.Hour)}
			lb.posted.Store(true)
			removed := 0
			h := testLBHook(lb, countRemoved{&removed})
			if tc.stopping {
				cancel()
			}
			ev, send := lb.handle(lbEvent{kind: "added", err: tc.err}, h)
			if stopped := send && ev.Fail != nil && ev.Fail.Code == ExitLBFailed; stopped == tc.stopping {
				t.Errorf("handle = %+v, %v; want the workload stopped (a failure) unless we were stopping already", ev, send)
			}
			h.PreKill(context.Background(), PreKillRequest{Lease: heldLease(t)}, &PreKillResponse{})
			if got := posts.Load() > 0; got != tc.wantRemove {
				t.Errorf("REMOVE sent: %v, want %v", got, tc.wantRemove)
			}
			if wantRecordDropped := 1; removed != wantRecordDropped {
				t.Errorf("LBRemoved ran %d times, want %d", removed, wantRecordDropped)
			}
		})
	}
}

// countRemoved counts LBRemoved.
type countRemoved struct{ n *int }

func (countRemoved) LBPosted(lbhook.Config, *lbhook.Hook, lbhook.UpstreamInfo) {}
func (c countRemoved) LBRemoved()                                              { *c.n++ }

// testLBHook is an lbHook whose session lb runs, its loop not started.
func testLBHook(lb *lbSession, rec LBRecorder) *lbHook {
	stopped := make(chan struct{})
	close(stopped)
	return &lbHook{cfg: lb.cfg, log: hclog.NewNullLogger(), rec: rec, sess: lb, stop: func() {}, stopped: stopped,
		startFailed: lbStartFailedMessage, addFailed: lbAddFailedMessage}
}

// heldLease is a lease held on an in-memory lock.
func heldLease(t *testing.T) *lockclient.Lease {
	t.Helper()
	l, err := locktest.New().Locker(t, lockclient.Config{Path: "locks/web", Timing: locktest.Timing()}).Acquire(context.Background(), lockclient.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// testSession is an lbSession against uri.
func testSession(t *testing.T, uri string) *lbSession {
	t.Helper()
	cfg := &LoadBalancer{Config: lbhook.Config{URI: uri + "/baragon/v2/request", ServiceID: "web", BasePath: "/web",
		Groups: []string{"g"}, PortLabel: "http"}.WithDefaults(), Upstream: "127.0.0.1:8080"}
	client, err := lbhook.NewClient(cfg.Config, lbhook.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := client.ForAlloc("a", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &lbSession{cfg: cfg, client: client, hook: hook, self: lbhook.UpstreamInfo{Upstream: cfg.Upstream},
		ctx: ctx, cancel: cancel, events: make(chan lbEvent, 4), recheck: time.NewTicker(time.Hour)}
}

// While a slow PreKill (a REMOVE) runs, each renew reaches the caller
// (which re-arms its guard and republishes its deadlines for the watchdog).
func TestPreKillRelaysRenewals(t *testing.T) {
	r := &heldRun{s: &Supervisor{Logger: hclog.NewNullLogger(), Hooks: []Hook{slowPreKill(600 * time.Millisecond)}},
		lease: heldLease(t), w: &gatedWorkload{}}
	relayed := 0
	r.preKill(func() { relayed++ })
	if relayed == 0 {
		t.Errorf("no renewal relayed during a PreKill of 600ms, with renews every %s", locktest.Timing().RenewInterval)
	}
}

// slowPreKill is a PreKill hook that takes its time.
type slowPreKill time.Duration

func (slowPreKill) Name() string                                { return "slow" }
func (d slowPreKill) PreKillBound(PreKillRequest) time.Duration { return time.Duration(d) }
func (d slowPreKill) PreKill(context.Context, PreKillRequest, *PreKillResponse) {
	time.Sleep(time.Duration(d))
}

// A report of unanswered calls is a notice: the ADD goes on (the session
// stays busy), and the state and its message are unchanged.
func TestUnansweredIsANotice(t *testing.T) {
	lb := testSession(t, "http://127.0.0.1:1")
	lb.busy = true
	var seen []Event
	s := &Supervisor{Logger: hclog.NewNullLogger(), Observe: func(ev Event) { seen = append(seen, ev) },
		state: StateHealthy, message: "Health check passed"}
	ce := &lbhook.CallError{Method: "POST", URL: "http://127.0.0.1:1/baragon/v2/request", State: lbhook.StateUnknown,
		Err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")}
	ev, send := lb.handle(lbEvent{kind: "unanswered", unanswered: lbhook.Unanswered{RequestID: "a-ADD-1", Err: ce, Calls: 1, Since: time.Now()}},
		testLBHook(lb, nil))
	if !send || ev.Fail != nil || !lb.busy {
		t.Fatalf("handle = %+v, %v, busy %v: want the ADD to go on", ev, send, lb.busy)
	}
	(&heldRun{s: s, lease: heldLease(t)}).publish(ev)
	if len(seen) != 1 || !seen[0].Notice || seen[0].State != StateHealthy ||
		!strings.HasPrefix(seen[0].Message, "Holding the lock; not yet in the load balancer: ") {
		t.Errorf("events %+v, want one notice in state healthy", seen)
	}
	if s.state != StateHealthy || s.message != "Health check passed" {
		t.Errorf("state %s %q changed by a notice", s.state, s.message)
	}
}
