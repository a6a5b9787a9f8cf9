package shim

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Every task event the supervisor emits, with its text: the one place a
// message is worded. Each kind is declared with a stable identifier and
// the fixed text its messages begin with (internal/events), which
// docs/troubleshooting.md lists with what it means and what to do
// (TestEventsDocumented, at the repository's root, holds the two together;
// TestEventTextsHaveOneHome that no event text is built elsewhere).

// The lock: waiting, holding, losing.
var (
	evWaitingHeld     = events.New("waiting-held", "Waiting for lock ")
	evStoppedWaiting  = events.New("stopped-while-waiting", "Allocation stopped while waiting for the lock: not taking it")
	evLockDenied      = events.New("lock-denied", "Lock denied (HTTP 403): ")
	evAcquired        = events.New("acquired", "Acquired lock (fence ")
	evAcquiredSlot    = events.New("acquired-slot", "Acquired slot ")
	evLockLost        = events.New("lock-lost", "Lock lost: ")
	evStopping        = events.New("stopping", "Stopping workload with ")
	evKillAfterLoss   = events.New("sigkill-after-loss", "Killing the workload with SIGKILL after ")
	evLostWhileStop   = events.New("lost-while-stopping", "Lock lost while stopping the workload (")
	evRenewedAgain    = events.New("renewed-again", "Lock renewed again: it was still ours; the workload keeps its kill_timeout (")
	evReleased        = events.New("released", "Released lock")
	evLeftToExpire    = events.New("left-to-expire", "Lock left to expire, not released: ")
	evNotReleasedTask = events.New("not-released-by-task", "Lock not released by the task (")
	evNotReleased     = events.New("not-released", "Lock not released (")
)

// Rolling updates (update.go).
var (
	evUpdateGivingWay = events.New("update-giving-way", "Lock free: giving way for up to ")
	evUpdateNoReadJob = events.New("update-no-read-job", "Rolling updates: the workload identity may not read job ")
	evUpdateKeepServe = events.New("update-keep-serving", "Stopped for a rolling update: keeping the workload running for up to ")
	evUpdateSuccWait  = events.New("update-successor-waiting", "Rolling update: allocation ")
	evUpdateSuccGone  = events.New("update-successor-gone", "Rolling update: no newer version on its way any more after ")
	evUpdateSuccLate  = events.New("update-successor-late", "Rolling update: no newer version waits for the lock after ")
)

// A step-down (lock step-down, hook_stepdown.go).
var (
	evStandbyUnlisted = events.New("standby-unlisted", "Waiting unlisted: lock step-down cannot see or name this standby: ")
	evStepDownGiveWay = events.New("step-down-giving-way", "Lock free after a step-down: giving way for up to ")
	evStepDownAsked   = events.New("step-down-requested", "Step-down requested (lock step-down")
	evSteppedDown     = events.New("stepped-down", "Stepped down: ")
)

// The load balancer.
var (
	evLBHealthy         = events.New("lb-healthy", "Health check passed on ")
	evLBRegistered      = events.New("lb-registered", "Registered ")
	evLBReadded         = events.New("lb-readded", "Re-registered ")
	evLBUnanswered      = events.New("lb-unanswered", "Holding the lock; not yet in the load balancer: ")
	evLBReaddUnanswered = events.New("lb-readd-unanswered", "Our upstream vanished from the load balancer, and the re-add: ")
	evLBRecheckFailed   = events.New("lb-recheck-failed", "Registered, but the load balancer's state cannot be read (")
	evLBAddFailed       = events.New("lb-add-failed", "LB add failed: ")
	evLBRemoved         = events.New("lb-removed", "Removed ")
	evLBRemoveFailed    = events.New("lb-remove-failed", "LB remove failed: ")
	evLBRemoveSkipped   = events.New("lb-remove-skipped", "LB remove skipped: no time is left before the workload must be gone; ")
)

// A run that starts on lock (AllocWatch).
var evWatchNotStarted = events.New("on-lock-not-started", "Not waiting for the lock, as the allocation cannot be watched: ")

