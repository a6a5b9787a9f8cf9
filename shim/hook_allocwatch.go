package shim

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
)

// AllocWatch makes a run that Nomad does not yet see started watch its own
// allocation while it waits for the lock, and give up the wait once the
// allocation is being stopped: Nomad cannot stop a task whose StartTask has
// not returned. The driver's `start = "on_lock"` tasks use it; a gate
// watches the same way (gateHook). The reads use the task's workload
// identity, which needs "read-job" on the namespace.
type AllocWatch struct {
	// AllocID and Namespace name the run's own allocation (from Nomad,
	// never from the task environment).
	AllocID, Namespace string
	// Who says, in a permission error, what reads the allocation.
	Who string
}

// readOwnAlloc reads the run's own allocation once, at start. A read that
// fails for want of an answer (the agent restarting) is retried for
// gateCheckWithin. An allocation the servers do not show is one they hide
// from a token without read-job (it runs): a permission error, worded for
// who.
func readOwnAlloc(ctx context.Context, r *allocs.Reader, log hclog.Logger, allocID, namespace, who string) (*api.Allocation, error) {
	var alloc *api.Allocation
	var err error
	for until := time.Now().Add(gateCheckWithin); ; {
		alloc, _, err = r.Allocation(ctx, allocID, namespace, 0)
		var pe *allocs.PermissionError
		if err == nil || errors.Is(err, allocs.ErrGone) || errors.As(err, &pe) || !time.Now().Before(until) {
			break
		}
		log.Warn("cannot read the allocation yet, retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Second):
		}
	}
	if errors.Is(err, allocs.ErrGone) {
		err = r.PermissionError(allocID, namespace, err)
	}
	var pe *allocs.PermissionError
	if errors.As(err, &pe) && who != "" {
		pe.Who = who
	}
	return alloc, err
}

// allocStopping returns a channel closed when the servers want the
// allocation stopped (or it is gone). Reads that fail are retried; an
// identity that the Task API keeps rejecting for gateIdentityGone (a purged
// job) counts as gone.
func allocStopping(ctx context.Context, r *allocs.Reader, log hclog.Logger, allocID, namespace string) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		var index uint64
		var rejectedSince time.Time
		for ctx.Err() == nil {
			alloc, next, err := r.Allocation(ctx, allocID, namespace, index)
			var pe *allocs.PermissionError
			if !errors.Is(err, lockclient.ErrIdentityRejected) {
				rejectedSince = time.Time{}
			} else if rejectedSince.IsZero() {
				rejectedSince = time.Now()
			}
			switch {
			case errors.Is(err, lockclient.ErrIdentityRejected) && time.Since(rejectedSince) >= gateIdentityGone:
				// Not a blip of the servers: the allocation is gone.
				log.Info("the allocation's identity no longer authenticates (a purged job?)", "error", err)
				close(ch)
				return
			case errors.Is(err, allocs.ErrGone), errors.As(err, &pe):
				// The read worked at start: an allocation the servers no
				// longer show, or an identity that no longer reads it
				// (a purged job), is going away.
				log.Info("the allocation is gone, or its identity no longer reads it", "error", err)
				close(ch)
				return
			case err != nil:
				if ctx.Err() == nil {
					log.Debug("read allocation", "error", err)
				}
				index = 0
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			case alloc.DesiredStatus != api.AllocDesiredStatusRun:
				log.Info("the allocation is being stopped", "desired_status", alloc.DesiredStatus)
				close(ch)
				return
			}
			index = next
		}
	}()
	return ch
}

// allocWatchHook attaches an AllocWatch to the run's life cycle: before
// the lock is taken it checks that the identity reads the allocation (so
// that a stop while waiting is noticed), and ends the wait for the lock
// when the allocation is being stopped.
type allocWatchHook struct {
	w      AllocWatch
	allocs *allocs.Reader
	emit   Emitter
	log    hclog.Logger
}

func (h *allocWatchHook) Name() string { return "alloc-watch" }

// PreAcquire refuses to wait for the lock without read-job (the wait could
// not be ended by a stop of the allocation), and ends the wait when the
// allocation is being stopped.
func (h *allocWatchHook) PreAcquire(ctx context.Context, resp *PreAcquireResponse) error {
	if _, err := readOwnAlloc(ctx, h.allocs, h.log, h.w.AllocID, h.w.Namespace, h.w.Who); err != nil {
		h.log.Error("not taking the lock: cannot watch the allocation", "error", err)
		h.emit.Emit(Event{State: StateStopping, Message: watchNotStartedMessage(err)})
		var pe *allocs.PermissionError
		if errors.As(err, &pe) {
			return &Failure{Code: ExitPermission, Err: err}
		}
		return &Failure{Code: ExitInfra, Err: err}
	}
	resp.AbortWait = append(resp.AbortWait, allocStopping(ctx, h.allocs, h.log, h.w.AllocID, h.w.Namespace))
	return nil
}
