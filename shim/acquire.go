package shim

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// acquire takes the lease. The PreAcquire hooks go first: a refusal ends
// the run with its code; a lease a hook took over (a restarted gate
// adopts the lease its previous run left held) is the run's; otherwise
// the supervisor waits for the lock as they shaped the wait. Terminating
// signals and stop requests abort the wait, and so does a hook (the
// allocation is being stopped). done is true when Run must return code
// without a lease.
func (s *Supervisor) acquire(ctx context.Context, sigs <-chan os.Signal) (lease *lockclient.Lease, code int, done bool) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pre PreAcquireResponse
	defer func() {
		cancel()
		for _, f := range pre.AfterWait {
			f(!done)
		}
	}()
	for _, h := range hooksOf[PreAcquireHook](s) {
		if err := h.PreAcquire(actx, &pre); err != nil {
			return nil, failureCode(err), true
		}
		if pre.Lease != nil {
			return pre.Lease, 0, false
		}
	}
	type result struct {
		lease *lockclient.Lease
		err   error
	}
	results := make(chan result, 1)
	s.Emit(Event{State: StateWaiting}) // no message: "held by ..." follows if it is held
	opts := lockclient.AcquireOptions{
		Wait:    s.Config.Wait,
		TryOnce: s.Config.EarlyReturn,
		OnBlocked: func(h lockclient.Holder) {
			s.Emit(Event{State: StateWaiting, Holder: h,
				Message: waitingHeldMessage(s.Config.Path, h)})
		},
	}
	opts.Items, opts.Defer = pre.Items, pre.Defer
	go func() {
		l, err := s.acquireWaitingForPolicy(actx, opts)
		results <- result{l, err}
	}()

	var interrupted os.Signal
	stopping := anyClosed(actx, pre.AbortWait...)
	for {
		select {
		case <-stopping:
			s.Logger.Info("the allocation is being stopped, no longer waiting for the lock")
			s.Emit(Event{State: StateWaiting, Message: stoppedWhileWaitingMessage()})
			interrupted, stopping = syscall.SIGTERM, nil
			cancel()
		case r := <-results:
			switch {
			case r.err == nil && interrupted != nil:
				s.release(r.lease)
				return nil, signalCode(interrupted), true
			case r.err == nil:
				return r.lease, 0, false
			case interrupted != nil:
				return nil, signalCode(interrupted), true
			}
			return nil, s.acquireErrorCode(r.err), true
		case req := <-s.Stop:
			s.Logger.Info("stop requested while waiting for the lock, giving up")
			interrupted = req.Signal
			cancel()
		case sig := <-sigs:
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
				s.Logger.Info("signal while waiting for the lock, giving up", "signal", sig)
				interrupted = sig
				cancel()
			default:
				s.Logger.Debug("signal while waiting for the lock, no workload to forward it to", "signal", sig)
			}
		}
	}
}

// Bounds of the backoff between acquire attempts while the lock is denied
// (WaitForPolicy).
const (
	deniedRetryMin = 2 * time.Second
	deniedRetryMax = 30 * time.Second
)

// acquireWaitingForPolicy is Locker.Acquire; with WaitForPolicy, an HTTP 403
// is a wait: an event names the policy to apply (again whenever the reason
// changes), and the acquire is retried with backoff until it is applied or
// ctx ends.
func (s *Supervisor) acquireWaitingForPolicy(ctx context.Context, opts lockclient.AcquireOptions) (*lockclient.Lease, error) {
	wait, said := deniedRetryMin, ""
	for {
		l, err := s.Locker.Acquire(ctx, opts)
		var pe *lockclient.PermissionError
		if err == nil || !s.Config.WaitForPolicy || !errors.As(err, &pe) || ctx.Err() != nil {
			return l, err
		}
		if msg := lockDeniedMessage(pe); msg != said {
			s.Logger.Error(pe.Error())
			s.Emit(Event{State: StateWaiting, Message: msg})
			said = msg
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, deniedRetryMax)
	}
}

func (s *Supervisor) acquireErrorCode(err error) int {
	var ce *lockclient.ConfigError
	var pe *lockclient.PermissionError
	switch {
	case errors.Is(err, lockclient.ErrNotAcquired):
		s.Logger.Info("lock not acquired and -early-return is set: exiting without running the command", "reason", err)
		return 0
	case errors.Is(err, lockclient.ErrWaitTimeout):
		s.Logger.Error("lock not acquired in time", "error", err)
		return ExitWaitTimeout
	case errors.As(err, &pe):
		s.Logger.Error(pe.Error())
		return ExitPermission
	case errors.As(err, &ce):
		s.Logger.Error("invalid lock configuration", "error", err)
		return ExitConfig
	}
	s.Logger.Error("cannot acquire the lock", "error", err)
	return ExitInfra
}

// failureCode is the exit code of a run a hook refused (a *Failure).
func failureCode(err error) int {
	var f *Failure
	if errors.As(err, &f) {
		return f.Code
	}
	return ExitInfra
}
