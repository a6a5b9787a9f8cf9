package shim

import (
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
)

// The events an operator reads when the LB fails: each says what happened
// and what to do, with the LB's URL (lbhook tests that no key shows).
func TestLBFailureMessages(t *testing.T) {
	cfg := lbhook.Config{URI: "http://lb.example:8080/baragon/v2/request", ServiceID: "web", AddDeadline: time.Minute}
	refused := &lbhook.CallError{Method: "POST", URL: "http://lb.example:8080/baragon/v2/request?authkey=REDACTED", State: lbhook.StateUnknown,
		Err: &url.Error{Op: "Post", URL: "http://lb.example:8080/baragon/v2/request?authkey=REDACTED",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}}
	invalid := &lbhook.OutcomeError{RequestID: "a1-ADD-7", State: lbhook.StateInvalidRequestNoop,
		Message: "Invalid request due to non-existent load balancer groups: [nope]"}
	failed := &lbhook.OutcomeError{RequestID: "a1-ADD-7", State: lbhook.StateFailed, Message: "Apply failed {(500) - simulated agent failure}, REVERT OK."}
	first := lbhook.Unanswered{RequestID: "a1-ADD-7", Err: refused, Since: time.Now(), Calls: 1}
	later := lbhook.Unanswered{RequestID: "a1-ADD-7", Err: refused, Since: time.Now().Add(-30 * time.Second), Calls: 12}

	for _, tc := range []struct {
		name string
		got  string
		want []string
	}{
		{"first unanswered call of the ADD", lbUnansweredMessage(first, false, cfg), []string{
			"Holding the lock; not yet in the load balancer: ", "http://lb.example:8080/baragon/v2/request", "connection refused",
			"(1 call)", "load_balancer.uri", "load_balancer.add_deadline (1m0s)", restartNote}},
		{"a later report counts the calls", lbUnansweredMessage(later, false, cfg), []string{"12 calls in 30s", "connection refused"}},
		{"unanswered re-add", lbUnansweredMessage(first, true, cfg), []string{"vanished from the load balancer", "connection refused", "load_balancer.uri"}},
		{"ADD never answered", lbAddFailedMessage(errors.Join(lbhook.ErrNotFinal, refused), cfg), []string{
			"LB add failed: ", "connection refused", "add_deadline (1m0s)",
			"the LB API at http://lb.example:8080/baragon/v2/request is down", "Nomad will restart the task per its restart policy"}},
		{"ADD refused: unknown group", lbAddFailedMessage(invalid, cfg), []string{
			"LB add failed: ", "INVALID_REQUEST_NOOP", "Invalid request due to non-existent load balancer groups: [nope]",
			"load_balancer.groups", "never routed", restartNote}},
		{"ADD FAILED by the LB's agents", lbAddFailedMessage(failed, cfg), []string{"FAILED", "simulated agent failure", "LB agents", restartNote}},
		{"re-check unanswered while registered", lbRecheckFailedMessage(refused, 3, cfg, 10*time.Second), []string{
			"Registered, but the load balancer's state cannot be read (3 re-checks in a row failed)", "connection refused",
			"load_balancer.uri", "recheck_interval (10s)"}},
		{"REMOVE never answered", lbRemoveFailedMessage(refused, cfg, "10.0.0.1:80"), []string{
			"LB remove failed: ", "connection refused", "load_balancer.uri", "10.0.0.1:80 may stay in load balancer service web", "next holder's ADD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if !strings.Contains(tc.got, w) {
					t.Errorf("message does not say %q:\n%s", w, tc.got)
				}
			}
		})
	}
}

// The audit's case: a FAILED answer with a 1 MiB message made a 1 MiB task
// event. The LB's part of the event is now bounded and marked as cut.
func TestLBMessageOfAHugeAnswerIsBounded(t *testing.T) {
	cfg := lbhook.Config{URI: "http://lb.example:8080/baragon/v2/request", ServiceID: "web", AddDeadline: time.Minute}
	failed := &lbhook.OutcomeError{RequestID: "a1-ADD-7", State: lbhook.StateFailed, Message: "Apply failed {" + strings.Repeat("x", 1<<20) + "}"}
	for what, msg := range map[string]string{
		"add failed":    lbAddFailedMessage(failed, cfg),
		"remove failed": lbRemoveFailedMessage(failed, cfg, "10.0.0.1:8080"),
	} {
		if len(msg) > 2*lbhook.MaxLBText+400 || !strings.Contains(msg, "…(cut from ") || !strings.Contains(msg, "could not apply the change") {
			t.Errorf("%s: %d bytes: %.200q…", what, len(msg), msg)
		}
	}
}