func watchNotStartedMessage(err error) string { return evWatchNotStarted.Text("%v", err) }

// A gate.
var (
	evGateNotStarted    = events.New("gate-not-started", "Gate not started: ")
	evGateAdoptFailed   = events.New("gate-adopt-failed", "Lock lost: the restarted gate could not take over its lease (")
	evGateAcquired      = events.New("gate-acquired", "Acquired lock (fence ")
	evGateTookOver      = events.New("gate-took-over", "Took over lock (fence ")
	evGateStopping      = events.New("gate-stopping", "Stopping gate")
	evGateKillsItself   = events.New("gate-kills-itself", "Gate kills and proves dead itself, whenever it stops other than by Nomad's stop of the allocation: ")
	evGateLeavesToNomad = events.New("gate-leaves-to-nomad", "Gate leaves to Nomad (")
	evGateKilled        = events.New("gate-killed", "Gate killed ")
	evGateKillUnproven  = events.New("gate-kill-unproven", "Gate could not prove ")
	evGateLost          = events.New("gate-lost", "Gate lost the lock: it fails now")
	evGateIdentity      = events.New("gate-identity-rejected", "Gate's workload identity no longer authenticates ")
	evGateLockKept      = events.New("gate-lock-kept", "Lock kept: ")
	evGateKeptRestart   = events.New("gate-kept-for-restart", "Lock kept for the restarted gate: ")
	evGateAwaitPrevious = events.New("gate-await-previous", "Holding lock ")
)

// LostReason is why a lease was lost, as its *lockclient.LostError says.
func LostReason(err error) string {
	var le *lockclient.LostError
	switch {
	case errors.As(err, &le):
		return le.Reason
	case err != nil:
		return err.Error()
	}
	return "no reason given"
}

func waitingHeldMessage(path string, holder lockclient.Holder) string {
	return evWaitingHeld.Text("%s held by %s", path, holder)
}

func stoppedWhileWaitingMessage() string { return evStoppedWaiting.Text("") }

// lockDeniedMessage is the event of a lock denied by ACLs (HTTP 403) that
// the supervisor waits for (WaitForPolicy): the fix, with the path and the
// job filled in.
func lockDeniedMessage(pe *lockclient.PermissionError) string {
	return evLockDenied.Text("%s; retrying every %s to %s until it is applied, no restart needed",
		pe.Fix(), deniedRetryMin, deniedRetryMax)
}

func acquiredMessage(fence uint64) string { return evAcquired.Text("%d)", fence) }

// acquiredSlotMessage is the holding event of a semaphore's slot.
func acquiredSlotMessage(slot, holders int, path string, fence uint64) string {
	return evAcquiredSlot.Text("%d of %d (%s, fence %d)", slot, holders, path, fence)
}

// lockLostMessage is the event of a loss; err is the lease's (Lease.Err).
func lockLostMessage(err error) string { return evLockLost.Text("%s", LostReason(err)) }

func stoppingMessage(signal string) string { return evStopping.Text("%s", signal) }

func killAfterLossMessage(after, timeout time.Duration, lost error) string {
	return evKillAfterLoss.Text("%s of its kill_timeout (%s): the lock was lost (%s), and the workload must be gone before Nomad can free the lock",
		after, timeout, LostReason(lost))
}

// lostWhileStoppingMessage: cut says whether the loss cuts the stop's
// grace (to left, instead of wasLeft); renewing that the lease is being
// renewed again.
func lostWhileStoppingMessage(lost error, cut bool, left, wasLeft time.Duration, renewing bool) string {
	msg := evLostWhileStop.Text("%s): it now has %s left before SIGKILL, not the %s left of its kill_timeout", LostReason(lost), left, wasLeft)
	if !cut {
		msg = evLostWhileStop.Text("%s): its kill_timeout ends before the lock's stop deadline, so its grace is not cut", LostReason(lost))
	}
	if renewing {
		msg += "; renewing it again, as Nomad did not say it is no longer ours"
	}
	return msg
}

