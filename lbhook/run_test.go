package lbhook

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

var self = UpstreamInfo{Upstream: "10.0.0.1:80"}

// Every WAITING → final transition the LB API produces, through Run.
func TestRunFinalStates(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, l *lb)
		groups  []string
		state   RequestState
		message string
	}{
		{"success", nil, nil, StateSuccess, "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: []"},
		{"unknown group", nil, []string{"default", "nope"}, StateInvalidRequestNoop, "Invalid request due to non-existent load balancer groups: [nope]"},
		{"no agents", func(t *testing.T, l *lb) { mustNoErr(t, l.srv.SetAgents("default", 0)) }, nil, StateFailed,
			"Invalid request due to not enough agents present for group: default"},
		{"apply failure", func(t *testing.T, l *lb) { mustNoErr(t, l.srv.SetApplyFailure("default", true)) }, nil, StateFailed,
			"Apply failed {(500) - simulated agent failure}, REVERT OK."},
		{"base path conflict", func(t *testing.T, l *lb) {
			cfg := testConfig(l.uri)
			cfg.ServiceID = "other"
			c := newTestClient(t, cfg, nil)
			resp, err := c.Run(context.Background(), c.NewRequest("o1", []UpstreamInfo{{Upstream: "10.0.0.9:80"}}, nil), time.Time{})
			if err != nil || resp.LoadBalancerState != StateSuccess {
				t.Fatalf("setup: %s %v", resp.LoadBalancerState, err)
			}
		}, nil, StateInvalidRequestNoop, "Invalid request due to base path conflicts: [ other on group default ]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLB(t, time.Millisecond)
			if tc.setup != nil {
				tc.setup(t, l)
			}
			cfg := testConfig(l.uri)
			if tc.groups != nil {
				cfg.Groups = tc.groups
			}
			c := newTestClient(t, cfg, nil)
			before := l.front.countOf(http.MethodPost)
			resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(3*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if resp.LoadBalancerState != tc.state || resp.Message != tc.message {
				t.Errorf("got %s %q, want %s %q", resp.LoadBalancerState, resp.Message, tc.state, tc.message)
			}
			if n := l.front.countOf(http.MethodPost) - before; n != 1 {
				t.Errorf("%d POSTs, want 1", n)
			}
			if l.front.countOf(http.MethodDelete) != 0 {
				t.Errorf("a DELETE was sent before the deadline")
			}
		})
	}
}

// UNKNOWN results re-POST the same id; the LB API is idempotent by id, so
// the request runs once.
func TestRunRepostsUnknownWithTheSameID(t *testing.T) {
	tests := []struct {
		name   string
		script func(l *lb)
		want   []string // calls, "METHOD last-path-segment"
	}{
		{"POST answer lost after it took effect", func(l *lb) {
			l.front.on(http.MethodPost, 1, forwardThenDrop(l.srv))
		}, []string{"POST request", "POST request", "GET r1"}},
		{"POST 503 twice", func(l *lb) {
			l.front.on(http.MethodPost, 1, answerStatus(503, "")).on(http.MethodPost, 2, answerStatus(503, ""))
		}, []string{"POST request", "POST request", "POST request", "GET r1"}},
		{"POST timeout", func(l *lb) {
			l.front.on(http.MethodPost, 1, stall(400*time.Millisecond))
		}, []string{"POST request", "POST request", "GET r1"}},
		{"POST garbage", func(l *lb) {
			l.front.on(http.MethodPost, 1, answerStatus(200, "{"))
		}, []string{"POST request", "POST request", "GET r1"}},
		{"GET 404: not stored", func(l *lb) {
			l.front.on(http.MethodGet, 1, answerStatus(404, ""))
		}, []string{"POST request", "GET r1", "POST request", "GET r1"}},
		{"GET 500", func(l *lb) {
			l.front.on(http.MethodGet, 1, answerStatus(500, ""))
		}, []string{"POST request", "GET r1", "POST request", "GET r1"}},
		{"GET truncated", func(l *lb) {
			l.front.on(http.MethodGet, 1, truncatedBody())
		}, []string{"POST request", "GET r1", "POST request", "GET r1"}},
		{"GET after a 4xx re-POST keeps polling", func(l *lb) {
			l.front.on(http.MethodGet, 1, answerStatus(502, "")).on(http.MethodPost, 2, answerStatus(403, ""))
		}, []string{"POST request", "GET r1", "POST request", "GET r1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLB(t, 0)
			tc.script(l)
			// Each GET advances the LB API by one worker run: three GETs
			// after the POST finish the request.
			l.front.on(http.MethodGet, 0, l.step(3))
			c := newTestClient(t, testConfig(l.uri), nil)
			resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(3*time.Second))
			if err != nil || resp.LoadBalancerState != StateSuccess {
				t.Fatalf("got %s %q %v", resp.LoadBalancerState, resp.Message, err)
			}
			if got := l.front.seen(); !slices.Equal(got, tc.want) {
				t.Errorf("calls %v, want %v", got, tc.want)
			}
			for _, cl := range l.front.callList() {
				if cl.method == http.MethodPost && !strings.Contains(cl.body, `"loadBalancerRequestId":"r1"`) {
					t.Errorf("POST with another id: %s", cl.body)
				}
			}
			if got := l.srv.Upstreams("web"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
				t.Errorf("upstreams %v", got)
			}
		})
	}
}

