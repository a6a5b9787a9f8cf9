package shim

import (
	"context"
	"maps"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// A run's optional behaviour is attached to its one life cycle as hooks,
// after Nomad's task-runner hooks (client/allocrunner/interfaces): a hook
// implements the phases it takes part in, each an interface of its own,
// and the core calls, at each phase, every hook that implements it, in the
// order Attach gave them. A hook answers through its request and response;
// it never reaches back into the core, which knows no hook by name. The
// phases, in order:
//
//	PreAcquire  before the lock is taken: refuse the run, take a lease over,
//	            shape the acquire, end the wait            [Nomad: Prestart]
//	Held        the lease is ours, the workload not started yet
//	Holding     while held: events, a drain, a failure     [Poststart]
//	Stopping    a stop request or a terminating signal arrived
//	PreKill     right before the workload is signalled, or on a drain [PreKilling]
//	Release     the workload is proven dead or not: may the lock go, and how
//	            it went                                    [Exited, Stop]

// Hook is any hook.
type Hook interface {
	// Name names the hook in logs.
	Name() string
}

// Emitter publishes a hook's events as the run's (Supervisor.Observe).
// The Supervisor is one.
type Emitter interface {
	// Emit publishes a change of state or message.
	Emit(ev Event)
	// Notice publishes a notice (Event.Notice): no change of state.
	Notice(ev Event)
}

// PreAcquireHook runs before the lock is taken. An error refuses the run:
// a *Failure carries its exit code, and the hook has said why in an event.
type PreAcquireHook interface {
	Hook
	PreAcquire(ctx context.Context, resp *PreAcquireResponse) error
}

// PreAcquireResponse shapes the acquire. ctx, in PreAcquire, ends with
// the wait for the lock.
type PreAcquireResponse struct {
	// Lease, if set, is a lease the hook took over (a restarted gate
	// adopts its previous run's): the run holds it without an acquire.
	Lease *lockclient.Lease
	// Items are written into the holder's record (lockclient's
	// AcquireOptions.Items).
	Items map[string]string
	// Defer is the acquire's (lockclient.AcquireOptions.Defer): give way
	// while the lock looks free. Set it with AddDefer, so that every
	// hook's deferral counts.
	Defer DeferFunc
	// AbortWait: the wait for the lock ends once any of them closes (the
	// allocation is being stopped).
	AbortWait []<-chan struct{}
	// AfterWait run, in order, once the wait for the lock ends, whether it
	// acquired or not, before the run goes on (a standby's record is
	// withdrawn): one that did not acquire ends the run.
	AfterWait []func(acquired bool)
}

// DeferFunc is a hook's deferral of the acquire (lockclient's
// AcquireOptions.Defer): previous is the holder record as read.
type DeferFunc func(ctx context.Context, previous lockclient.Holder) (grace time.Duration, hold bool)

// AddDefer adds f to the acquire's deferral: the acquire holds while any
// hook holds, and otherwise gives way for the longest grace any asks.
func (r *PreAcquireResponse) AddDefer(f DeferFunc) {
	prev := r.Defer
	if prev == nil {
		r.Defer = f
		return
	}
	r.Defer = func(ctx context.Context, previous lockclient.Holder) (time.Duration, bool) {
		g1, h1 := prev(ctx, previous)
		if h1 {
			return 0, true
		}
		g2, h2 := f(ctx, previous)
		if h2 {
			return 0, true
		}
		return max(g1, g2), false
	}
}

// AddItems adds items to those written into the holder's record.
func (r *PreAcquireResponse) AddItems(items map[string]string) {
	if r.Items == nil {
		r.Items = map[string]string{}
	}
	maps.Copy(r.Items, items)
}

// HeldHook runs once the lease is held, before the workload starts. An
// error means the lease was lost meanwhile.
type HeldHook interface {
	Hook
	Held(ctx context.Context, lease *lockclient.Lease) error
}

// HoldingHook runs while the lease is held, from the workload's start:
// the events on the channel it returns are the hold's (a change of state,
// a notice, a drain, a failure that ends the run); an error (a *Failure)
// ends the run at once. ctx ends with the hold. [Nomad: Poststart]
type HoldingHook interface {
	Hook
	Holding(ctx context.Context, lease *lockclient.Lease) (<-chan HookEvent, error)
}

// HookEvent is what a hook tells the hold: an event to publish (State ""
// keeps the current state; Notice publishes it as a notice), a drain (the
// PreKill hooks run now, while the hold goes on: a gate whose allocation
// is being stopped, before Nomad kills its gated tasks), a failure that
// stops the workload and ends the run with its code, or a step-down: the
// workload is stopped as a stop request would stop it (the PreKill hooks,
// kill_signal, kill_timeout, the proof of death), the lock released, and
// the run waits for the lock again (EndStepDown). Message, if set, is
// published first.
type HookEvent struct {
	State    State
	Message  string
	Notice   bool
	Drain    bool
	Fail     *Failure
	StepDown bool
}

// StoppingHook learns, at once, that a stop request, a terminating signal
// or a step-down arrived: what was true then may decide the release. ctx
// ends with the hold.
type StoppingHook interface {
	Hook
	Stopping(ctx context.Context, req StoppingRequest, resp *StoppingResponse)
}

// StoppingRequest is a stop: why, how long a hook may hold it back
// (Budget: the stop request's kill_timeout less the workload's own grace,
// lock.kill_timeout; 0 for a signal, or no time to spare), and the lease.
type StoppingRequest struct {
	End    Ending
	Budget time.Duration
	Lease  *lockclient.Lease
}

// StoppingResponse is what a Stopping hook makes of the stop.
type StoppingResponse struct {
	// Delay holds a stop request back: the stop goes on once the channel
	// closes; each string sent on it first is a notice. The first hook's
	// delay counts.
	Delay <-chan string
	// StepDown makes a stop request a step-down (EndStepDown) for the
	// hooks after this one, the stop and the release: Nomad stops the task
	// to step it down (a gate's allocation is restarted). The run still
	// ends once the workload is stopped.
	StepDown bool
}

// PreKillHook runs right before the workload is signalled, on every
// ending, or earlier on a drain: it must be idempotent, as Nomad's stop
// hooks are. PreKillBound is the longest PreKill takes for req, so that
// the workload's guard does not fire first. [Nomad: PreKilling]
type PreKillHook interface {
	Hook
	PreKillBound(req PreKillRequest) time.Duration
	PreKill(ctx context.Context, req PreKillRequest, resp *PreKillResponse)
}

// PreKillRequest is the lease the PreKill runs under, and the time the
// workload's kill needs before the lease's stop deadline
// (Workload.KillBound), which a PreKill after a loss must leave it.
type PreKillRequest struct {
	Lease     *lockclient.Lease
	KillBound time.Duration
}

// PreKillResponse is the events a PreKill publishes, once it is over.
type PreKillResponse struct {
	Events []HookEvent
}

// ReleaseHook decides, once the workload is proven dead or not
// (req.Proven), whether the lock may go and be marked clean, and whether
// the run must fail (Release); and learns how the release went (Released:
// nil when released or nothing was left to release, the error otherwise,
// or the Why of a hook that kept the lock for someone else to release).
// [Nomad: Exited, Stop]
type ReleaseHook interface {
	Hook
	Release(ctx context.Context, req ReleaseRequest, resp *ReleaseResponse)
	Released(err error)
}

// ReleaseRequest is the run's end: its lease, why it ended, and whether
// the workload is proven dead.
type ReleaseRequest struct {
	Lease  *lockclient.Lease
	End    Ending
	Proven bool
}

// ReleaseResponse is what the hooks decided.
type ReleaseResponse struct {
	// Keep keeps the lock: it then expires on the server (unproven dead,
	// or a hook's rule); Why, if set, says why someone else may release
	// it (lockclient.ErrIdentityRejected: the plugin, with its own token).
	Keep bool
	Why  error
	// MarkClean asks for the clean mark (the next holder need not wait for
	// our work); NotClean forbids it.
	MarkClean, NotClean bool
	// Fail makes the run exit non-zero even if its workload exited 0.
	Fail bool
	// Items are written into the holder's record with the clean mark,
	// just before the release (lockclient's Lease.MarkReleasing): a
	// step-down's handover.
	Items map[string]string
}
