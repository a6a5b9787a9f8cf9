package shim

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
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

// eventExamples renders every kind of event the supervisor emits, in each
// of its variants, by its constructor in events.go.
func eventExamples() map[string][]string {
	cfg := lbhook.Config{URI: "http://lb.example:8080/baragon/v2/request", ServiceID: "web", AddDeadline: time.Minute}
	refused := &lbhook.CallError{Method: "POST", URL: "http://lb.example:8080/baragon/v2/request", State: lbhook.StateUnknown,
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
	invalid := &lbhook.OutcomeError{RequestID: "a1-ADD-7", State: lbhook.StateInvalidRequestNoop, Message: "no such group"}
	unanswered := lbhook.Unanswered{RequestID: "a1-ADD-7", Err: refused, Since: time.Now(), Calls: 1}
	holder := lockclient.Holder{AllocID: "0123456789abcdef", Node: "node-1"}
	lost := &lockclient.LostError{Reason: "Nomad answered 409 on renew: the lock is no longer ours (lock id mismatch)"}
	lockCfg := lockclient.Config{Path: "nomad/jobs/web/lock", Timing: lockclient.Timing{TTL: 15 * time.Second, LockDelay: 5 * time.Second}}
	releaseErr := fmt.Errorf("release nomad/jobs/web/lock: gave up, the lock expires on its own: %w", errors.New("connection refused"))
	rejected := fmt.Errorf("release nomad/jobs/web/lock: %w (ACL token not found)", lockclient.ErrIdentityRejected)
	leftToExpire := fmt.Errorf("release nomad/jobs/web/lock: %w", lockCfg.Timing.MayRelease(time.Now().Add(-time.Minute), time.Now()))
	gate := &gatedWorkload{gated: []string{"app", "db"}, direct: []string{"app"}, tasks: []GatedTask{{"app", "docker"}, {"db", "java"}},
		killBound: 40 * time.Second}
	return map[string][]string{
		"waiting-held":          {waitingHeldMessage("nomad/jobs/web/lock", holder)},
		"stopped-while-waiting": {stoppedWhileWaitingMessage()},
		"acquired":              {acquiredMessage(7)},
		"lock-denied":           {lockDeniedMessage(&lockclient.PermissionError{Op: "acquire", Path: "nomad/jobs/web/web/api/lock", JobID: "web"})},
		"acquired-slot":         {acquiredSlotMessage(1, 3, "nomad/jobs/q/workers/slot-1", 7)},
		"lock-lost": {lockLostMessage(lost), lockLostMessage(&lockclient.LostError{Reason: "Nomad answered 404 on renew: the lock variable was deleted"}),
			lockLostMessage(&lockclient.LostError{Reason: "no successful renew before the fence deadline (14s)"})},
		"stopping":           {stoppingMessage("SIGTERM")},
		"sigkill-after-loss": {killAfterLossMessage(3*time.Second, 30*time.Second, lost)},
		"lost-while-stopping": {lostWhileStoppingMessage(lost, true, 4*time.Second, 20*time.Second, false),
			lostWhileStoppingMessage(lost, false, 0, 0, true)},
		"renewed-again":        {renewedAgainMessage(30*time.Second, 25*time.Second)},
		"released":             {releasedMessage()},
		"left-to-expire":       {LeftToExpireMessage(leftToExpire)},
		"not-released-by-task": {releaseFailedMessage(rejected, lockCfg, true)},
		"not-released":         {releaseFailedMessage(releaseErr, lockCfg, false), releaseFailedMessage(rejected, lockCfg, false)},

		"lb-healthy":          {lbHealthyMessage("10.0.0.1:8080")},
		"lb-registered":       {lbRegisteredMessage("10.0.0.1:8080", "web")},
		"lb-readded":          {lbReaddedMessage("10.0.0.1:8080", "web", 2)},
		"lb-unanswered":       {lbUnansweredMessage(unanswered, false, cfg)},
		"lb-readd-unanswered": {lbUnansweredMessage(unanswered, true, cfg)},
		"lb-recheck-failed":   {lbRecheckFailedMessage(refused, 3, cfg, 10*time.Second)},
		"lb-add-failed": {lbStartFailedMessage(errors.New("load_balancer.port: no such port label")),
			lbAddFailedMessage(errors.Join(lbhook.ErrNotFinal, refused), cfg), lbAddFailedMessage(invalid, cfg),
			gateLBStartFailedMessage(errors.New("bad")), gateLBAddFailedMessage(invalid, cfg)},
		"lb-removed":        {lbRemovedMessage("10.0.0.1:8080", "web", lbhook.BaragonResponse{})},
		"lb-remove-failed":  {lbRemoveFailedMessage(refused, cfg, "10.0.0.1:8080")},
		"lb-remove-skipped": {lbRemoveSkippedMessage("10.0.0.1:8080", "web")},

		"gate-not-started":         {gateNotStartedMessage(&GateConfigError{Msg: `gate "lock": must be a prestart sidecar`})},
		"on-lock-not-started":      {watchNotStartedMessage(errors.New("read allocation a1: permission denied"))},
		"gate-adopt-failed":        {gateAdoptFailedMessage(&lockclient.LostError{Reason: "the lease of the previous run (fence 3) is no longer held"})},
		"gate-acquired":            {gateAcquiredMessage(7, ""), gateAcquiredMessage(7, " on slot 1 of 2 (p/slot-1)")},
		"gate-took-over":           {gateTookOverMessage(7, ""), gateTookOverMessage(7, " on slot 1 of 2 (p/slot-1)")},
		"update-giving-way":        {updateGivingWayMessage(10*time.Second, "0cad7827", 5)},
		"update-no-read-job":       {updateNoReadJobMessage("web", "default")},
		"update-keep-serving":      {updateKeepServingMessage(16*time.Second, "0cad7827", 5)},
		"update-successor-waiting": {updateSuccessorWaitingMessage("0cad7827", 5, 1200*time.Millisecond)},
		"update-successor-gone":    {updateSuccessorGoneMessage(300 * time.Millisecond)},
		"update-successor-late":    {updateSuccessorLateMessage(16 * time.Second)},
		"gate-stopping":            {gateStoppingMessage(false), gateStoppingMessage(true)},
		"gate-kills-itself":        {gate.killerMessage(lockCfg.Timing)},
		"gate-leaves-to-nomad":     {(&gatedWorkload{gated: []string{"db"}, tasks: []GatedTask{{"db", "java"}}, killBound: time.Minute}).killerMessage(lockCfg.Timing)},
		"gate-killed":              {gateKilledMessage([]string{"app"}, "the lock was lost")},
		"gate-kill-unproven":       {gateKillUnprovenMessage([]string{"app"}, errors.New("docker: no answer"))},
		"gate-lost":                {gateLostMessage([]string{"app"}, []string{"db"}), gateLostMessage(nil, []string{"app", "db"})},
		"gate-identity-rejected":   {gateIdentityRejectedMessage(35 * time.Second)},
		"gate-lock-kept":           {gateLockKeptMessage("the gate stopped by itself (its command exited)", []string{"app"}, 35*time.Second)},
		"gate-kept-for-restart":    {gateKeptForRestartMessage([]string{"app"}, 5700*time.Millisecond)},
		"gate-await-previous":      {gateAwaitPreviousMessage("nomad/jobs/web/lock", holder, []string{"app"})},

		"standby-unlisted": {standbyUnlistedMessage(&lockclient.StandbyPermissionError{Op: "record standby", LockPath: "nomad/jobs/web/lock"})},
		"step-down-giving-way": {
			stepDownGivingWayMessage(lockclient.Handover{From: "a1", To: "0cad7827-1", Until: time.Now().Add(time.Minute)}, 30*time.Second),
			stepDownGivingWayMessage(lockclient.Handover{From: "a1", Until: time.Now().Add(time.Minute)}, 30*time.Second)},
		"step-down-requested": {stepDownRequestedMessage(sdRequest, lockclient.StepDownStop),
			stepDownRequestedMessage(lockclient.StepDownRequest{Wait: 30 * time.Second}, lockclient.StepDownRestart)},
		"stepped-down": {steppedDownMessage(sdRequest, lockclient.StepDownStop), steppedDownMessage(lockclient.StepDownRequest{}, lockclient.StepDownRestart)},
	}
}

// sdRequest is a step-down request naming a standby.
var sdRequest = lockclient.StepDownRequest{To: "0cad7827-1", Wait: 30 * time.Second}

// TestEventsDocumented: every kind of event the supervisor emits is listed
// in docs/troubleshooting.md, each rendering matching how a row of its
// tables says it begins, with what it means and what to do. An event added
// without its row, or a text changed without its doc, fails it.
func TestEventsDocumented(t *testing.T) {
	examples := eventExamples()
	if len(examples) < 30 {
		t.Fatalf("only %d kinds with examples", len(examples))
	}
	for _, p := range events.CheckPackage("../docs/troubleshooting.md", "shim", examples) {
		t.Error(p)
	}
}
