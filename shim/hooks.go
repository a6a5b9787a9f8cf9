package shim

import (
	"context"
	"fmt"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Optional behaviour is attached to the supervisor's one life cycle
// (check, take the lease, hold it, shut down, release) as hooks, after the
// model of Nomad's task-runner hooks (client/allocrunner/interfaces): a
// hook implements the stages it takes part in, each an interface of its
// own, and the core loop calls, at each stage, every hook that implements
// it, in the order of Supervisor.hooks. The core loop knows no hook by
// name. The gate (gatehook.go) is one; the allocation watch of a run that
// Nomad sees start only once it holds the lock (allocwatch.go) another.

// checkHook runs before the lock is taken: an error refuses the run with
// code, after an event that says why.
type checkHook interface {
	Hook
	check(ctx context.Context) (code int, err error)
}

// leaseHook may take the lease in place of an acquire (a restarted gate
// adopts its previous run's). handled is false when the hook has no lease
// to take; done is true when Run must return code without a lease.
type leaseHook interface {
	Hook
	takeLease(ctx context.Context) (lease *lockclient.Lease, code int, handled, done bool)
}

// acquireHook shapes the acquire (what the holder's record says).
type acquireHook interface {
	Hook
	acquireOptions(opts *lockclient.AcquireOptions)
}

// waitHook ends the wait for the lock when the channel it returns closes
// (ctx ends with the wait).
type waitHook interface {
	Hook
	abortWait(ctx context.Context) <-chan struct{}
}

// acquiredHook runs once the lease is held, before the workload (or the
// gated tasks) may start: false when the lease was lost meanwhile.
type acquiredHook interface {
	Hook
	acquired(lease *lockclient.Lease) bool
}

// stopHook learns, at once, that a stop request or a terminating signal
// arrived: what was true then may decide the release.
type stopHook interface {
	Hook
	stopArrived(end Ending)
}

// delayHook may keep the workload serving for a while after a stop
// request, within budget (the stop's kill_timeout less the workload's own
// grace), the lock held throughout: the stop goes on once the channel it
// returns closes; each string sent on it first is an event to publish.
// nil: the stop goes on at once.
type delayHook interface {
	Hook
	delayStop(ctx context.Context, budget time.Duration) <-chan string
}

// releaseHook runs once the workload (if any) is proven dead, before the
// lease is released: release is false to keep the lock (it then expires on
// the server), clean marks the release clean for the next holder.
type releaseHook interface {
	Hook
	mayRelease(lease *lockclient.Lease, end Ending) (release, clean bool)
}

// exitHook may change the run's exit code once the hold has ended.
type exitHook interface {
	Hook
	exitCode(end Ending, code int) int
}

// hooksOf lists the hooks of s that implement T, in order.
func hooksOf[T Hook](s *Supervisor) []T {
	var out []T
	for _, h := range s.hooks {
		if t, ok := h.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// buildHooks attaches the hooks the config asks for.
func (s *Supervisor) buildHooks() {
	s.hooks = nil
	if s.Gate != nil {
		s.hooks = append(s.hooks, newGateHook(s, s.Gate))
	} else if w := s.WatchAlloc; w != nil {
		s.hooks = append(s.hooks, &allocWatchHook{s: s, w: w})
	}
	if s.Locker != nil {
		if h := newUpdateHook(s); h != nil {
			s.hooks = append(s.hooks, h)
		}
	}
	if lb := s.Config.LB; lb != nil {
		h := &lbHook{cfg: lb, getenv: s.getenv, log: s.Logger,
			startFailed: lbStartFailedMessage, addFailed: lbAddFailedMessage}
		if s.OnLBPosted != nil || s.OnLBRemoved != nil {
			h.rec = lbRecordFuncs{s.OnLBPosted, s.OnLBRemoved}
		}
		if s.Gate != nil {
			// A gate fails on an LB failure: Nomad kills its gated tasks.
			h.startFailed, h.addFailed = gateLBStartFailedMessage, gateLBAddFailedMessage
		}
		holder := s.Locker.Config().Holder
		if h.allocID = holder.AllocID; h.allocID == "" {
			h.allocID = fmt.Sprintf("pid%d", holder.PID)
		}
		s.hooks = append(s.hooks, h)
	}
}

// lbRecordFuncs is an LBRecorder of two funcs, either nil.
type lbRecordFuncs struct {
	posted  func(lbhook.Config, *lbhook.Hook, lbhook.UpstreamInfo)
	removed func()
}

func (f lbRecordFuncs) LBPosted(cfg lbhook.Config, hook *lbhook.Hook, self lbhook.UpstreamInfo) {
	if f.posted != nil {
		f.posted(cfg, hook, self)
	}
}

func (f lbRecordFuncs) LBRemoved() {
	if f.removed != nil {
		f.removed()
	}
}

// anyClosed returns a channel closed once any of chs is (nil for none),
// until ctx ends.
func anyClosed(ctx context.Context, chs ...<-chan struct{}) <-chan struct{} {
	switch len(chs) {
	case 0:
		return nil
	case 1:
		return chs[0]
	}
	out := make(chan struct{})
	var once sync.Once
	for _, c := range chs {
		go func() {
			select {
			case <-c:
				once.Do(func() { close(out) })
			case <-ctx.Done():
			}
		}()
	}
	return out
}