func renewedAgainMessage(timeout, left time.Duration) string {
	return evRenewedAgain.Text("%s, %s left)", timeout, left)
}

func releasedMessage() string { return evReleased.Text("") }

// LeftToExpireMessage is the event of a lock left to expire (see
// lockclient.ErrLeftToExpire): not released, and why.
func LeftToExpireMessage(err error) string {
	return evLeftToExpire.Text("%s", strings.TrimPrefix(err.Error(), "release "))
}

// releaseFailedMessage says that the lock was not released, when it will be
// free, and, when the token no longer authenticates, the likely cause and
// who may still release it.
func releaseFailedMessage(err error, cfg lockclient.Config, pluginReleases bool) string {
	expiry := 2*cfg.Timing.TTL + cfg.Timing.LockDelay
	var pe *lockclient.PermissionError
	switch {
	case errors.Is(err, lockclient.ErrIdentityRejected) && pluginReleases:
		return evNotReleasedTask.Text("%v): its workload identity no longer authenticates "+
			"(`nomad job stop -purge` removes the allocation, and its identity with it). The plugin releases it with "+
			"its release_token_file if it is set; otherwise the lock expires on the server within 2×TTL + delay (%s)", err, expiry)
	case errors.Is(err, lockclient.ErrIdentityRejected) || errors.As(err, &pe):
		return evNotReleased.Text("%v); it expires on the server within 2×TTL + delay (%s). "+
			"The task's workload identity no longer authenticates: `nomad job stop -purge` removes the allocation, "+
			"and its identity with it, before the task can release; stop the job first and purge it once its tasks are dead", err, expiry)
	}
	return evNotReleased.Text("%v); it expires on the server within 2×TTL + delay (%s)", err, expiry)
}

// The task events an operator reads when the load balancer fails. Each
// names what happened (the state and the LB's own message, or the call
// that got no answer, with the LB's URL but never its auth key) and what to
// do: the load_balancer field to check, or that the LB API is down and
// Nomad will restart the task.

// restartNote ends the message of a failure that stops the workload.
const restartNote = "Nomad will restart the task per its restart policy"

func lbHealthyMessage(address string) string { return evLBHealthy.Text("%s", address) }

func lbRegisteredMessage(upstream, service string) string {
	return evLBRegistered.Text("%s with load balancer service %s", upstream, service)
}

func lbReaddedMessage(upstream, service string, readd int) string {
	return evLBReadded.Text("%s with load balancer service %s (it had vanished; re-add %d)", upstream, service, readd)
}

// lbUnansweredMessage is the notice for calls of an ADD (or a re-add, when
// registered) that get no usable answer: sent at the first one, then at
// the client's bounded rate.
func lbUnansweredMessage(u lbhook.Unanswered, registered bool, cfg lbhook.Config) string {
	d := lbhook.Diagnose(u.Err, cfg)
	calls := "1 call"
	if u.Calls > 1 {
		calls = fmt.Sprintf("%d calls in %s", u.Calls, time.Since(u.Since).Round(time.Second))
	}
	if registered {
		return evLBReaddUnanswered.Text("%s (%s); %s", d.Cause, calls, d.Fix)
	}
	return evLBUnanswered.Text("%s (%s); %s; retrying until load_balancer.add_deadline (%s), then the task stops and %s",
		d.Cause, calls, d.Fix, cfg.AddDeadline, restartNote)
}

// lbRecheckFailedMessage is the notice for re-checks of a registered
// holder that fail: the first, then at most every 30 s while they go on.
func lbRecheckFailedMessage(err error, fails int, cfg lbhook.Config, every time.Duration) string {
	d := lbhook.Diagnose(err, cfg)
	return evLBRecheckFailed.Text("%d re-checks in a row failed): %s; %s; "+
		"the workload keeps running, and whether our upstream is still there is checked again every load_balancer.recheck_interval (%s)",
		fails, d.Cause, d.Fix, max(every, time.Second))
}

// lbStartFailedMessage is the event of an LB session that could not
// start (a bad setting): the workload is stopped.
func lbStartFailedMessage(err error) string { return evLBAddFailed.Text("%v", err) }

