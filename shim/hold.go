package shim

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// heldRun is the workload running under a held lease: what the hold loop
// and shutdown act on.
type heldRun struct {
	s     *Supervisor
	lease *lockclient.Lease
	w     Workload
	proc  Started // the workload's processes, for the holding events
	log   hclog.Logger
	// failRun: a Release hook asked the run to fail (ReleaseResponse.Fail).
	failRun bool
	// proven: the workload was proven dead as the hold ended (finish).
	proven bool
	// again: the hold ended in a step-down, the workload proven dead: the
	// run waits for the lock again.
	again bool
}

// start starts the workload under the lease, its guard armed, and says
// so. started is false, with the exit code, when it could not start; the
// lease is then released as finish allows.
func (s *Supervisor) start(lease *lockclient.Lease) (r *heldRun, code int, started bool) {
	r = &heldRun{s: s, lease: lease, w: s.Workload, log: s.Logger.With("fence", lease.Fence)}
	proc, err := r.w.Start(lease)
	var f *Failure
	switch {
	case errors.Is(err, errLostBeforeStart):
		s.Emit(Event{State: StateLost, Fence: lease.Fence, Message: lockLostMessage(lease.Err())})
		r.finish(EndLost)
		return nil, ExitLost, false
	case errors.As(err, &f):
		r.finish(f.End)
		return nil, f.Code, false
	}
	r.proc = proc
	r.w.Arm(s.guardDeadline(lease))
	msg := proc.Event
	if msg == "" {
		msg = acquiredMessage(lease.Fence)
		if lease.Holders > 0 {
			msg = acquiredSlotMessage(lease.Slot, lease.Holders, lease.Path(), lease.Fence)
		}
	}
	s.Emit(r.held(StateHolding, msg))
	return r, 0, true
}

// held is an event of the holding states, with the lease's deadlines and
// the workload's PID and group, which the driver's watchdog reads.
func (r *heldRun) held(state State, msg string) Event {
	return Event{State: state, Fence: r.lease.Fence, Message: msg,
		FenceDeadline: r.lease.FenceDeadline(), StopDeadline: r.lease.StopDeadline(), LastRenew: r.lease.LastRenew(),
		WorkloadPID: r.proc.PID, WorkloadPGID: r.proc.PGID}
}

// guardDeadline is when the process-group guard kills the workload if the
// supervisor is frozen and never re-arms it: the fence deadline plus the
// kill timeout (what an unfrozen supervisor would have allowed the workload
// after a loss), capped by the stop deadline, which comes before the server
// can expire the lock and let a standby in.
func (s *Supervisor) guardDeadline(lease *lockclient.Lease) time.Time {
	return earliest(lease.FenceDeadline().Add(s.Config.KillTimeout+time.Second), lease.StopDeadline())
}

// hold is the holding state. Each renewal re-arms the workload's guard and
// republishes the deadlines; the hooks' events are published, and other
// signals forwarded to the workload. The workload's exit, the lease's
// loss, a hook's failure, a stop request or a terminating signal shuts
// down and ends the run with its exit code. A hook may drain the run
// while the hold goes on (a gate whose allocation is being stopped, before
// Nomad kills its gated tasks): the PreKill hooks run then.
func (r *heldRun) hold(ctx context.Context, sigs <-chan os.Signal) int {
	s, lease, w := r.s, r.lease, r.w
	hctx, cancelHold := context.WithCancel(ctx)
	defer cancelHold()
	events, err := r.holding(hctx)
	if err != nil {
		return r.fail(err)
	}
	drained := false
	// A stop request a hook delays: the request, when it came, and the
	// hook's channel.
	var delayed *StopRequest
	var delayedAt time.Time
	var delayC <-chan string

	for {
		select {
		case <-lease.Renewed():
			w.Arm(s.guardDeadline(lease))
			s.Emit(r.held(s.state, s.message))

		case ev := <-events:
			switch {
			case ev.Fail != nil:
				return r.fail(ev.Fail)
			case ev.StepDown:
				return r.stepDown(hctx, ev)
			case ev.Drain && !drained:
				drained = true
				r.log.Info("drained: the hooks' pre-kill work runs before the workload is stopped")
				r.preKill(func() {
					w.Arm(s.guardDeadline(lease))
					s.Emit(r.held(s.state, s.message))
				})
			case !ev.Drain:
				r.publish(ev)
			}

		case <-w.Exited():
			code := w.ExitCode()
			r.log.Info("workload exited", "code", code)
			r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, EndExited)
			return code

		case <-lease.Lost():
			return r.lost()

		case req := <-s.Stop:
			if delayed != nil {
				r.log.Info("second stop request: stopping at once", "kill_timeout", req.Timeout)
				r.shutdown(req.Signal, r.delayedLeft(*delayed, delayedAt), EndStopRequest)
				return w.ExitCode()
			}
			r.log.Info("stop requested", "kill_signal", signalName(req.Signal), "kill_timeout", req.Timeout)
			c, end := r.stopping(hctx, EndStopRequest, req.Timeout)
			if c != nil {
				delayed, delayedAt, delayC = &req, lockclient.BootNow(), c
				continue
			}
			r.shutdown(req.Signal, req.Timeout, end)
			return w.ExitCode()

		case msg, ok := <-delayC:
			if ok {
				s.Notice(r.held(s.state, msg))
				continue
			}
			r.log.Info("stopping after the stop's delay", "waited", lockclient.BootNow().Sub(delayedAt).Round(time.Millisecond))
			r.shutdown(delayed.Signal, r.delayedLeft(*delayed, delayedAt), EndStopRequest)
			return w.ExitCode()

		case sig := <-sigs:
			if code, stopped := r.signal(hctx, sig); stopped {
				return code
			}
		}
	}
}