// A 4xx POST before Baragon accepted the id is a final FAILED.
func TestRunRejectedPostIsFinal(t *testing.T) {
	l := newLB(t, time.Millisecond)
	cfg := testConfig(l.uri)
	c, err := NewClient(cfg, ClientOptions{Getenv: func(string) string { return "wrong-key" }})
	mustNoErr(t, err)
	resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(time.Second))
	if err != nil || resp.LoadBalancerState != StateFailed || !strings.Contains(resp.Message, "response status code 403") {
		t.Fatalf("got %s %q %v", resp.LoadBalancerState, resp.Message, err)
	}
	if got := l.front.seen(); !slices.Equal(got, []string{"POST request"}) {
		t.Errorf("calls %v", got)
	}
}

// The worker rewrites a remove-only request (noValidate), so our identical
// re-POST is "already enqueued with different parameters": Run sends it once
// more, like Singularity, then polls the active request.
func TestRunAlreadyEnqueued(t *testing.T) {
	l := newLB(t, 0)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	l.front.on(http.MethodGet, 0, l.step(3))
	if _, err := c.Run(ctx, c.NewRequest("add", []UpstreamInfo{self}, nil), time.Time{}); err != nil {
		t.Fatal(err)
	}
	l.front.on(http.MethodGet, 0, nil)
	mark := len(l.front.callList())
	// First GET: the worker runs once (rewriting the request), the answer is lost.
	l.front.on(http.MethodGet, 2, func(w http.ResponseWriter, r *http.Request) bool {
		l.srv.Step()
		return answerStatus(503, "")(w, r)
	})
	l.front.on(http.MethodGet, 3, l.step(2))
	resp, err := c.Run(ctx, c.NewRequest("rm", nil, []UpstreamInfo{self}), time.Now().Add(3*time.Second))
	if err != nil || resp.LoadBalancerState != StateSuccess {
		t.Fatalf("got %s %q %v", resp.LoadBalancerState, resp.Message, err)
	}
	want := []string{"POST request", "GET rm", "POST request", "POST request", "GET rm"}
	if got := l.front.seen()[mark:]; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if got := l.srv.Upstreams("web"); len(got) != 0 {
		t.Errorf("upstreams %v", got)
	}
}