// lbAddFailedMessage is the event of an ADD that ended without SUCCESS:
// the workload is stopped (exit 74).
func lbAddFailedMessage(err error, cfg lbhook.Config) string {
	d := lbhook.Diagnose(err, cfg)
	if d.Unreachable {
		return evLBAddFailed.Text("%s, until load_balancer.add_deadline (%s) passed: the LB API at %s is down or failing; %s; %s",
			d.Cause, cfg.AddDeadline, redactURI(cfg.URI), d.Fix, restartNote)
	}
	return evLBAddFailed.Text("%s; %s; %s", d.String(), stopNote(err), restartNote)
}

// stopNote says what became of the workload after a refused ADD.
func stopNote(err error) string {
	var oe *lbhook.OutcomeError
	if errors.As(err, &oe) {
		return "the workload was never routed and is stopped"
	}
	return "the workload is stopped"
}

// lbRemovedMessage is the event of a REMOVE that succeeded; resp, when
// the request itself did not end in SUCCESS, says why it counts.
func lbRemovedMessage(upstream, service string, resp lbhook.BaragonResponse) string {
	msg := evLBRemoved.Text("%s from load balancer service %s", upstream, service)
	if lbhook.RemovedAnyway(resp) {
		msg += fmt.Sprintf(" (request %s ended %s, but the LB's state shows the upstream gone: the removal was applied)",
			resp.LoadBalancerRequestID, resp.LoadBalancerState)
	}
	return msg
}

// lbRemoveFailedMessage is the event of a REMOVE that did not succeed
// within its budget: the workload is stopped anyway.
func lbRemoveFailedMessage(err error, cfg lbhook.Config, upstream string) string {
	d := lbhook.Diagnose(err, cfg)
	return evLBRemoveFailed.Text("%s; %s; stopping the workload anyway: %s may stay in load balancer service %s "+
		"until the next holder's ADD replaces it, or until it is removed by hand", d.Cause, d.Fix, upstream, cfg.ServiceID)
}

func lbRemoveSkippedMessage(upstream, service string) string {
	return evLBRemoveSkipped.Text("%s may stay in load balancer service %s until the next holder's ADD replaces it, "+
		"or until it is removed by hand", upstream, service)
}

// redactURI is uri without userinfo.
func redactURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	return u.Redacted()
}

// gateFailNote ends the message of an LB failure that fails the gate.
const gateFailNote = "the gate fails now, so Nomad kills the gated tasks, and the lock expires on the server " +
	"(a gate is never restarted: see its restart block)"

// gateLBStartFailedMessage is lbStartFailedMessage for a gate.
func gateLBStartFailedMessage(err error) string {
	return evLBAddFailed.Text("%v; %s", err, gateFailNote)
}

// gateLBAddFailedMessage is the event of a gate's ADD that ended without
// SUCCESS: the gate fails (exit 74).
func gateLBAddFailedMessage(err error, cfg lbhook.Config) string {
	d := lbhook.Diagnose(err, cfg)
	if d.Unreachable {
		return evLBAddFailed.Text("%s, until load_balancer.add_deadline (%s) passed: the LB API at %s is down or failing; %s; %s",
			d.Cause, cfg.AddDeadline, redactURI(cfg.URI), d.Fix, gateFailNote)
	}
	return evLBAddFailed.Text("%s; %s", d.String(), gateFailNote)
}

func gateNotStartedMessage(err error) string { return evGateNotStarted.Text("%v", err) }

func gateAdoptFailedMessage(err error) string {
	return evGateAdoptFailed.Text("%v): it fails, and Nomad kills the gated tasks", err)
}

// gateAcquiredMessage: slot is gateSlotNote's words for a semaphore's
// slot ("" for a single lock).
func gateAcquiredMessage(fence uint64, slot string) string {
	return evGateAcquired.Text("%d)%s: the group's other tasks may start", fence, slot)
}

func gateTookOverMessage(fence uint64, slot string) string {
	return evGateTookOver.Text("%d)%s from the gate's previous run: the group's other tasks keep running", fence, slot)
}

