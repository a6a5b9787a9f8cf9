package driver

import (
	"fmt"
	"strings"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Every task event the plugin words itself (the supervisor's own come from
// shim/events.go and are passed on as they are): the one place a message
// is worded. Each kind is declared with a stable identifier and the fixed
// text its messages begin with (internal/events), which
// docs/troubleshooting.md lists with what it means and what to do.
var (
	evGateWaiting       = events.New("gate-waiting", "Gate waiting for lock ")
	evOnLockWaiting     = events.New("on-lock-waiting", "Pending until lock ")
	evSupersededStart   = events.New("superseded-start", "Ended an earlier start of this task ")
	evNoCgroup          = events.New("no-cgroup", "No task cgroup on this client (cgroups are disabled): ")
	evWatchdog          = events.New("watchdog", "Lock lost: watchdog killed the workload: ")
	evWatchdogGate      = events.New("watchdog-gate", "Lock lost: watchdog killed the gate and ")
	evCrashReleased     = events.New("crash-released", "Released lock on behalf of ")
	evCrashNotReleased  = events.New("crash-not-released", "Lock not released on behalf of ")
	evCrashLeftToExpire = events.New("crash-left-to-expire", "Lock of ")
	evCrashGateLockKept = events.New("crash-gate-lock-kept", "Lock kept after the gate's ")
	evCrashLBRemoved    = events.New("crash-lb-removed", "Removed ")
	evCrashLBRemoveFail = events.New("crash-lb-remove-failed", "LB remove after supervisor crash failed: ")
	evCrashLBRemoveSkip = events.New("crash-lb-remove-skipped", "LB remove after the gate's crash skipped: ")
	evOOMKilled         = events.New("oom-killed", "OOM Killed: ")
	evLeaseMode         = events.New("lease-mode", "Lease mode: ")
	evLeaseTakeover     = events.New("lease-takeover", "Took the lock over from a holder whose heartbeat stopped: ")
	evLeaseNoTakeover   = events.New("lease-no-takeover", "Lease takeover not made: ")
	evLeaseStandbyOff   = events.New("lease-standby-off", "Lease standby not running: ")
	evWardenKilled      = events.New("warden-killed", "Gate's warden killed ")
	evWardenKillFailed  = events.New("warden-kill-failed", "Gate's warden could not kill ")
	evGateNotRestarted  = events.New("gate-not-restarted", "Gate not restarted: ")
)

// wardenKilledMessage: the warden found gated tasks running while their
// gate did not hold, and killed them; graceful when they had their
// kill_signal first (a kept lease that ran out).
func wardenKilledMessage(tasks []string, graceful bool) string {
	how := "SIGKILL"
	if graceful {
		how = "their kill_signal, then SIGKILL"
	}
	return evWardenKilled.Text("%s (%s): they ran while the gate did not hold the lock, and a gated task may run only while it does; "+
		"the warden kills them until the gate holds again or Nomad's kill of the allocation has ended them", strings.Join(tasks, ", "), how)
}

func wardenKillFailedMessage(tasks []string, err error) string {
	return evWardenKillFailed.Text("%s (%v): they may run while the gate does not hold the lock; it retries every %s",
		strings.Join(tasks, ", "), err, wardenEvery)
}

// gateNotRestartedMessage: a restarted gate found no lease of its
// previous run left to take over, while its gated tasks may start again.
func gateNotRestartedMessage() string {
	return evGateNotRestarted.Text("the lease of its previous run in this allocation is gone (its fence deadline passed before this run " +
		"started, or the run ended without it), and its gated tasks may run again: this run fails, so that Nomad stops the allocation, " +
		"rather than wait for the lock while they may start beside the next holder; the plugin kills them meanwhile")
}

func gateWaitingMessage(path string) string {
	return evGateWaiting.Text("%s: the group's other tasks start once it is held", path)
}

// onLockWaitingMessage: a start = "on_lock" task waits for the lock
// before Nomad sees it start.
func onLockWaitingMessage(path string) string {
	return evOnLockWaiting.Text("%s is held: the task starts, and Nomad registers its services, then", path)
}

func supersededStartMessage() string {
	return evSupersededStart.Text("that Nomad lost while it waited for the lock (the agent restarted): this start takes its place")
}

func noCgroupMessage() string {
	return evNoCgroup.Text("nothing can prove every process of the task dead, " +
		"so the lock is never released early; after each stop it expires on the server (2×TTL + delay)")
}

// The watchdog's reasons, in its events.
func watchdogUnresponsive(past time.Duration) string {
	return fmt.Sprintf("supervisor unresponsive %s past its fence deadline", past)
}

func watchdogStillRunning(past time.Duration) string {
	return fmt.Sprintf("workload still running %s past its stop deadline", past)
}

func watchdogMessage(why string) string { return evWatchdog.Text("%s", why) }

// watchdogGateMessage: killErr, if not nil, is why the gated tasks are
// not proven dead.
func watchdogGateMessage(killErr error, why string) string {
	if killErr != nil {
		return evWatchdogGate.Text("could not prove its gated tasks dead (%v): %s", killErr, why)
	}
	return evWatchdogGate.Text("its gated tasks: %s", why)
}

// Whose lock the plugin releases after a supervisor exited (the "whose" of
// the crash events).
const (
	whoseCrashed          = "crashed supervisor"
	whoseIdentityRejected = "supervisor, whose task's identity no longer authenticates"
	whoseNotProven        = "supervisor, which could not prove its workload dead"
)

func crashGateLockKeptMessage(whose string, expiry time.Duration) string {
	return evCrashGateLockKept.Text("%s: Nomad kills the gated tasks now that the gate has failed, "+
		"and the lock expires on the server within 2×TTL + delay (%s)", whose, expiry)
}

// crashNotReleasedMessage: expiry, if not zero, is 2×TTL + delay.
func crashNotReleasedMessage(whose string, err error, expiry time.Duration) string {
	if expiry == 0 {
		return evCrashNotReleased.Text("%s (%v); it expires on the server after 2×TTL + delay", whose, err)
	}
	return evCrashNotReleased.Text("%s (%v); it expires on the server after 2×TTL + delay (%s)", whose, err, expiry)
}

func crashReleasedMessage(whose string, fence uint64, via string) string {
	return evCrashReleased.Text("%s (fence %d)%s", whose, fence, via)
}

func crashLeftToExpireMessage(whose string, fence uint64, err error) string {
	return evCrashLeftToExpire.Text("%s not released on its behalf (fence %d): %s", whose, fence, shim.LeftToExpireMessage(err))
}

func crashLBRemoveSkippedMessage(upstream, service string) string {
	return evCrashLBRemoveSkip.Text("its stop deadline has passed, so the lock may be free; "+
		"%s stays in load balancer service %s until the next holder's ADD replaces it", upstream, service)
}

func crashLBRemoveFailedMessage(err error, cfg lbhook.Config, upstream string) string {
	return evCrashLBRemoveFail.Text("%s; %s may stay in load balancer service %s until the next holder's ADD replaces it",
		lbhook.Diagnose(err, cfg.WithDefaults()), upstream, cfg.ServiceID)
}

func crashLBRemovedMessage(upstream string, resp lbhook.BaragonResponse) string {
	msg := evCrashLBRemoved.Text("%s from load balancer on behalf of crashed supervisor", upstream)
	if lbhook.RemovedAnyway(resp) {
		msg += fmt.Sprintf(" (request %s ended %s, but the LB's state shows the upstream gone)", resp.LoadBalancerRequestID, resp.LoadBalancerState)
	}
	return msg
}

// oomKilledMessage is the exit error of a task whose workload the memory
// cgroup OOM-killed (the docker driver says "OOM Killed" too).
func oomKilledMessage() string {
	return evOOMKilled.Text("a workload process went over the task's memory limit; raise resources.memory (or memory_max)")
}

// leaseModeMessage: the lease mode's timings, with the takeover time L.
func leaseModeMessage(hb lockclient.Heartbeat) string {
	return evLeaseMode.Text("heartbeat every %s; the holder fences itself %s after its last acknowledged heartbeat "+
		"and its workload is killed %s later; a standby takes a dead holder's lock over once its heartbeat is unchanged for L = %s",
		hb.Interval, hb.Fence, hb.KillGrace, hb.Takeover())
}

func leaseTakeoverMessage(unchanged time.Duration) string {
	return evLeaseTakeover.Text("unchanged for %s; the heartbeat is sealed and the lock released with the escrowed lock ID, "+
		"so this task takes it now", unchanged)
}

func leaseNoTakeoverMessage(why string) string {
	return evLeaseNoTakeover.Text("%s; the lock comes free when the server expires it (2×TTL + delay after the last renew)", why)
}

func leaseStandbyOffMessage(err error) string {
	return evLeaseStandbyOff.Text("%v; a dead holder's lock comes free only when the server expires it", err)
}
