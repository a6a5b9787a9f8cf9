package shim

import (
	"os"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Workload is what a run holds the lock for. The core starts it once the
// lease is held, stops it on every ending, and releases the lock only once
// KillAll has proven it dead. Two kinds exist: a process tree of the
// supervisor's own (processWorkload: the command, its process-group guard,
// the subreaper's or the task cgroup's view of its descendants), and a
// gate's gated tasks, which Nomad runs and the gate kills itself (Gate); a
// gate with a command runs both (pairWorkload).
type Workload interface {
	// Start starts the workload under lease. An error that wraps
	// errLostBeforeStart means the lease was lost first; a *Failure ends
	// the run with its code; the lease is released as the hooks allow.
	Start(lease *lockclient.Lease) (Started, error)
	// Exited is closed once the workload's main process has exited: never
	// for one whose processes Nomad runs.
	Exited() <-chan struct{}
	// ExitCode is the main process's exit code once Exited is closed (0
	// for a workload without one).
	ExitCode() int
	// Forward passes a signal the supervisor received on to the workload.
	Forward(sig os.Signal)
	// Stop begins a graceful stop for end: sig to every process of the
	// workload. event is the stop's task event ("" for none); wait is
	// false when there is nothing to wait for (Gone).
	Stop(sig syscall.Signal, end Ending) (event string, wait bool)
	// Gone reports whether no process of the workload is left.
	Gone() bool
	// Arm tells whatever kills the workload without the supervisor (the
	// process-group guard) to do so at deadline, unless armed again: the
	// supervisor may be frozen by then.
	Arm(deadline time.Time)
	// KillBound is the time the workload's kill needs before the lease's
	// stop deadline, which nothing run before the kill (an LB REMOVE) may
	// take: 0 when its kill is cut to that deadline anyway.
	KillBound() time.Duration
	// KillAll SIGKILLs whatever is left of the workload and reports
	// whether every process of it is proven dead.
	KillAll() (proven bool)
}

// Started is a workload that started: its main process and group (0 for
// none), which the plugin's watchdog reads, and the holding event's text
// ("" for the lock's own).
type Started struct {
	PID, PGID int
	Event     string
}

// Failure ends a run with an exit code: a workload that cannot start, a
// hook that refuses the run or fails it. The hook or workload words its
// own events; Err is for the log.
type Failure struct {
	Code int
	// End is why the run ends, as the release decisions see it.
	End Ending
	Err error
	// Event, if set, is the task event that says so, which the core
	// publishes as it stops the workload.
	Event string
}

func (f *Failure) Error() string { return f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// Ending is why a hold ends.
type Ending string

const (
	EndExited      Ending = "workload exited" // the workload exited by itself
	EndStopRequest Ending = "stop request"    // Nomad stopped the task (StopTask)
	EndSignal      Ending = "signal"          // SIGTERM or SIGINT to the supervisor
	EndLost        Ending = "lock lost"       // the lease was lost
	EndStartFailed Ending = "start failed"    // the workload could not start
	EndStepDown    Ending = "step-down"       // a hook stepped the run down: it waits for the lock again
)

func (e Ending) String() string { return string(e) }

// pairWorkload is a gate with a command: its process and its gated tasks.
// The process is the one the core starts, signals and waits for; the gated
// tasks add the time their kill needs.
type pairWorkload struct {
	*processWorkload
	gated Workload
}

func (p pairWorkload) KillBound() time.Duration {
	return max(p.processWorkload.KillBound(), p.gated.KillBound())
}
