package lbapi

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// docs/lb-contract.md#states, #validation-while-pending and #outcome: every
// WAITING → final transition, with Baragon's messages.
func TestTransitions(t *testing.T) {
	tests := []struct {
		name    string
		groups  []Group
		setup   func(e *testEnv)
		spec    reqSpec
		steps   int // worker runs during which the request stays WAITING
		state   string
		message string
	}{
		{
			name:    "success",
			spec:    reqSpec{id: "ok", add: []string{"10.0.0.1:80"}, remove: []string{"10.0.0.9:80"}},
			steps:   2,
			state:   stateSuccess,
			message: "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: [10.0.0.9:80]",
		},
		{
			name:    "unknown group",
			spec:    reqSpec{id: "nogroup", groups: []string{"default", "zz", "aa"}, add: []string{"10.0.0.1:80"}},
			state:   stateInvalidRequestNoop,
			message: "Invalid request due to non-existent load balancer groups: [aa, zz]",
		},
		{
			name: "base path conflict",
			setup: func(e *testEnv) {
				e.resp(e.post(reqSpec{id: "other1", svc: "other", path: "/web", add: []string{"10.0.0.5:80"}}.json()))
				e.steps(3)
			},
			spec:    reqSpec{id: "conflict", svc: "web", path: "/web", add: []string{"10.0.0.1:80"}},
			state:   stateInvalidRequestNoop,
			message: "Invalid request due to base path conflicts: [ other on group default ]",
		},
		{
			name:    "no agents",
			setup:   func(e *testEnv) { mustNoErr(t, e.srv.SetAgents("default", 0)) },
			spec:    reqSpec{id: "noagents", add: []string{"10.0.0.1:80"}},
			state:   stateFailed,
			message: "Invalid request due to not enough agents present for group: default",
		},
		{
			name:    "domain not served",
			spec:    reqSpec{id: "dom", add: []string{"10.0.0.1:80"}, svcExtra: map[string]any{"domains": []string{"b.example.com", "a.example.com"}}},
			state:   stateInvalidRequestNoop,
			message: "No groups present that serve domains: [a.example.com, b.example.com]",
		},
		{
			name:    "domain served",
			groups:  []Group{{Name: "default", Domains: []string{"a.example.com"}}},
			spec:    reqSpec{id: "dom2", add: []string{"10.0.0.1:80"}, svcExtra: map[string]any{"domains": []string{"a.example.com"}}},
			steps:   2,
			state:   stateSuccess,
			message: "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: []",
		},
		{
			name:    "agent apply failure is reverted",
			setup:   func(e *testEnv) { mustNoErr(t, e.srv.SetApplyFailure("default", true)) },
			spec:    reqSpec{id: "applyfail", add: []string{"10.0.0.1:80"}},
			steps:   4, // PENDING, SEND_APPLY, CHECK_APPLY → FAILED_SEND_REVERT, → FAILED_CHECK_REVERT
			state:   stateFailed,
			message: "Apply failed {(500) - simulated agent failure}, REVERT OK.",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{Groups: tc.groups})
			if tc.setup != nil {
				tc.setup(e)
			}
			e.resp(e.post(tc.spec.json()))
			for i := range tc.steps {
				e.srv.Step()
				if r := e.mustState(tc.spec.id, stateWaiting, ""); i > 0 && r.Message == "" {
					t.Fatalf("step %d: WAITING without a message", i)
				}
			}
			e.srv.Step()
			r := e.mustState(tc.spec.id, tc.state, tc.message)
			if r.Request == nil {
				t.Errorf("final response has no request")
			}
		})
	}
}

