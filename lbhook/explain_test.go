package lbhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Every failure an operator can meet is explained with its cause, in the
// LB's words where it gave any, and the field to fix; the auth key never
// shows.
func TestDiagnoseNamesCauseAndFix(t *testing.T) {
	cfg := Config{URI: "http://lb.example:8080/baragon/v2/request", ServiceID: "web"}
	refused := &url.Error{Op: "Post", URL: "http://lb.example:8080/baragon/v2/request?authkey=REDACTED",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
	call := func(status int, body string, err error) *CallError {
		state := StateUnknown
		if status >= 400 && status < 500 {
			state = StateFailed
		}
		return &CallError{Method: "POST", URL: "http://lb.example:8080/baragon/v2/request?authkey=REDACTED",
			StatusCode: status, Body: body, State: state, Err: err}
	}
	outcome := func(state RequestState, msg string) error {
		return &OutcomeError{RequestID: "a1-ADD-7", State: state, Message: msg, Deadline: time.Minute}
	}
	for _, tc := range []struct {
		name        string
		err         error
		cause, fix  []string
		unreachable bool
	}{
		{"connection refused", call(0, "", refused),
			[]string{"no answer from http://lb.example:8080/baragon/v2/request", "connection refused"},
			[]string{"load_balancer.uri", "is up"}, true},
		{"refused, wrapped by the run's error", fmt.Errorf("lb request a1-ADD-7: %w (last state UNKNOWN); last call: %w", ErrNotFinal, call(0, "", refused)),
			[]string{"connection refused"}, []string{"load_balancer.uri"}, true},
		{"5xx", call(503, `{"code":503}`, nil), []string{"answered HTTP 503", `{"code":503}`}, []string{"is failing: check its logs"}, true},
		{"bad auth key", call(403, "", nil), []string{"HTTP 403"}, []string{"load_balancer.authkey_file", DefaultAuthKeyEnv}, false},
		{"wrong path", call(404, "", nil), []string{"HTTP 404"}, []string{"load_balancer.uri", "request collection"}, false},
		{"unknown group", outcome(StateInvalidRequestNoop, "Invalid request due to non-existent load balancer groups: [nope]"),
			[]string{"a1-ADD-7", "INVALID_REQUEST_NOOP", "non-existent load balancer groups: [nope]"}, []string{"load_balancer.groups"}, false},
		{"base path conflict", outcome(StateInvalidRequestNoop, "Invalid request due to base path conflicts: [ other on group g ]"),
			[]string{"base path conflicts"}, []string{"load_balancer.base_path"}, false},
		{"too few agents", outcome(StateFailed, "Invalid request due to not enough agents present for group: g"),
			[]string{"FAILED", "not enough agents"}, []string{"load_balancer.groups", "LB agents"}, false},
		{"unserved domain", outcome(StateInvalidRequestNoop, "No groups present that serve domains: [x.example]"),
			[]string{"serve domains"}, []string{"load_balancer.domains"}, false},
		{"apply failed", outcome(StateFailed, "Apply failed {(500) - simulated agent failure}, REVERT OK."),
			[]string{"FAILED", "simulated agent failure"}, []string{"LB agents"}, false},
		{"duplicate upstream", outcome(StateFailed, "If noDuplicateUpstreams is specified, you cannot have duplicate upstreams. Found these duplicate upstreams: [h:1]"),
			[]string{"duplicate upstreams"}, []string{"load_balancer.service_id"}, false},
		{"add cancelled at its deadline", outcome(StateCanceled, ""), []string{"CANCELED"}, []string{"load_balancer.add_deadline", "1m0s"}, false},
		{"remove cancelled at its deadline", &OutcomeError{RequestID: "a1-REMOVE-7", State: StateCanceled, Deadline: 10 * time.Second},
			[]string{"CANCELED"}, []string{"load_balancer.remove_deadline"}, false},
		{"POST refused as 403 (final FAILED)", outcome(StateFailed, "POST http://lb.example:8080/baragon/v2/request?authkey=REDACTED: response status code 403"),
			[]string{"status code 403"}, []string{"load_balancer.authkey_file"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Diagnose(tc.err, cfg)
			for _, w := range tc.cause {
				if !strings.Contains(d.Cause, w) {
					t.Errorf("cause %q does not say %q", d.Cause, w)
				}
			}
			for _, w := range tc.fix {
				if !strings.Contains(d.Fix, w) {
					t.Errorf("fix %q does not say %q", d.Fix, w)
				}
			}
			if d.Unreachable != tc.unreachable {
				t.Errorf("unreachable %v, want %v", d.Unreachable, tc.unreachable)
			}
		})
	}
}

// The cause of a real unanswered call, through Run, hides the auth key.
func TestDiagnoseOfARealRunHidesTheKey(t *testing.T) {
	c := newTestClient(t, testConfig(refusedURI(t)), nil)
	_, err := c.Run(t.Context(), c.NewRequest("r1", []UpstreamInfo{self}, nil), time.Now().Add(30*time.Millisecond))
	d := Diagnose(err, c.Config())
	if !d.Unreachable || !strings.Contains(d.Cause, "connection refused") || !strings.Contains(d.Fix, "load_balancer.uri") {
		t.Errorf("diagnosis %+v, want an unreachable LB, its cause and load_balancer.uri", d)
	}
	assertNoSecret(t, "diagnosis", d.String())
}
