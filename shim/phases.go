package shim

import (
	"context"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Hook is any hook: a part of the run attached to its life cycle, which
// takes part in the phases whose interfaces it implements.
type Hook interface {
	// Name names the hook in logs.
	Name() string
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
// is being stopped, before Nomad kills its gated tasks), or a failure
// that stops the workload and ends the run with its code.
type HookEvent struct {
	State   State
	Message string
	Notice  bool
	Drain   bool
	Fail    *Failure
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
