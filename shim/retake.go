package shim

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// retaker tries to take back a lease lost during a graceful stop, so that a
// workload still flushing keeps its whole kill_timeout.
//
// A lease is lost when no renew succeeds before its fence deadline. On a
// loaded machine that happens to a lock that is still ours: the renews were
// sent, but their answers came after our own request deadline. The lock
// stays ours on the server until 2×TTL after the last renew it received.
// One renew under our lock ID (Locker.Adopt) tells: Nomad answers it only
// while the lock is held under that ID and its TTL timer has not fired, and
// it restarts the timer from the moment the renew arrives, after we sent
// it. No other holder can have taken the lock in between, so the retaken
// lease's deadlines, measured from that send, are as safe as any renew's.
// A lease that Nomad said is no longer ours (409, 404) is never tried.
type retaker struct {
	s *Supervisor
	// retaken receives the lease taken back, at most one per start.
	retaken chan *lockclient.Lease
	cancel  context.CancelFunc
	done    chan struct{}
}

func newRetaker(s *Supervisor) *retaker {
	return &retaker{s: s, retaken: make(chan *lockclient.Lease, 1)}
}

// start tries to renew lost under its lock ID until its stop deadline, and
// reports whether it tries: not when Nomad said the lock is no longer ours
// (the stop deadline is then the fence deadline), nor when no time is left.
func (rt *retaker) start(lost *lockclient.Lease) bool {
	rt.stopTrying()
	stopBy := lost.StopDeadline()
	if !stopBy.After(lost.FenceDeadline()) || lockclient.BootUntil(stopBy) <= 0 {
		return false
	}
	ctx, cancel := lockclient.WithBootDeadline(context.Background(), stopBy)
	rt.cancel, rt.done = cancel, make(chan struct{})
	pause := min(time.Second, rt.s.Locker.Config().RequestTimeout)
	go func() {
		defer close(rt.done)
		for ctx.Err() == nil {
			l, err := lost.Retake(ctx)
			switch {
			case err == nil:
				rt.retaken <- l
				return
			case errors.Is(err, lockclient.ErrLost):
				rt.s.Logger.Warn("the lock lost during the stop is no longer ours", "error", err)
				return
			}
			rt.s.Logger.Warn("renewing the lock lost during the stop failed; trying again", "error", err)
			_ = ctxsleep.Sleep(ctx, pause)
		}
	}()
	return true
}

// stop ends the tries, and returns a lease taken back that was not yet
// received from retaken (nil if none): it is ours, and must be released.
func (rt *retaker) stop() *lockclient.Lease {
	rt.stopTrying()
	select {
	case l := <-rt.retaken:
		return l
	default:
		return nil
	}
}

func (rt *retaker) stopTrying() {
	if rt.cancel != nil {
		rt.cancel()
		<-rt.done
		rt.cancel = nil
	}
}