// holding starts the hooks' part in the hold, and merges their events
// into one channel, until ctx ends. A hook that cannot start its part
// fails the run (a *Failure).
func (r *heldRun) holding(ctx context.Context) (<-chan HookEvent, error) {
	merged := make(chan HookEvent)
	for _, h := range hooksOf[HoldingHook](r.s) {
		events, err := h.Holding(ctx, r.lease)
		if err != nil {
			return nil, err
		}
		go func() {
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						return
					}
					select {
					case merged <- ev:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	return merged, nil
}

// publish publishes a hook's event as one of the hold's.
func (r *heldRun) publish(ev HookEvent) {
	state := ev.State
	if state == "" {
		state = r.s.state
	}
	if ev.Notice {
		r.s.Notice(r.held(state, ev.Message))
		return
	}
	r.s.Emit(r.held(state, ev.Message))
}

// fail stops the workload after a hook failed the run (a *Failure), with
// the failure's event, and returns its code.
func (r *heldRun) fail(err error) int {
	s := r.s
	var f *Failure
	if !errors.As(err, &f) {
		f = &Failure{Code: ExitInfra, End: EndStartFailed, Err: err}
	}
	if f.Event != "" {
		s.Emit(r.held(StateStopping, f.Event))
	}
	r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, f.End)
	return f.Code
}

// stepDown stops the workload as a stop request would, with the lock's
// kill_signal and kill_timeout, after the hook's event; the run then waits
// for the lock again, provided the workload was proven dead (else the lock
// is left to expire and the run ends, as after any stop).
func (r *heldRun) stepDown(ctx context.Context, ev HookEvent) int {
	s := r.s
	r.log.Info("stepping down: stopping the workload, then waiting for the lock again",
		"kill_signal", signalName(s.Config.KillSignal), "kill_timeout", s.Config.KillTimeout)
	if ev.Message != "" {
		r.publish(HookEvent{State: ev.State, Message: ev.Message, Notice: ev.Notice})
	}
	_, _ = r.stopping(ctx, EndStepDown, 0)
	r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, EndStepDown)
	r.again = r.proven && !r.failRun
	return r.w.ExitCode()
}

// stopping tells the Stopping hooks that a stop arrived, at once, and
// returns the delay one of them asks for (nil: stop at once), and the
// stop's ending (a stop request a hook makes a step-down). A stop
// request's budget is its kill_timeout less the workload's own grace
// (lock.kill_timeout), so that the stop after the delay still has that
// grace.
func (r *heldRun) stopping(ctx context.Context, end Ending, timeout time.Duration) (<-chan string, Ending) {
	req := StoppingRequest{End: end, Lease: r.lease}
	if end == EndStopRequest {
		req.Budget = max(timeout-r.s.Config.KillTimeout, 0)
	}
	var delay <-chan string
	for _, h := range hooksOf[StoppingHook](r.s) {
		var resp StoppingResponse
		h.Stopping(ctx, req, &resp)
		if resp.Delay != nil && delay == nil {
			delay = resp.Delay
		}
		if resp.StepDown && req.End == EndStopRequest {
			req.End, req.Budget = EndStepDown, 0
		}
	}
	return delay, req.End
}

// delayedLeft is the grace left of a delayed stop request that came at
// at: its kill_timeout less the delay, and never less than the workload's
// own grace (the delay's budget leaves that much).
func (r *heldRun) delayedLeft(req StopRequest, at time.Time) time.Duration {
	return max(req.Timeout-lockclient.BootNow().Sub(at), r.s.Config.KillTimeout)
}

// exitCode is the run's exit code: the hold's, or 1 where that is 0 and a
// Release hook asked the run to fail (a gate that Nomad did not stop must
// fail, so that Nomad kills its gated tasks).
func (r *heldRun) exitCode(code int) int {
	if code == 0 && r.failRun {
		r.log.Info("exiting non-zero: a hook fails the run")
		return 1
	}
	return code
}

// lost stops the workload after the lease was lost, within its stop deadline.
func (r *heldRun) lost() int {
	s, lease := r.s, r.lease
	why := lease.Err()
	r.log.Error("lock lost, stopping the workload", "why", why, "stop_deadline", lockclient.BootUntil(lease.StopDeadline()).Round(time.Millisecond))
	s.Emit(r.held(StateLost, lockLostMessage(why)))
	r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, EndLost)
	return ExitLost
}

// signal stops the workload on SIGTERM or SIGINT (with kill_signal instead,
// when one is set) and forwards any other signal to it. stopped is true,
// with the exit code, once the workload was stopped.
func (r *heldRun) signal(ctx context.Context, sig os.Signal) (code int, stopped bool) {
	s := r.s
	sys, _ := sig.(syscall.Signal)
	if sys == syscall.SIGTERM || sys == syscall.SIGINT {
		stopSig := sys
		if s.Config.KillSignalSet {
			stopSig = s.Config.KillSignal
		}
		r.log.Info("stopping on signal", "signal", sig, "kill_signal", stopSig)
		_, _ = r.stopping(ctx, EndSignal, 0)
		r.shutdown(stopSig, s.Config.KillTimeout, EndSignal)
		return r.w.ExitCode(), true
	}
	r.w.Forward(sig)
	return 0, false
}
