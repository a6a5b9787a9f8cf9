package shim

import (
	"context"
	"errors"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// gateHook attaches a gate (see Gate) to the supervisor's life cycle: it
// checks the job before the lock is taken, adopts a restarted gate's
// lease, ends the wait for the lock when the allocation is being stopped,
// waits for the previous holder's gated tasks, drains the run (the gated
// task's LB REMOVE) before Nomad kills it, and decides whether the lock
// may be released, and marked clean, once the hold ends.
type gateHook struct {
	s *Supervisor
	g *Gate
	// watch closes once the allocation is seen being stopped (or gone)
	// while the gate holds; at is what was known when a stop arrived.
	watch <-chan struct{}
	at    stopArrival
}

func newGateHook(s *Supervisor, g *Gate) *gateHook { return &gateHook{s: s, g: g} }

func (h *gateHook) Name() string { return "gate" }

// check refuses a job that cannot be gated safely (gateCheck).
func (h *gateHook) check(ctx context.Context) (int, error) {
	s := h.s
	err := s.gateCheck(ctx)
	if err == nil {
		return 0, nil
	}
	s.Logger.Error("gate: not taking the lock", "error", err)
	s.emit(Event{State: StateStopping, Message: gateNotStartedMessage(err)})
	var ge *GateConfigError
	var pe *lockclient.AllocPermissionError
	switch {
	case errors.As(err, &ge):
		return ExitConfig, err
	case errors.As(err, &pe):
		return ExitPermission, err
	}
	return ExitInfra, err
}

// takeLease adopts the lease the gate's previous run left held.
func (h *gateHook) takeLease(ctx context.Context) (*lockclient.Lease, int, bool, bool) {
	s, g := h.s, h.g
	if g.Adopt == nil {
		return nil, 0, false, false
	}
	l, err := s.gateAdopt(ctx)
	if err != nil {
		s.Logger.Error("gate: cannot take over the previous run's lease", "error", err)
		s.emit(Event{State: StateLost, Fence: g.Adopt.Fence, Message: gateAdoptFailedMessage(err)})
		return nil, ExitLost, true, true
	}
	return l, 0, true, false
}

// abortWait closes when the allocation is being stopped: Nomad cannot
// kill a task that it has not seen start.
func (h *gateHook) abortWait(ctx context.Context) <-chan struct{} { return h.s.gateStopping(ctx) }

// acquired waits for the previous holder's gated tasks (gateAwaitPrevious).
func (h *gateHook) acquired(lease *lockclient.Lease) bool { return h.s.gateAwaitPrevious(lease) }

// Holding watches the allocation: once it is being stopped, the run is
// drained (its upstream REMOVEd) before Nomad kills the gated tasks.
func (h *gateHook) Holding(ctx context.Context, _ *lockclient.Lease) (<-chan HookEvent, error) {
	h.watch = h.s.gateStopping(ctx)
	out := make(chan HookEvent)
	go func() {
		select {
		case <-h.watch:
			select {
			case out <- HookEvent{Drain: true}:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	return out, nil
}

// stopArrived records, the moment Nomad's stop arrives, whether the
// allocation was already seen being stopped, and else reads it at once:
// the release is decided from that, not from what is true once the gated
// task's LB REMOVE is done (see gateMayRelease).
func (h *gateHook) stopArrived(end Ending) {
	if end != EndStopRequest {
		return
	}
	if chans.Closed(h.watch) {
		h.at = stopArrival{seen: true}
		return
	}
	h.at = h.s.readAtStop()
}

// acquireOptions records in the holder's Items that the gate kills every
// gated task itself, so the next gate may trust the lock's expiry.
func (h *gateHook) acquireOptions(opts *lockclient.AcquireOptions) {
	opts.GatedDirect = h.g.allDirect()
}

// exitCode: a gate exits 0 only when Nomad stopped it. On any other Ending
// it must fail, so that Nomad kills the tasks it gates (a prestart sidecar
// that exits 0 is done, and its siblings run on).
func (h *gateHook) exitCode(end Ending, code int) int {
	if code == 0 && end != EndStopRequest {
		h.s.Logger.Info("gate: exiting non-zero, so that Nomad fails the gate and kills its gated tasks", "Ending", end.String())
		return 1
	}
	return code
}

// mayRelease releases once the gated tasks are proven dead and cannot run
// again beside the next holder (gateMayRelease).
func (h *gateHook) mayRelease(lease *lockclient.Lease, end Ending) (bool, bool) {
	return h.s.gateMayRelease(lease, end, h.at)
}

func (h *gateHook) lbFailedMessage(err error, cfg lbhook.Config, start bool) string {
	if start {
		return gateLBStartFailedMessage(err)
	}
	return gateLBAddFailedMessage(err, cfg)
}
