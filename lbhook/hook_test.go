package lbhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

const alloc = "5d0c3a1e-7b1f-4c1e-9d0a-1b2c3d4e5f60"

func TestRequestIDs(t *testing.T) {
	tests := []struct {
		kind    RequestKind
		fence   uint64
		attempt int
		want    string
	}{
		{KindAdd, 1234, 1, alloc + "-ADD-1234"},
		{KindRemove, 1234, 1, alloc + "-REMOVE-1234"},
		{KindRemove, 1234, 0, alloc + "-REMOVE-1234"},
		{KindRemove, 1234, 2, alloc + "-REMOVE-1234-2"},
		{KindAdd, 7, 3, alloc + "-ADD-7-3"},
	}
	for _, tc := range tests {
		if got := RequestID(alloc, tc.kind, tc.fence, tc.attempt); got != tc.want {
			t.Errorf("RequestID(%s, %d, %d) = %s, want %s", tc.kind, tc.fence, tc.attempt, got, tc.want)
		}
	}
}

func TestForAlloc(t *testing.T) {
	c := newTestClient(t, validConfig(), nil)
	for _, bad := range []string{"", "a b", "a/b", "a|b", strings.Repeat("x", 240)} {
		if _, err := c.ForAlloc(bad, 1); err == nil {
			t.Errorf("alloc id %q accepted", bad)
		}
	}
	h, err := c.ForAlloc(alloc, 9)
	mustNoErr(t, err)
	if h.ID(KindAdd, 1) != alloc+"-ADD-9" {
		t.Errorf("ID = %s", h.ID(KindAdd, 1))
	}
}

// One ADD request: our upstream in, the previous holder's out, each tagged
// with our id and a group.
func TestAddRequest(t *testing.T) {
	cfg := validConfig()
	cfg.Options = map[string]any{"nginxExtraConfigs": []any{}}
	h, err := newTestClient(t, cfg, nil).ForAlloc(alloc, 42)
	mustNoErr(t, err)
	me := UpstreamInfo{Upstream: "10.0.0.1:31005", RackID: "r1"}
	prev := []UpstreamInfo{
		{Upstream: "10.0.0.2:31005", RequestID: "old-ADD-41"},
		{Upstream: "10.0.0.2:31005", Group: "default"}, // same target again
		{Upstream: "10.0.0.1:31005"},                   // ourselves: never removed
		{Upstream: ""},
		{Upstream: "10.0.0.3:31005", Group: "canary"},
	}
	req, err := h.AddRequest(me, prev)
	mustNoErr(t, err)
	got, err := json.Marshal(req)
	mustNoErr(t, err)
	id := alloc + "-ADD-42"
	want := compact(t, `{"loadBalancerRequestId":"`+id+`",
	 "loadBalancerService":{"serviceId":"web","owners":["team@example.com"],"serviceBasePath":"/web",
	   "additionalPaths":[],"loadBalancerGroups":["default"],"options":{"nginxExtraConfigs":[]},
	   "domains":[],"edgeCacheDomains":[],"preResolveUpstreamDNS":false},
	 "addUpstreams":[{"upstream":"10.0.0.1:31005","requestId":"`+id+`","rackId":"r1","group":"default"}],
	 "removeUpstreams":[{"upstream":"10.0.0.2:31005","requestId":"`+id+`","group":"default"},
	   {"upstream":"10.0.0.3:31005","requestId":"`+id+`","group":"canary"}],
	 "replaceUpstreams":[],"action":"UPDATE",
	 "noValidate":false,"noReload":false,"upstreamUpdateOnly":false,"noDuplicateUpstreams":true}`)
	if string(got) != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	for _, bad := range []UpstreamInfo{{Upstream: "nohost"}, {Upstream: ":80"}, {Upstream: "h:0"}, {Upstream: "h:x"}, {Upstream: "h:1", RackID: "a b"}, {Upstream: "h:1", Group: "a|b"}} {
		if _, err := h.AddRequest(bad, nil); err == nil {
			t.Errorf("upstream %+v accepted", bad)
		}
		if _, err := h.RemoveRequest(bad, 1); err == nil {
			t.Errorf("upstream %+v accepted for remove", bad)
		}
	}
}