// gateSlotNote names the semaphore slot a gate's lease holds, for its
// holding event ("" for a single lock).
func gateSlotNote(lease *lockclient.Lease) string {
	if lease.Holders == 0 {
		return ""
	}
	return fmt.Sprintf(" on slot %d of %d (%s)", lease.Slot, lease.Holders, lease.Path())
}

// gateStoppingMessage: onSignal says a signal stops the gate, not Nomad.
func gateStoppingMessage(onSignal bool) string {
	if onSignal {
		return evGateStopping.Text(" on a signal")
	}
	return evGateStopping.Text("")
}

// killerMessage is the task event, at start, that says which gated tasks
// the gate kills and proves dead itself and which it leaves to Nomad,
// with their bound.
func (w *gatedWorkload) killerMessage(t lockclient.Timing) string {
	var parts []string
	driver := func(name string) string {
		for _, t := range w.tasks {
			if t.Name == name {
				return name + " (" + t.Driver + ")"
			}
		}
		return name
	}
	if len(w.direct) > 0 {
		var names []string
		for _, n := range w.direct {
			names = append(names, driver(n))
		}
		parts = append(parts, evGateKillsItself.Text("%s; the lock can pass only once they are dead", strings.Join(names, ", ")))
	}
	if left := w.leftToNomad(); len(left) > 0 {
		var names []string
		for _, n := range left {
			if why := w.whyLeft(n); why != "" {
				names = append(names, strings.TrimSuffix(driver(n), ")")+": "+why+")")
				continue
			}
			names = append(names, driver(n))
		}
		why := "no driver kill for them"
		if w.build == nil {
			why = "no direct kill on this client"
		}
		if w.killerErr != nil {
			why = w.killerErr.Error()
		}
		parts = append(parts, evGateLeavesToNomad.Text("%s): %s; killed once the gate fails, within the group's shutdown_delay + "+
			"kill_timeout + shutdown_delay (at most %s), before the server can expire the lock (ttl + delay %s); the next holder "+
			"waits for Nomad to report them dead", why, strings.Join(names, ", "), w.killBound, t.TTL+t.LockDelay))
	}
	return strings.Join(parts, ". ")
}

func gateKilledMessage(tasks []string, why string) string {
	return evGateKilled.Text("%s itself (%s): proven dead", strings.Join(tasks, ", "), why)
}

func gateKillUnprovenMessage(tasks []string, err error) string {
	return evGateKillUnproven.Text("%s dead (%v): the lock is not released; "+
		"Nomad kills them once the gate has failed, and the next holder waits for Nomad to report them dead", strings.Join(tasks, ", "), err)
}

// gateLostMessage: killed lists the gated tasks the gate killed itself,
// proven dead; leftToNomad those Nomad kills.
func gateLostMessage(killed, leftToNomad []string) string {
	msg := evGateLost.Text("")
	if len(killed) > 0 {
		msg += fmt.Sprintf("; it killed %s itself, proven dead", strings.Join(killed, ", "))
	}
	if len(leftToNomad) > 0 {
		msg += fmt.Sprintf(", and Nomad kills the gated tasks (%s) before the server can expire the lock", strings.Join(leftToNomad, ", "))
	}
	return msg
}

func gateIdentityRejectedMessage(expiry time.Duration) string {
	return evGateIdentity.Text("(`nomad job stop -purge` removes it with the allocation): the plugin releases the lock with its release_token_file "+
		"once Nomad confirms the allocation stopped; without one the lock expires on the server within 2×TTL + delay (%s)", expiry)
}

func gateLockKeptMessage(why string, gated []string, expiry time.Duration) string {
	return evGateLockKept.Text("%s, so the gated tasks (%s) may still run. A restarted gate takes the lease over; "+
		"otherwise Nomad kills them, and the lock expires on the server within 2×TTL + delay (%s)", why, strings.Join(gated, ", "), expiry)
}