// At the deadline Run cancels, then polls until a final state
// (docs/lb-contract.md#delete-cancel).
func TestRunCancelsAtDeadline(t *testing.T) {
	tests := []struct {
		name     string
		script   func(l *lb)
		deadline time.Duration
		state    RequestState
		calls    []string
	}{
		{"cancelled", func(l *lb) {
			l.front.on(http.MethodGet, 0, nil)
			l.front.on(http.MethodDelete, 1, also(func() { l.srv.Resume() }))
		}, 40 * time.Millisecond, StateCanceled, nil},
		{"deadline already passed: one POST, then cancel", func(l *lb) {
			l.front.on(http.MethodDelete, 1, also(func() { l.srv.Resume() }))
		}, -time.Second, StateCanceled, []string{"POST request", "DELETE r1"}},
		{"finished before the cancel arrived", func(l *lb) {
			l.front.on(http.MethodDelete, 1, l.step(3))
		}, 40 * time.Millisecond, StateSuccess, nil},
		{"DELETE unknown, then retried", func(l *lb) {
			l.front.on(http.MethodDelete, 1, answerStatus(503, ""))
			l.front.on(http.MethodDelete, 2, also(func() { l.srv.Resume() }))
		}, 40 * time.Millisecond, StateCanceled, nil},
		{"GET 404 after the cancel re-sends DELETE", func(l *lb) {
			l.front.on(http.MethodDelete, 1, also(func() { l.srv.Resume() }))
			l.front.on(http.MethodGet, 0, func(w http.ResponseWriter, r *http.Request) bool {
				if l.front.countOf(http.MethodDelete) == 1 {
					return answerStatus(404, "")(w, r)
				}
				return false
			})
		}, 40 * time.Millisecond, StateCanceled, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLB(t, time.Millisecond)
			l.srv.Pause()
			tc.script(l)
			c := newTestClient(t, testConfig(l.uri), nil)
			resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(tc.deadline))
			if err != nil || resp.LoadBalancerState != tc.state {
				t.Fatalf("got %s %q %v, want %s", resp.LoadBalancerState, resp.Message, err, tc.state)
			}
			seen := l.front.seen()
			if tc.calls != nil && !slices.Equal(seen[:len(tc.calls)], tc.calls) {
				t.Errorf("calls %v, want them to start with %v", seen, tc.calls)
			}
			del := slices.Index(seen, "DELETE r1")
			if del < 0 || slices.Contains(seen[del:], "POST request") {
				t.Errorf("calls %v: want a DELETE and no POST after it", seen)
			}
			for _, cl := range l.front.callList() {
				if cl.method == http.MethodDelete && cl.query.Get("authkey") != testKey {
					t.Errorf("DELETE without the auth key: %v", cl.query)
				}
			}
			if tc.state == StateCanceled && l.srv.Upstreams("web") != nil {
				t.Errorf("a cancelled request committed upstreams")
			}
		})
	}
}

func TestRunCancelWaitRunsOut(t *testing.T) {
	l := newLB(t, time.Millisecond)
	l.srv.Pause()
	c, err := NewClient(testConfig(l.uri), ClientOptions{
		CancelWait: 60 * time.Millisecond,
		Getenv:     func(string) string { return testKey },
	})
	mustNoErr(t, err)
	start := time.Now()
	resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(20*time.Millisecond))
	if !errors.Is(err, ErrNotFinal) || resp.LoadBalancerState != StateCanceling {
		t.Fatalf("got %s %v, want CANCELING and ErrNotFinal", resp.LoadBalancerState, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %s", d)
	}
}

func TestRunUnreachable(t *testing.T) {
	cfg := testConfig(refusedURI(t))
	c, err := NewClient(cfg, ClientOptions{CancelWait: 50 * time.Millisecond, Getenv: func(string) string { return testKey }})
	mustNoErr(t, err)
	resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(50*time.Millisecond))
	// No call connected: the LB never saw the request, there is nothing
	// to cancel, and the error says why.
	if !errors.Is(err, ErrNeverReached) || resp.LoadBalancerState != StateUnknown || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("got %s %v", resp.LoadBalancerState, err)
	}
	assertNoSecret(t, "error", err.Error())
	assertNoSecret(t, "message", resp.Message)
}

// ctx ends Run at once, without a cancel.
func TestRunContextCancelled(t *testing.T) {
	l := newLB(t, time.Millisecond)
	l.srv.Pause()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.front.on(http.MethodGet, 2, also(cancel))
	c := newTestClient(t, testConfig(l.uri), nil)
	resp, err := c.Run(ctx, c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Time{})
	if !errors.Is(err, context.Canceled) || resp.LoadBalancerState != StateWaiting {
		t.Fatalf("got %s %v", resp.LoadBalancerState, err)
	}
	if l.front.countOf(http.MethodDelete) != 0 {
		t.Error("a DELETE was sent after ctx ended")
	}
}