func TestApplyFailureMessagesWhileReverting(t *testing.T) {
	e := newEnv(t, Options{})
	mustNoErr(t, e.srv.SetApplyFailure("default", true))
	e.resp(e.post(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	e.mustState("r", stateWaiting, "Apply failed ((500) - simulated agent failure), reverting...")
	e.steps(2)
	r := e.mustState("r", stateFailed, "")
	if len(r.Agents[typeApply]) != 1 || len(r.Agents[typeRevert]) != 1 {
		t.Errorf("agentResponses = %v, want one APPLY and one REVERT", r.Agents)
	}
	if got := e.srv.Upstreams("web"); got != nil {
		t.Errorf("a reverted request committed upstreams %v", got)
	}
}

// docs/lb-contract.md#commit.
func TestCommitSemantics(t *testing.T) {
	e := newEnv(t, Options{})
	run := func(spec reqSpec) wireResponse {
		t.Helper()
		e.resp(e.post(spec.json()))
		e.steps(3)
		return e.mustState(spec.id, stateSuccess, "")
	}
	run(reqSpec{id: "add1", add: []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80@canary"}})
	if got := e.srv.Upstreams("web"); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.1:80", "10.0.0.2:80"}) {
		t.Fatalf("upstreams = %v", got)
	}

	t.Run("add replaces the same upstream and group", func(t *testing.T) {
		run(reqSpec{id: "add2", add: []string{"10.0.0.1:80"}})
		st := e.state("web").body
		if strings.Count(st, `"upstream":"10.0.0.1:80"`) != 2 || !strings.Contains(st, `"requestId":"add2","rackId":null,"group":"default"`) ||
			!strings.Contains(st, `"requestId":"add1","rackId":null,"group":"canary"`) {
			t.Errorf("state = %s", st)
		}
	})
	t.Run("removing a missing upstream still succeeds", func(t *testing.T) {
		run(reqSpec{id: "rm-missing", remove: []string{"10.9.9.9:80"}})
		if got := e.srv.Upstreams("web"); len(got) != 3 {
			t.Errorf("upstreams = %v", got)
		}
	})
	t.Run("remove matches upstream and group", func(t *testing.T) {
		run(reqSpec{id: "rm1", remove: []string{"10.0.0.1:80@canary", "10.0.0.2:80"}})
		if got := e.srv.Upstreams("web"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
			t.Errorf("upstreams = %v", got)
		}
	})
	t.Run("service definition is stored", func(t *testing.T) {
		run(reqSpec{id: "owners", svcExtra: map[string]any{"owners": []string{"new@example.com"}, "options": map[string]any{"x": 1}}})
		st := e.state("web").body
		if !strings.Contains(st, `"owners":["new@example.com"]`) || !strings.Contains(st, `"options":{"x":1}`) {
			t.Errorf("state = %s", st)
		}
	})
	t.Run("last upstream removed frees the base path", func(t *testing.T) {
		e.resp(e.post(reqSpec{id: "taker1", svc: "taker", path: "/web", add: []string{"10.0.0.7:80"}}.json()))
		e.steps(3)
		e.mustState("taker1", stateInvalidRequestNoop, "")
		run(reqSpec{id: "rm-last", remove: []string{"10.0.0.1:80"}})
		run(reqSpec{id: "taker2", svc: "taker", path: "/web", add: []string{"10.0.0.7:80"}})
	})
}

// docs/lb-contract.md#idempotent-post.
func TestIdempotentPost(t *testing.T) {
	e := newEnv(t, Options{})
	body := reqSpec{id: "r1", add: []string{"10.0.0.1:80"}}.json()
	first := e.post(body).body

	t.Run("same body while active returns the stored response", func(t *testing.T) {
		if got := e.post(body).body; got != first {
			t.Errorf("re-POST\n got %s\nwant %s", got, first)
		}
	})
	t.Run("missing upstream request id equals the request id", func(t *testing.T) {
		same := strings.Replace(body, `"requestId":"r1",`, "", 1)
		if got := e.resp(e.post(same)); got.State != stateWaiting {
			t.Errorf("re-POST without upstream requestId: %s %q", got.State, got.Message)
		}
	})
	t.Run("different body while active fails and is not stored", func(t *testing.T) {
		other := reqSpec{id: "r1", add: []string{"10.0.0.2:80"}}.json()
		got := e.post(other)
		want := `{"loadBalancerRequestId":"r1","loadBalancerState":"FAILED","message":"Request r1 is already enqueued with different parameters","agentResponses":null,"request":null}`
		if got.body != want {
			t.Errorf("got  %s\nwant %s", got.body, want)
		}
		if e.get("r1").body != first {
			t.Errorf("the stored request changed")
		}
	})
	e.steps(3)
	final := e.mustState("r1", stateSuccess, "").Message

	t.Run("finished id is never re-executed", func(t *testing.T) {
		e.resp(e.post(reqSpec{id: "rm", remove: []string{"10.0.0.1:80"}}.json()))
		e.steps(3)
		for _, b := range []string{body, reqSpec{id: "r1", add: []string{"10.0.0.3:80"}}.json()} {
			got := e.resp(e.post(b))
			if got.State != stateSuccess || got.Message != final {
				t.Errorf("re-POST of a finished id: %s %q", got.State, got.Message)
			}
		}
		e.steps(3)
		if got := e.srv.Upstreams("web"); len(got) != 0 {
			t.Errorf("finished request ran again: upstreams %v", got)
		}
	})
	t.Run("finished id under another service is new", func(t *testing.T) {
		got := e.resp(e.post(reqSpec{id: "r1", svc: "api", add: []string{"10.0.0.4:80"}}.json()))
		if got.State != stateWaiting {
			t.Errorf("got %s %q, want WAITING (history is per service)", got.State, got.Message)
		}
	})
}

// docs/lb-contract.md#idempotent-post: the worker sets noValidate on
// remove-only requests, so an identical re-POST while active is "already
// enqueued with different parameters".
func TestRemoveOnlyRequestIsRewritten(t *testing.T) {
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "a", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	body := reqSpec{id: "rm", remove: []string{"10.0.0.1:80"}}.json()
	e.resp(e.post(body))
	if got := e.resp(e.post(body)); got.State != stateWaiting {
		t.Fatalf("re-POST before the worker ran: %s", got.State)
	}
	e.steps(1)
	if got := e.resp(e.post(body)); got.State != stateFailed || !strings.Contains(got.Message, "already enqueued with different parameters") {
		t.Fatalf("re-POST after the worker rewrote it: %s %q", got.State, got.Message)
	}
	var stored struct {
		NoValidate bool `json:"noValidate"`
	}
	r := e.mustState("rm", stateWaiting, "")
	mustNoErr(t, json.Unmarshal(*r.Request, &stored))
	if !stored.NoValidate {
		t.Errorf("stored request has noValidate=false")
	}
	e.steps(2)
	e.mustState("rm", stateSuccess, "")
}

// docs/lb-contract.md#post-answers: checks that fail the POST (200 FAILED, not
// stored), and what this server refuses the same way because it does not
// implement it.
func TestEnqueueRejections(t *testing.T) {
	const notImplemented = " is not implemented by this reference LB API (examples/lbapi): it carries out UPDATE requests that add and remove upstreams"
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "api1", svc: "api", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	tests := []struct {
		name, message string
		spec          reqSpec
	}{
		{"duplicate upstream in another service",
			"If noDuplicateUpstreams is specified, you cannot have duplicate upstreams. Found these duplicate upstreams: [10.0.0.1:80]",
			reqSpec{id: "dup", add: []string{"10.0.0.2:80", "10.0.0.1:80"}}},
		{"REVERT", "action REVERT" + notImplemented, reqSpec{id: "revert", extra: map[string]any{"action": "REVERT"}}},
		{"DELETE", "action DELETE" + notImplemented, reqSpec{id: "del", extra: map[string]any{"action": "DELETE"}}},
		{"replaceUpstreams", "replaceUpstreams" + notImplemented, reqSpec{id: "repl", replace: []string{"10.0.0.4:80"}}},
		{"replaceServiceId", "replaceServiceId" + notImplemented, reqSpec{id: "rsid", extra: map[string]any{"replaceServiceId": "api"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := e.resp(e.post(tc.spec.json()))
			if got.State != stateFailed || got.Message != tc.message || got.Request != nil {
				t.Errorf("got %s %q (request %v)", got.State, got.Message, got.Request != nil)
			}
			if a := e.get(tc.spec.id); a.status != 404 {
				t.Errorf("a rejected request was stored: GET %d", a.status)
			}
		})
	}
	t.Run("duplicates allowed without the flag", func(t *testing.T) {
		got := e.resp(e.post(reqSpec{id: "dup2", add: []string{"10.0.0.1:80"}, extra: map[string]any{"noDuplicateUpstreams": false}}.json()))
		if got.State != stateWaiting {
			t.Errorf("got %s %q", got.State, got.Message)
		}
	})
	t.Run("same service may re-add its upstream", func(t *testing.T) {
		got := e.resp(e.post(reqSpec{id: "api2", svc: "api", add: []string{"10.0.0.1:80"}}.json()))
		if got.State != stateWaiting {
			t.Errorf("got %s %q", got.State, got.Message)
		}
	})
}

// docs/lb-contract.md#delete-answers.
func TestCancel(t *testing.T) {
	tests := []struct {
		name     string
		stepsIn  int // worker runs before the DELETE
		answer   string
		final    string
		message  string
		upstream bool // committed at the end
	}{
		{"pending", 0, stateCanceling, stateCanceled, "Apply failed {No agent responses}, CANCEL OK.", false},
		{"applying", 2, stateCanceling, stateCanceled, "Apply failed {http://default-agent-1:8882/baragon-agent/v2/request/r - SUCCESS}, CANCEL OK.", false},
		{"already final", 3, stateSuccess, stateSuccess, "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: []", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			e.resp(e.post(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json()))
			e.steps(tc.stepsIn)
			if got := e.resp(e.del("r")); got.State != tc.answer {
				t.Fatalf("DELETE answered %s %q, want %s", got.State, got.Message, tc.answer)
			}
			if got := e.resp(e.del("r")); got.State != tc.answer {
				t.Fatalf("second DELETE answered %s, want %s", got.State, tc.answer)
			}
			e.steps(2)
			e.mustState("r", tc.final, tc.message)
			if got := e.srv.Upstreams("web") != nil; got != tc.upstream {
				t.Errorf("upstream committed = %v, want %v", got, tc.upstream)
			}
		})
	}
	t.Run("unknown id", func(t *testing.T) {
		e := newEnv(t, Options{})
		want := `{"loadBalancerRequestId":"nope","loadBalancerState":"CANCELED","message":"Request nope does not exist","agentResponses":null,"request":null}`
		if got := e.del("nope"); got.status != 200 || got.body != want {
			t.Errorf("got %d %s", got.status, got.body)
		}
	})
	t.Run("cancel of a reverting request", func(t *testing.T) {
		e := newEnv(t, Options{})
		mustNoErr(t, e.srv.SetApplyFailure("default", true))
		e.resp(e.post(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json()))
		e.steps(3) // now FAILED_SEND_REVERT_REQUESTS: public WAITING, so cancellable
		if got := e.resp(e.del("r")); got.State != stateCanceling {
			t.Fatalf("DELETE answered %s", got.State)
		}
		e.steps(2)
		e.mustState("r", stateCanceled, "")
	})
	t.Run("cancel of a pending request keeps another service's path", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.resp(e.post(reqSpec{id: "o", svc: "other", path: "/web", add: []string{"10.0.0.5:80"}}.json()))
		e.steps(3)
		e.resp(e.post(reqSpec{id: "r", svc: "web", path: "/web", add: []string{"10.0.0.1:80"}}.json()))
		e.resp(e.del("r"))
		e.steps(2)
		e.mustState("r", stateCanceled, "")
		e.resp(e.post(reqSpec{id: "r2", svc: "web", path: "/web", add: []string{"10.0.0.1:80"}}.json()))
		e.steps(1)
		e.mustState("r2", stateInvalidRequestNoop, "Invalid request due to base path conflicts: [ other on group default ]")
	})
}

// docs/lb-contract.md#queueing: one in-flight batch per service, global order,
// consecutive requests that leave the service unchanged batched together.
func TestOrdering(t *testing.T) {
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "a1", svc: "a", add: []string{"10.0.0.1:80"}}.json()))
	e.resp(e.post(reqSpec{id: "a2", svc: "a", path: "/a2", add: []string{"10.0.0.2:80"}}.json())) // changes the service
	e.resp(e.post(reqSpec{id: "b1", svc: "b", add: []string{"10.0.0.3:80"}}.json()))

	states := func() string {
		var out []string
		for _, id := range []string{"a1", "a2", "b1"} {
			s, _ := e.srv.RequestState(id)
			out = append(out, s)
		}
		return strings.Join(out, " ")
	}
	internal := func(id string) internalState {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		if a, ok := e.srv.st.active[id]; ok {
			return a.state
		}
		return -1
	}
	e.steps(1)
	if internal("a1") != stateSendApplyRequests || internal("a2") != statePending || internal("b1") != stateSendApplyRequests {
		t.Fatalf("after 1 run: a1 %s a2 %s b1 %s; want a2 held behind a1", internal("a1"), internal("a2"), internal("b1"))
	}
	e.steps(2)
	if got := states(); got != "SUCCESS WAITING SUCCESS" {
		t.Fatalf("after 3 runs: %s", got)
	}
	e.steps(3)
	if got := states(); got != "SUCCESS SUCCESS SUCCESS" {
		t.Fatalf("after 6 runs: %s", got)
	}

	t.Run("unchanged service batches consecutive requests", func(t *testing.T) {
		for _, id := range []string{"b2", "b3"} {
			e.resp(e.post(reqSpec{id: id, svc: "b", add: []string{"10.0.1." + id[1:] + ":80"}}.json()))
		}
		e.steps(3)
		if s2, _ := e.srv.RequestState("b2"); s2 != stateSuccess {
			t.Errorf("b2 %s", s2)
		}
		if s3, _ := e.srv.RequestState("b3"); s3 != stateSuccess {
			t.Errorf("b3 %s: not batched with b2", s3)
		}
	})
}