// The takeover: the new holder adds itself and swaps out the crashed one in
// one request.
func TestAddSwapsOutThePreviousHolder(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	oldSelf := UpstreamInfo{Upstream: "10.0.0.2:80"}
	old, err := c.ForAlloc("old-alloc", 1)
	mustNoErr(t, err)
	if _, err := old.Add(ctx, oldSelf, nil); err != nil {
		t.Fatal(err)
	}
	h, err := c.ForAlloc(alloc, 2)
	mustNoErr(t, err)
	resp, err := h.Add(ctx, self, []UpstreamInfo{oldSelf})
	if err != nil {
		t.Fatal(err)
	}
	if resp.LoadBalancerState != StateSuccess || resp.Message != "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: [10.0.0.2:80]" {
		t.Errorf("got %s %q", resp.LoadBalancerState, resp.Message)
	}
	ups, err := h.State(ctx)
	mustNoErr(t, err)
	if len(ups) != 1 || !HasUpstream(ups, self) || ups[0].RequestID != alloc+"-ADD-2" {
		t.Errorf("upstreams %+v", ups)
	}
	if n := l.front.countOf(http.MethodPost); n != 2 {
		t.Errorf("%d POSTs, want one per holder", n)
	}
}

func TestAddOutcomes(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, l *lb, cfg *Config)
		state RequestState
		text  string
	}{
		{"failed", func(t *testing.T, l *lb, _ *Config) { mustNoErr(t, l.srv.SetAgents("default", 0)) }, StateFailed,
			"ended FAILED: Invalid request due to not enough agents"},
		{"invalid", func(_ *testing.T, _ *lb, cfg *Config) { cfg.Groups = []string{"missing"} }, StateInvalidRequestNoop,
			"ended INVALID_REQUEST_NOOP: Invalid request due to non-existent load balancer groups: [missing]"},
		{"cancelled at the add deadline", func(_ *testing.T, l *lb, cfg *Config) {
			cfg.AddDeadline = MinAddDeadline
			l.srv.Pause()
			l.front.on(http.MethodDelete, 1, also(l.srv.Resume))
		}, StateCanceled, "ended CANCELED (not final within its 100ms deadline)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLB(t, time.Millisecond)
			cfg := testConfig(l.uri)
			tc.setup(t, l, &cfg)
			h, err := newTestClient(t, cfg, nil).ForAlloc(alloc, 3)
			mustNoErr(t, err)
			resp, err := h.Add(context.Background(), self, nil)
			var oe *OutcomeError
			if !errors.As(err, &oe) || oe.State != tc.state || resp.LoadBalancerState != tc.state || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("got %s, err %v; want %s and %q", resp.LoadBalancerState, err, tc.state, tc.text)
			}
			if !strings.HasPrefix(err.Error(), "lb request "+alloc+"-ADD-3 ended") {
				t.Errorf("error %q does not name the request", err)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	h, err := c.ForAlloc(alloc, 5)
	mustNoErr(t, err)
	_, err = h.Add(ctx, self, nil)
	mustNoErr(t, err)

	resp, err := h.Remove(ctx, self)
	if err != nil || resp.LoadBalancerRequestID != alloc+"-REMOVE-5" {
		t.Fatalf("got %+v %v", resp, err)
	}
	if ups, _ := h.State(ctx); len(ups) != 0 {
		t.Errorf("upstreams after remove %+v", ups)
	}
	t.Run("again: the finished id answers SUCCESS", func(t *testing.T) {
		if _, err := h.Remove(ctx, self); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not registered: still SUCCESS", func(t *testing.T) {
		h2, _ := c.ForAlloc("never-added", 1)
		if _, err := h2.Remove(ctx, UpstreamInfo{Upstream: "10.9.9.9:80"}); err != nil {
			t.Fatal(err)
		}
	})
}

// A FAILED remove is retried under the next attempt id (Baragon never
// re-runs a finished id) until SUCCESS or the remove deadline.
func TestRemoveRetriesUnderNewIDs(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	h, _ := c.ForAlloc(alloc, 8)
	_, err := h.Add(ctx, self, nil)
	mustNoErr(t, err)
	mustNoErr(t, l.srv.SetApplyFailure("default", true))
	l.front.on(http.MethodPost, 3, also(func() { mustNoErr(t, l.srv.SetApplyFailure("default", false)) }))
	resp, err := h.Remove(ctx, self)
	if err != nil || resp.LoadBalancerState != StateSuccess || resp.LoadBalancerRequestID != alloc+"-REMOVE-8-2" {
		t.Fatalf("got %s %s %v", resp.LoadBalancerRequestID, resp.LoadBalancerState, err)
	}
	first, ok := l.srv.RequestState(alloc + "-REMOVE-8")
	if !ok || first != "FAILED" {
		t.Errorf("first attempt %s", first)
	}

	t.Run("until the deadline", func(t *testing.T) {
		cfg := testConfig(l.uri)
		cfg.RemoveDeadline = 400 * time.Millisecond
		h2, _ := newTestClient(t, cfg, nil).ForAlloc("doomed", 1)
		mustNoErr(t, l.srv.SetAgents("default", 0))
		start := time.Now()
		_, err := h2.Remove(ctx, self)
		var oe *OutcomeError
		if !errors.As(err, &oe) || oe.State != StateFailed {
			t.Fatalf("err %v", err)
		}
		// Bounded by the deadline: 10× it is loose enough for a busy machine.
		if d := time.Since(start); d > 10*cfg.RemoveDeadline {
			t.Errorf("took %s, want about the %s remove deadline", d, cfg.RemoveDeadline)
		}
		if n := slices.IndexFunc(l.front.seen(), func(s string) bool { return s == "GET doomed-REMOVE-1-2" }); n < 0 {
			t.Errorf("no second attempt: %v", l.front.seen())
		}
	})
}

func TestRemoveInvalidIsNotRetried(t *testing.T) {
	l := newLB(t, time.Millisecond)
	cfg := testConfig(l.uri)
	cfg.Groups = []string{"missing"}
	h, _ := newTestClient(t, cfg, nil).ForAlloc(alloc, 1)
	_, err := h.Remove(context.Background(), self)
	var oe *OutcomeError
	if !errors.As(err, &oe) || oe.State != StateInvalidRequestNoop {
		t.Fatalf("err %v", err)
	}
	if n := l.front.countOf(http.MethodPost); n != 1 {
		t.Errorf("%d POSTs, want 1", n)
	}
}

// An upstream removed out of band is re-added under a new attempt id.
func TestReAdd(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	h, _ := c.ForAlloc(alloc, 4)
	if _, err := h.Add(ctx, self, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, c.NewRequest("operator-rm", nil, []UpstreamInfo{self}), time.Time{}); err != nil {
		t.Fatal(err)
	}
	ups, err := h.State(ctx)
	mustNoErr(t, err)
	if HasUpstream(ups, self) {
		t.Fatal("upstream still there")
	}
	if resp, err := h.Add(ctx, self, nil); err != nil || len(l.srv.Upstreams("web")) != 0 {
		t.Fatalf("the first ADD id re-ran: %+v %v", resp, err)
	}
	if _, err := h.ReAdd(ctx, self, 1); err == nil {
		t.Error("ReAdd attempt 1 accepted")
	}
	resp, err := h.ReAdd(ctx, self, 2)
	if err != nil || resp.LoadBalancerRequestID != alloc+"-ADD-4-2" {
		t.Fatalf("got %+v %v", resp, err)
	}
	if ups, _ := h.State(ctx); !HasUpstream(ups, self) {
		t.Errorf("not re-added: %+v", ups)
	}
}

// A registration taken out and put back within one fence (a follower whose
// health check failed, then passed) gets fresh ids each time: AddAt and
// RemoveFrom number their attempts from where the last ones stopped, and
// RemoveFrom says which attempt it ended on.
func TestAddAtAndRemoveFromTakeFreshIDs(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	h, _ := c.ForAlloc(alloc, 6)
	prev := UpstreamInfo{Upstream: "10.0.0.9:80"}
	if _, err := h.AddAt(ctx, prev, nil, 1); err != nil { // the previous holder, listed
		t.Fatal(err)
	}
	resp, err := h.AddAt(ctx, self, []UpstreamInfo{prev}, 2)
	if err != nil || resp.LoadBalancerRequestID != alloc+"-ADD-6-2" {
		t.Fatalf("AddAt 2: %+v %v", resp, err)
	}
	if got := l.srv.Upstreams("web"); !slices.Equal(got, []string{self.Upstream}) {
		t.Errorf("after AddAt 2 the LB lists %q, want only ours: the previous holder swapped out", got)
	}
	resp, last, err := h.RemoveFrom(ctx, self, 3)
	if err != nil || resp.LoadBalancerRequestID != alloc+"-REMOVE-6-3" || last != 3 {
		t.Fatalf("RemoveFrom 3: %+v last %d %v", resp, last, err)
	}
	if got := l.srv.Upstreams("web"); len(got) != 0 {
		t.Errorf("after RemoveFrom the LB lists %q", got)
	}
	if _, ok := l.srv.RequestState(alloc + "-REMOVE-6"); ok {
		t.Error("RemoveFrom 3 sent attempt 1")
	}
}

func TestStateErrors(t *testing.T) {
	l := newLB(t, time.Millisecond)
	h, _ := newTestClient(t, testConfig(l.uri), nil).ForAlloc(alloc, 1)
	ups, err := h.State(context.Background())
	if err != nil || ups != nil {
		t.Errorf("unknown service: %v %v", ups, err)
	}
	l.front.on(http.MethodGet, 0, answerStatus(503, ""))
	if _, err := h.State(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "lb state:") {
		t.Errorf("err %v", err)
	}
}

// A REMOVE that runs out of time while the LB applies it (every answer on
// the request is lost, the cancel too) is reported as applied once the
// service's state shows our upstream gone; with the upstream still there
// it stays a failure.
func TestRemoveAppliedDespiteNoFinalState(t *testing.T) {
	for _, tc := range []struct {
		name    string
		applied bool
	}{{"applied", true}, {"not applied", false}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLB(t, time.Millisecond)
			cfg := testConfig(l.uri)
			cfg.RemoveDeadline = 300 * time.Millisecond
			c := newTestClient(t, cfg, nil)
			h, _ := c.ForAlloc(alloc, 4)
			ctx := context.Background()
			_, err := h.Add(ctx, self, nil)
			mustNoErr(t, err)
			lostAnswer := func(w http.ResponseWriter, r *http.Request) bool {
				if !strings.Contains(r.URL.Path, "/request") {
					return false // the state GET gets through
				}
				if tc.applied && r.Method == http.MethodPost {
					return forwardThenDrop(l.srv)(w, r)
				}
				return answerStatus(503, "")(w, r)
			}
			for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				l.front.on(m, 0, lostAnswer)
			}
			resp, err := h.Remove(ctx, self)
			if tc.applied {
				if err != nil || !RemovedAnyway(resp) {
					t.Fatalf("got %s %v, want no error and a response other than SUCCESS", resp.LoadBalancerState, err)
				}
				if ups, _ := h.State(ctx); HasUpstream(ups, self) {
					t.Errorf("upstream still registered: %+v", ups)
				}
				return
			}
			if err == nil {
				t.Fatalf("got %s and no error, want the failure: the upstream is still registered", resp.LoadBalancerState)
			}
		})
	}
}