func TestRunRefusesBadIDs(t *testing.T) {
	c := newTestClient(t, testConfig(refusedURI(t)), nil)
	for _, id := range []string{"", "a b", "a/b", "a|b"} {
		if _, err := c.Run(context.Background(), c.NewRequest(id, nil, nil), time.Time{}); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}

// A longer scenario against the real worker with random faults: whatever
// the faults, Run ends SUCCESS and the request ran exactly once.
func TestRunUnderRandomFaults(t *testing.T) {
	l := newLB(t, time.Millisecond)
	mustNoErr(t, l.srv.SetFaults(lbapi.Faults{ErrorRate: 0.2, DropRate: 0.1, GarbageRate: 0.1, AfterHandle: true}))
	c := newTestClient(t, testConfig(l.uri), nil)
	for i, id := range []string{"f1", "f2", "f3", "f4", "f5"} {
		up := UpstreamInfo{Upstream: "10.0.0." + string(rune('1'+i)) + ":80"}
		resp, err := c.Run(context.Background(), c.NewRequest(id, []UpstreamInfo{up}, nil), time.Now().Add(5*time.Second))
		if err != nil || resp.LoadBalancerState != StateSuccess {
			t.Fatalf("%s: %s %q %v", id, resp.LoadBalancerState, resp.Message, err)
		}
	}
	mustNoErr(t, l.srv.SetFaults(lbapi.Faults{}))
	if got := l.srv.Upstreams("web"); len(got) != 5 {
		t.Errorf("upstreams %v", got)
	}
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An LB API that never answers is reported at its first failed call, then
// at most once per UnansweredEvery, with the URL (auth key hidden) and the
// cause; the final error names the cause too.
func TestRunReportsUnansweredCallsAtABoundedRate(t *testing.T) {
	cfg := testConfig(refusedURI(t))
	var mu sync.Mutex
	var got []Unanswered
	c, err := NewClient(cfg, ClientOptions{
		CancelWait:      50 * time.Millisecond,
		Getenv:          func(string) string { return testKey },
		UnansweredEvery: 150 * time.Millisecond,
		OnUnanswered: func(u Unanswered) {
			mu.Lock()
			got = append(got, u)
			mu.Unlock()
		},
	})
	mustNoErr(t, err)
	start := time.Now()
	_, err = c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(400*time.Millisecond))
	took := time.Since(start)
	if !errors.Is(err, ErrNeverReached) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v, want ErrNeverReached naming the cause", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 {
		t.Fatal("no unanswered call was reported")
	}
	if first := got[0]; first.Calls != 1 || first.RequestID != "r1" || first.Err == nil ||
		!strings.Contains(first.Err.Error(), "connection refused") || !strings.HasPrefix(first.Err.URL, "http://127.0.0.1:") {
		t.Errorf("first report %+v, want the first call, its URL and its cause", first)
	}
	// One at the start, then one per UnansweredEvery at most.
	if limit := 1 + int(took/(150*time.Millisecond)); len(got) > limit {
		t.Errorf("%d reports in %s, want at most %d", len(got), took, limit)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Calls <= got[i-1].Calls || !got[i].Since.Equal(got[0].Since) {
			t.Errorf("report %d: %d calls since %s after %d since %s: want one growing run", i, got[i].Calls, got[i].Since, got[i-1].Calls, got[i-1].Since)
		}
	}
	for _, u := range got {
		assertNoSecret(t, "report", u.Err.Error())
	}
}

// Calls that get answers start a new run: its first failure is reported at once.
func TestRunUnansweredRunEndsWithAnAnswer(t *testing.T) {
	l := newLB(t, time.Millisecond)
	l.front.on(http.MethodPost, 1, answerStatus(503, "")).on(http.MethodGet, 1, answerStatus(503, ""))
	var mu sync.Mutex
	var calls []int
	c, err := NewClient(testConfig(l.uri), ClientOptions{
		Getenv:          func(string) string { return testKey },
		UnansweredEvery: time.Hour,
		OnUnanswered: func(u Unanswered) {
			mu.Lock()
			calls = append(calls, u.Calls)
			mu.Unlock()
		},
	})
	mustNoErr(t, err)
	resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(3*time.Second))
	if err != nil || resp.LoadBalancerState != StateSuccess {
		t.Fatalf("got %s %v, want SUCCESS", resp.LoadBalancerState, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(calls, []int{1, 1}) {
		t.Errorf("reports %v, want the first failure of each of the two runs: [1 1]", calls)
	}
}