func TestMaxRequestsPerPoll(t *testing.T) {
	e := newEnv(t, Options{})
	for i := range maxRequestsPerPoll + 2 {
		svc := fmt.Sprintf("s%d", i)
		e.resp(e.post(reqSpec{id: svc + "-1", svc: svc, add: []string{fmt.Sprintf("10.0.0.%d:80", i+1)}}.json()))
	}
	e.steps(1)
	e.srv.mu.Lock()
	started := 0
	for _, a := range e.srv.st.active {
		if a.state != statePending {
			started++
		}
	}
	e.srv.mu.Unlock()
	if started != maxRequestsPerPoll {
		t.Errorf("%d requests started in one run, want %d", started, maxRequestsPerPoll)
	}
}

func TestNoValidateNoReloadGoFirst(t *testing.T) {
	list := []*activeRequest{
		{queued: queuedRequestID{Index: 0}},
		{queued: queuedRequestID{Index: 1}, req: request{NoValidate: true}},
		{queued: queuedRequestID{Index: 2}, req: request{NoValidate: true, NoReload: true}},
		{queued: queuedRequestID{Index: 3}, req: request{NoReload: true}},
	}
	sortQueued(list)
	var got []int
	for _, a := range list {
		got = append(got, a.queued.Index)
	}
	if !slices.Equal(got, []int{2, 1, 3, 0}) {
		t.Errorf("order %v, want [2 1 3 0]", got)
	}
}