// gateKeptForRestartMessage: Nomad stopped the gate while its allocation
// runs on; fence is the time left to the lease's fence deadline.
func gateKeptForRestartMessage(gated []string, fence time.Duration) string {
	return evGateKeptRestart.Text("Nomad stopped the gate while its allocation keeps running (a restart); the gated tasks (%s) "+
		"run on under the lease, which the restarted gate takes over within %s (its fence deadline); past it, the plugin kills "+
		"them and keeps them dead until the gate holds again", strings.Join(gated, ", "), fence.Round(100*time.Millisecond))
}

func gateAwaitPreviousMessage(path string, prev lockclient.Holder, alive []string) string {
	return evGateAwaitPrevious.Text("%s, but the previous holder %s still runs %s as far as Nomad knows (its lock was not released "+
		"clean: released behind its back, expired, or taken over): waiting until Nomad reports them dead for good (a task pending a "+
		"restart counts as running), for as long as the servers are in touch with its client",
		path, prev, strings.Join(alive, ", "))
}

func updateGivingWayMessage(grace time.Duration, allocID string, version uint64) string {
	return evUpdateGivingWay.Text("%s to allocation %s of job version %d (rolling update), then taking it if still free", grace, allocID, version)
}

func updateKeepServingMessage(budget time.Duration, allocID string, version uint64) string {
	return evUpdateKeepServe.Text("%s (kill_timeout less lock.kill_timeout), the lock held, until allocation %s of job version %d waits for the lock", budget, allocID, version)
}

func updateSuccessorWaitingMessage(allocID string, version uint64, after time.Duration) string {
	return evUpdateSuccWait.Text("%s of job version %d waits for the lock (after %s): stopping the workload", allocID, version, after)
}

func updateSuccessorGoneMessage(after time.Duration) string {
	return evUpdateSuccGone.Text("%s: stopping the workload", after)
}

func updateSuccessorLateMessage(budget time.Duration) string {
	return evUpdateSuccLate.Text("%s: stopping the workload; the lock goes to the next allocation that takes it", budget)
}

func updateNoReadJobMessage(jobID, namespace string) string {
	return evUpdateNoReadJob.Text(`%q's allocations, so this standby takes the lock even from a newer version (two handovers per update). `+
		`Add namespace %q { capabilities = ["read-job"] } to the task's policy (examples/acl/singleton-update.policy.hcl; docs/updates.md)`,
		jobID, namespace)
}

func standbyUnlistedMessage(err error) string { return evStandbyUnlisted.Text("%v", err) }

func stepDownGivingWayMessage(h lockclient.Handover, grace time.Duration) string {
	if h.To != "" {
		return evStepDownGiveWay.Text("%s to allocation %s, which lock step-down -to named, then taking it if still free",
			grace.Round(time.Millisecond), shortAlloc(h.To))
	}
	return evStepDownGiveWay.Text("%s: this allocation stepped down, so another standby takes the lock first", grace.Round(time.Millisecond))
}

func stepDownRequestedMessage(r lockclient.StepDownRequest, mode lockclient.StepDownMode) string {
	to := ""
	if r.To != "" {
		to = " -to " + shortAlloc(r.To)
	}
	if mode == lockclient.StepDownRestart {
		return evStepDownAsked.Text("%s): the requester restarts this allocation; the gate releases once its gated tasks are proven dead, "+
			"and its restarted run waits for the lock as a standby", to)
	}
	return evStepDownAsked.Text("%s): stopping the workload (kill_signal, kill_timeout), then waiting for the lock again as a standby", to)
}

func steppedDownMessage(r lockclient.StepDownRequest, mode lockclient.StepDownMode) string {
	next := "another standby takes it"
	if r.To != "" {
		next = fmt.Sprintf("allocation %s takes it (the other standbys give way for %s)", shortAlloc(r.To), r.Wait)
	}
	if mode == lockclient.StepDownRestart {
		return evSteppedDown.Text("the lock is released and %s; Nomad restarts this allocation, whose gate then waits as a standby", next)
	}
	return evSteppedDown.Text("the lock is released and %s; this task waits for it again as a standby (its workload starts again once it holds the lock)", next)
}
