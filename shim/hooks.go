package shim

import (
	"context"
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
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

// runHook is any hook.
type runHook interface {
	// hookName names the hook in logs.
	hookName() string
}

// checkHook runs before the lock is taken: an error refuses the run with
// code, after an event that says why.
type checkHook interface {
	runHook
	check(ctx context.Context) (code int, err error)
}

// leaseHook may take the lease in place of an acquire (a restarted gate
// adopts its previous run's). handled is false when the hook has no lease
// to take; done is true when Run must return code without a lease.
type leaseHook interface {
	runHook
	takeLease(ctx context.Context) (lease *lockclient.Lease, code int, handled, done bool)
}

// acquireHook shapes the acquire (what the holder's record says).
type acquireHook interface {
	runHook
	acquireOptions(opts *lockclient.AcquireOptions)
}

// waitHook ends the wait for the lock when the channel it returns closes
// (ctx ends with the wait).
type waitHook interface {
	runHook
	abortWait(ctx context.Context) <-chan struct{}
}

// acquiredHook runs once the lease is held, before the workload (or the
// gated tasks) may start: false when the lease was lost meanwhile.
type acquiredHook interface {
	runHook
	acquired(lease *lockclient.Lease) bool
}

// holdHook takes part in the hold: holdingMessage, when not empty,
// replaces the holding event's message; the channel holding returns, when
// it closes, takes the instance out of the load balancer while the hold
// goes on (ctx ends with the hold).
type holdHook interface {
	runHook
	holdingMessage(lease *lockclient.Lease) string
	holding(ctx context.Context, lease *lockclient.Lease) (deregister <-chan struct{})
}

// stopHook learns, at once, that a stop request or a terminating signal
// arrived: what was true then may decide the release.
type stopHook interface {
	runHook
	stopArrived(end ending)
}

// delayHook may keep the workload serving for a while after a stop
// request, within budget (the stop's kill_timeout less the workload's own
// grace), the lock held throughout: the stop goes on once the channel it
// returns closes; each string sent on it first is an event to publish.
// nil: the stop goes on at once.
type delayHook interface {
	runHook
	delayStop(ctx context.Context, budget time.Duration) <-chan string
}

// releaseHook runs once the workload (if any) is proven dead, before the
// lease is released: release is false to keep the lock (it then expires on
// the server), clean marks the release clean for the next holder.
type releaseHook interface {
	runHook
	mayRelease(lease *lockclient.Lease, end ending) (release, clean bool)
}

// budgetHook caps the time the LB REMOVE may take after a loss.
type budgetHook interface {
	runHook
	capRemoveBudget(lease *lockclient.Lease, budget time.Duration) time.Duration
}

// messageHook words the events of a run that has no workload of its own,
// and of an LB failure that ends it.
type messageHook interface {
	runHook
	// stoppingMessage is the event when a run with no workload stops.
	stoppingMessage(end ending) string
	// lbFailedMessage is the event when the LB ADD failed for good (start
	// says it failed before the hold began).
	lbFailedMessage(err error, cfg lbhook.Config, start bool) string
}

// eventHook sees every event the run emits (metricshook.go), after
// Supervisor.Observe.
type eventHook interface {
	runHook
	observe(ev Event)
}

// lbRequestHook hears of every request the run's LB client ran to its end.
// It must not block.
type lbRequestHook interface {
	runHook
	lbRequest(r lbhook.RequestReport)
}

// exitHook may change the run's exit code once the hold has ended.
type exitHook interface {
	runHook
	exitCode(end ending, code int) int
}

// ending is why a hold ends.
type ending int

const (
	endExited      ending = iota // the workload exited by itself
	endStopRequest               // Nomad stopped the task (StopTask)
	endSignal                    // SIGTERM or SIGINT to the supervisor
	endLost                      // the lease was lost
	endLBFailed                  // the LB ADD failed for good
	endStartFailed               // the workload could not start
)

func (e ending) String() string {
	return [...]string{"workload exited", "stop request", "signal", "lock lost", "LB add failed", "start failed"}[e]
}

// hooksOf lists the hooks of s that implement T, in order.
func hooksOf[T runHook](s *Supervisor) []T {
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
	if s.Metrics != nil {
		s.hooks = append(s.hooks, newMetricsHook(s))
	}
	if s.Config.Gate != nil {
		s.hooks = append(s.hooks, newGateHook(s, s.Config.Gate))
	} else if w := s.Config.WatchAlloc; w != nil {
		s.hooks = append(s.hooks, &allocWatchHook{s: s, w: w})
	}
	if s.Locker != nil {
		if h := newUpdateHook(s); h != nil {
			s.hooks = append(s.hooks, h)
		}
	}
}

// lbRequestObserver is the LB client's OnRequest: each hook that hears of
// LB requests (nil: none).
func (s *Supervisor) lbRequestObserver() func(lbhook.RequestReport) {
	hooks := hooksOf[lbRequestHook](s)
	if len(hooks) == 0 {
		return nil
	}
	return func(r lbhook.RequestReport) {
		for _, h := range hooks {
			h.lbRequest(r)
		}
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