// docs/lb-contract.md#finishing-and-history: a final request leaves the
// queue and the active area and stays readable from its service's history,
// of which the newest historyPerService are kept.
func TestHistoryRetention(t *testing.T) {
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "h0", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	e.mustState("h0", stateSuccess, "")
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	if len(e.srv.st.active) != 0 || len(e.srv.st.queue) != 0 {
		t.Errorf("finished requests left in the active area: %d active, %d queued", len(e.srv.st.active), len(e.srv.st.queue))
	}
	st := e.srv.st
	for i := 1; i <= historyPerService; i++ {
		id := fmt.Sprintf("h%d", i)
		st.enqueue(request{ID: id, Service: &service{ServiceID: "web"}})
		st.finish(st.active[id])
	}
	if _, ok := st.getResponse("h0"); ok {
		t.Errorf("h0 still readable beyond the %d newest", historyPerService)
	}
	if _, ok := st.historyIndex["h0"]; ok {
		t.Errorf("trimmed request still indexed")
	}
	if _, ok := st.getResponse("h1"); !ok || len(st.history["web"]) != historyPerService {
		t.Errorf("h1 readable %v, %d kept, want the %d newest", ok, len(st.history["web"]), historyPerService)
	}
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// docs/lb-contract.md#commit: redefining a service frees the paths and groups
// it left; upstreamUpdateOnly leaves the definition alone.
func TestServiceRedefinition(t *testing.T) {
	e := newEnv(t, Options{Groups: []Group{{Name: "default"}, {Name: "g2"}}})
	run := func(spec reqSpec, state string) {
		t.Helper()
		e.resp(e.post(spec.json()))
		e.steps(3)
		e.mustState(spec.id, state, "")
	}
	run(reqSpec{id: "w1", svc: "web", path: "/web", groups: []string{"default", "g2"}, add: []string{"10.0.0.1:80"}}, stateSuccess)
	run(reqSpec{id: "x1", svc: "x", path: "/web", groups: []string{"g2"}, add: []string{"10.0.0.2:80"}}, stateInvalidRequestNoop)

	t.Run("moved path and dropped group are freed", func(t *testing.T) {
		run(reqSpec{id: "w2", svc: "web", path: "/web2", groups: []string{"default"}, add: []string{"10.0.0.1:80"}}, stateSuccess)
		run(reqSpec{id: "x2", svc: "x", path: "/web", groups: []string{"default", "g2"}, add: []string{"10.0.0.2:80"}}, stateSuccess)
	})
	t.Run("upstreamUpdateOnly keeps the definition", func(t *testing.T) {
		run(reqSpec{id: "w3", svc: "web", path: "/web2", groups: []string{"default"}, add: []string{"10.0.0.3:80"},
			svcExtra: map[string]any{"owners": []string{"someone@else"}}, extra: map[string]any{"upstreamUpdateOnly": true}}, stateSuccess)
		if st := e.state("web").body; strings.Contains(st, "someone@else") || !strings.Contains(st, "10.0.0.3:80") {
			t.Errorf("state %s", st)
		}
	})
}

// A revert that gets no agent answer ends FAILED_REVERT_FAILED (FAILED).
func TestRevertFailure(t *testing.T) {
	e := newEnv(t, Options{})
	mustNoErr(t, e.srv.SetApplyFailure("default", true))
	e.resp(e.post(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3) // FAILED_SEND_REVERT_REQUESTS
	mustNoErr(t, e.srv.SetAgents("default", 0))
	e.steps(2)
	e.mustState("r", stateFailed, "Apply failed {(500) - simulated agent failure}, REVERT failed {No agent responses}")
}
