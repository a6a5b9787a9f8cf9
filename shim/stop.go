package shim

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// shutdown runs the PreKill hooks (the LB REMOVE) first, then stops the
// workload and releases as the hooks allow.
func (r *heldRun) shutdown(sig syscall.Signal, timeout time.Duration, end Ending) {
	s, lease, w := r.s, r.lease, r.w
	// The loop no longer re-arms the guard: give it the whole stop (the
	// PreKill hooks, then the grace), still capped by the stop deadline.
	until := lockclient.BootNow().Add(r.preKillBound() + timeout + 2*time.Second)
	w.Arm(earliest(until, lease.StopDeadline()))
	r.preKill(func() {
		w.Arm(earliest(until, lease.StopDeadline()))
		s.Emit(r.held(s.state, s.message))
	})
	r.stop(sig, timeout, end)
	r.finish(end)
}

// preKillRequest is what the PreKill hooks get now.
func (r *heldRun) preKillRequest() PreKillRequest {
	return PreKillRequest{Lease: r.lease, KillBound: r.w.KillBound()}
}

// preKillBound is the longest the PreKill hooks take, one after another.
func (r *heldRun) preKillBound() time.Duration {
	var d time.Duration
	for _, h := range hooksOf[PreKillHook](r.s) {
		d += h.PreKillBound(r.preKillRequest())
	}
	return d
}

// preKill runs the PreKill hooks, one after another, and publishes their
// events. Meanwhile every renew of the lease calls onRenew (re-arm the
// guard, republish the deadlines): a REMOVE may take longer than a renew
// interval, and a stale fence deadline would make the driver's watchdog
// kill a supervisor that is only waiting for the LB.
func (r *heldRun) preKill(onRenew func()) {
	hooks := hooksOf[PreKillHook](r.s)
	if len(hooks) == 0 {
		return
	}
	req := r.preKillRequest()
	done := make(chan PreKillResponse, 1)
	go func() {
		var resp PreKillResponse
		for _, h := range hooks {
			h.PreKill(context.Background(), req, &resp)
		}
		done <- resp
	}()
	for {
		select {
		case resp := <-done:
			for _, ev := range resp.Events {
				r.publish(ev)
			}
			return
		case <-r.lease.Renewed():
			onRenew()
		}
	}
}

// stop ends the workload: sig to every process of it (Workload.Stop),
// grace until every one is gone or timeout passes, then SIGKILL (in
// finish). A workload that is gone already is not signalled at all.
//
// A graceful stop of a healthy lock gets its whole timeout: renewals go on
// and push the guard's deadline and the deadlines the driver's watchdog
// reads. Only a lost lease cuts the grace, to the lease's stop deadline
// (before the server can free the lock), and an event says so. A loss that
// the server did not declare (renews late or failing past the fence
// deadline, as on a loaded machine) is tried back (see retake): if the lock
// is still ours, the grace is whole again on the lease retaken, which
// replaces r.lease.
func (r *heldRun) stop(sig syscall.Signal, timeout time.Duration, why Ending) {
	s, w := r.s, r.w
	event, wait := w.Stop(sig, why)
	if event != "" {
		s.Emit(r.held(StateStopping, event))
	}
	if !wait {
		return
	}
	began := lockclient.BootNow()
	end := began.Add(timeout)
	deadline := graceEnd(end, r.lease)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	grace := lockclient.NewBootTimer(lockclient.BootUntil(deadline))
	defer grace.Stop()
	var lost <-chan struct{}
	if !chans.Closed(r.lease.Lost()) {
		lost = r.lease.Lost() // lost before the stop: lost() said so
	}
	rt := newRetaker(s)
	defer func() {
		if l := rt.stop(); l != nil {
			r.lease = l // retaken as the stop ended: finish releases it
		}
	}()
	for {
		select {
		case <-grace.C():
			if deadline.Before(end) {
				s.Emit(r.held(StateStopping, killAfterLossMessage(lockclient.BootNow().Sub(began).Round(time.Second), timeout, r.lease.Err())))
			} else {
				s.Logger.Warn("workload did not stop in time, sending SIGKILL", "grace", timeout)
			}
			return
		case <-lost:
			lost = nil
			deadline = graceEnd(end, r.lease)
			grace.Reset(lockclient.BootUntil(deadline))
			renewing := rt.start(r.lease)
			s.Emit(r.held(StateStopping, lostWhileStoppingMessage(r.lease.Err(), deadline.Before(end),
				lockclient.BootUntil(deadline).Round(time.Second), lockclient.BootUntil(end).Round(time.Second), renewing)))
		case l := <-rt.retaken:
			r.lease, lost = l, l.Lost()
			deadline = graceEnd(end, l)
			grace.Reset(lockclient.BootUntil(deadline))
			w.Arm(earliest(deadline.Add(2*time.Second), l.StopDeadline()))
			s.Emit(r.held(StateStopping, renewedAgainMessage(timeout, lockclient.BootUntil(deadline).Round(time.Second))))
		case <-r.lease.Renewed():
			// Still ours: keep the guard, and the driver's watchdog (which
			// reads the deadlines this event publishes), from cutting a long
			// kill_timeout short.
			w.Arm(earliest(deadline.Add(2*time.Second), r.lease.StopDeadline()))
			s.Emit(r.held(s.state, s.message))
		case <-poll.C:
			if w.Gone() {
				return
			}
		}
	}
}

