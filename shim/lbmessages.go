package shim

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
)

// The task events an operator reads when the load balancer fails. Each
// names what happened (the state and the LB's own message, or the call
// that got no answer, with the LB's URL but never its auth key) and what to
// do: the load_balancer field to check, or that the LB API is down and
// Nomad will restart the task.

// restartNote ends the message of a failure that stops the workload.
const restartNote = "Nomad will restart the task per its restart policy"

// lbUnansweredMessage is the notice for calls of an ADD (or a re-add, when
// registered) that get no usable answer: sent at the first one, then at
// the client's bounded rate.
func lbUnansweredMessage(u lbhook.Unanswered, registered bool, cfg lbhook.Config) string {
	d := lbhook.Diagnose(u.Err, cfg)
	what := "Holding the lock; not yet in the load balancer"
	if registered {
		what = "Our upstream vanished from the load balancer, and the re-add"
	}
	calls := "1 call"
	if u.Calls > 1 {
		calls = fmt.Sprintf("%d calls in %s", u.Calls, time.Since(u.Since).Round(time.Second))
	}
	msg := fmt.Sprintf("%s: %s (%s); %s", what, d.Cause, calls, d.Fix)
	if !registered {
		msg += fmt.Sprintf("; retrying until load_balancer.add_deadline (%s), then the task stops and %s", cfg.AddDeadline, restartNote)
	}
	return msg
}

// lbRecheckFailedMessage is the notice for re-checks of a registered
// holder that fail: the first, then at most every 30 s while they go on.
func lbRecheckFailedMessage(err error, fails int, cfg lbhook.Config, every time.Duration) string {
	d := lbhook.Diagnose(err, cfg)
	return fmt.Sprintf("Registered, but the load balancer's state cannot be read (%d re-checks in a row failed): %s; %s; "+
		"the workload keeps running, and whether our upstream is still there is checked again every load_balancer.recheck_interval (%s)",
		fails, d.Cause, d.Fix, max(every, time.Second))
}

// lbAddFailedMessage is the event of an ADD that ended without SUCCESS:
// the workload is stopped (exit 74).
func lbAddFailedMessage(err error, cfg lbhook.Config) string {
	d := lbhook.Diagnose(err, cfg)
	if d.Unreachable {
		return fmt.Sprintf("LB add failed: %s, until load_balancer.add_deadline (%s) passed: the LB API at %s is down or failing; %s; %s",
			d.Cause, cfg.AddDeadline, redactURI(cfg.URI), d.Fix, restartNote)
	}
	return fmt.Sprintf("LB add failed: %s; %s; %s", d.String(), stopNote(err), restartNote)
}

// stopNote says what became of the workload after a refused ADD.
func stopNote(err error) string {
	var oe *lbhook.OutcomeError
	if errors.As(err, &oe) {
		return "the workload was never routed and is stopped"
	}
	return "the workload is stopped"
}

// lbRemoveFailedMessage is the event of a REMOVE that did not succeed
// within its budget: the workload is stopped anyway.
func lbRemoveFailedMessage(err error, cfg lbhook.Config, upstream string) string {
	d := lbhook.Diagnose(err, cfg)
	return fmt.Sprintf("LB remove failed: %s; %s; stopping the workload anyway: %s may stay in load balancer service %s "+
		"until the next holder's ADD replaces it, or until it is removed by hand", d.Cause, d.Fix, upstream, cfg.ServiceID)
}

// redactURI is uri without userinfo.
func redactURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	return u.Redacted()
}
