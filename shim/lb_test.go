package shim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
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
			s := &Supervisor{Logger: hclog.NewNullLogger(), OnLBRemoved: func() { removed++ }}
			held := func(st State, msg string) Event { return Event{State: st, Message: msg} }
			if tc.stopping {
				cancel()
			}
			err = s.handleLB(lb, lbEvent{kind: "added", err: tc.err}, held)
			if tc.stopping != (err == nil) {
				t.Errorf("handleLB = %v; want the workload stopped (an error) unless we were stopping already", err)
			}
			s.deregister(lb, 2*time.Second, held, nil, nil)
			if got := posts.Load() > 0; got != tc.wantRemove {
				t.Errorf("REMOVE sent: %v, want %v", got, tc.wantRemove)
			}
			if wantRecordDropped := 1; removed != wantRecordDropped {
				t.Errorf("OnLBRemoved ran %d times, want %d", removed, wantRecordDropped)
			}
		})
	}
}