// graceEnd is when a stop's grace ends: end (its kill_timeout after the
// stop began), cut to the lease's stop deadline once the lease is lost.
func graceEnd(end time.Time, lease *lockclient.Lease) time.Time {
	if chans.Closed(lease.Lost()) {
		return earliest(end, lease.StopDeadline())
	}
	return end
}

// finish makes sure no process of the workload survives, then releases as
// the Release hooks allow (end is why the run ends). If the workload
// cannot be proven dead the lock is NOT released: it then expires on the
// server after 2*TTL + lock delay, so no second holder can overlap.
func (r *heldRun) finish(end Ending) {
	s, lease := r.s, r.lease
	req := ReleaseRequest{Lease: lease, End: end, Proven: r.w.KillAll()}
	r.proven = req.Proven
	resp := ReleaseResponse{Keep: !req.Proven}
	for _, h := range hooksOf[ReleaseHook](s) {
		h.Release(context.Background(), req, &resp)
	}
	r.failRun = resp.Fail
	clean := resp.MarkClean && !resp.NotClean
	switch {
	case resp.Keep && resp.Why != nil:
		s.released(resp.Why)
		return
	case resp.Keep:
		return
	case clean || len(resp.Items) > 0:
		s.markReleasing(lease, resp.Items, clean)
	}
	s.release(lease)
}

// markReleasing writes the Release hooks' items (a step-down's handover)
// and, when clean, the clean mark into the holder's record: the clean mark
// tells the next holder that our work is proven dead, so that it need not
// wait for it (a gate's gated tasks), and that the lock is free (a standby
// whose token is not shown the lock's state).
func (s *Supervisor) markReleasing(lease *lockclient.Lease, items map[string]string, clean bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.Locker.Config().RequestTimeout)
	defer cancel()
	if err := lease.MarkReleasing(ctx, items, clean); err != nil {
		s.Logger.Warn("cannot mark the release clean: the next holder waits for our work as for one not proven dead (a gate's, for Nomad's report), and a standby whose token is not shown the lock's state does not see it free", "error", err)
	}
}

// release releases the lease, says how it went, and tells the Release
// hooks (released).
func (s *Supervisor) release(lease *lockclient.Lease) {
	timeout := s.Locker.Config().RequestTimeout + time.Second
	ctx, cancel := lockclient.WithBootTimeout(context.Background(), timeout)
	defer cancel()
	err := lease.Release(ctx)
	tried := err
	if errors.Is(err, lockclient.ErrLost) || errors.Is(err, lockclient.ErrLeftToExpire) {
		// Nothing for anyone to release: gone, or left to expire.
		tried = nil
	}
	defer s.released(tried)
	switch {
	case err == nil:
		s.Emit(Event{State: StateReleased, Fence: lease.Fence, Message: releasedMessage()})
	case errors.Is(err, lockclient.ErrLost):
		s.Logger.Info("nothing to release: the lock was already gone", "reason", err)
	case errors.Is(err, lockclient.ErrLeftToExpire):
		s.Logger.Warn("not releasing the lock: left to expire", "reason", err)
		s.Emit(Event{State: StateStopping, Fence: lease.Fence, Message: LeftToExpireMessage(err)})
	default:
		s.Logger.Warn("release failed; the lock expires on its own", "error", err)
		s.Emit(Event{State: StateStopping, Fence: lease.Fence, Message: releaseFailedMessage(err, s.Locker.Config(), s.Config.PluginReleases)})
	}
}

// released tells the Release hooks how the release went: nil when released
// or nothing was left to release; the error otherwise, or why a hook kept
// the lock for someone else to release.
func (s *Supervisor) released(err error) {
	for _, h := range hooksOf[ReleaseHook](s) {
		h.Released(err)
	}
}
