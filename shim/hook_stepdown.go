package shim

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// stepDownHook is a run's part in `lock step-down` (lockclient/stepdown.go;
// docs/operations.md, "A switchover"), on both sides of the lock.
//
// Waiting, the run records itself as a standby of the lock, so that the
// command knows who waits and whom -to may name, and withdraws the record
// once the wait ends; and when the lock comes free with a handover in its
// record, it gives way for the handover's grace unless it is the standby
// named (the acquire's Defer, beside the update rule's).
//
// Holding, it offers a step-down in the holder's record (how, and how long
// its stop takes) if its identity may read the requests, and watches them
// with a blocking query: a request proved with its own lock ID, for
// itself, steps it down. A process tree's run stops its workload through
// the normal stop path (HookEvent.StepDown: the PreKill hooks, so the LB
// REMOVE first, kill_signal, kill_timeout, proof of death) and waits for
// the lock again. A gate's gated tasks are Nomad's: the requester restarts
// the gate's allocation, and the stop that restart brings is the
// step-down (StoppingResponse.StepDown), which the gate's own rule decides
// (docs/gate.md). Either way the release writes the handover into the
// record, with the clean mark, so that the standbys see whom to give way
// to the moment the lock is free. A request refused, forged, for another
// holder or expired changes nothing.
type stepDownHook struct {
	locker *lockclient.Locker
	mode   lockclient.StepDownMode
	// within bounds how long the stop takes once it begins (the command's
	// wait for the release).
	within time.Duration
	emit   Emitter
	log    hclog.Logger
	self   string // the holder's Key: its allocation, or host and PID

	// offered: this tenure's record offers a step-down (the identity may
	// read the requests).
	offered bool
	mu      sync.Mutex
	// req is the request this tenure acts on; handedOver: the release
	// wrote its handover.
	req        *lockclient.StepDownRequest
	handedOver bool
	// withdrawing is the previous wait's record being withdrawn.
	withdrawing sync.WaitGroup
	// told: the standby-record refusal and the handover last given way to
	// were said once.
	toldRecord bool
	toldTo     string
}

func newStepDownHook(locker *lockclient.Locker, mode lockclient.StepDownMode, within time.Duration, emit Emitter, log hclog.Logger) *stepDownHook {
	return &stepDownHook{locker: locker, mode: mode, within: within, emit: emit, log: log.Named("step-down"),
		self: locker.Config().Holder.Key()}
}

func (h *stepDownHook) Name() string { return "step-down" }

// PreAcquire records the standby for the wait, gives way to a handover,
// and offers the step-down in the record the acquire writes.
func (h *stepDownHook) PreAcquire(ctx context.Context, resp *PreAcquireResponse) error {
	h.mu.Lock()
	h.req, h.handedOver = nil, false
	h.mu.Unlock()
	h.withdrawing.Wait()
	announced := make(chan string, 1)
	go func() { announced <- h.announce(ctx) }()
	resp.AfterWait = append(resp.AfterWait, func(acquired bool) {
		h.withdraw(<-announced)
		if !acquired {
			h.withdrawing.Wait() // the run ends: leave no record behind
		}
	})
	resp.AddDefer(h.giveWay)
	h.offered = h.locker.StepDownReadable(ctx)
	if h.offered {
		resp.AddItems(lockclient.StepDownItems(h.mode, h.within))
	} else {
		h.log.Warn("the identity may not read step-down requests: this holder offers no step-down",
			"path", lockclient.StepDownPathFor(h.locker.Config().Path))
	}
	return nil
}

// announce records the standby and returns its record's path ("" if none).
func (h *stepDownHook) announce(ctx context.Context) string {
	path, err := h.locker.AnnounceStandby(ctx)
	var pe *lockclient.StandbyPermissionError
	switch {
	case err == nil:
		return path
	case ctx.Err() != nil:
		// The wait ended first; a record written meanwhile is withdrawn.
		return lockclient.StandbyPrefixFor(h.locker.Config().Path) + h.self
	case errors.As(err, &pe) && !h.toldRecord:
		h.toldRecord = true
		h.log.Warn(pe.Error())
		h.emit.Notice(Event{State: StateWaiting, Message: standbyUnlistedMessage(pe)})
	default:
		h.log.Debug("cannot record the standby", "error", err)
	}
	return ""
}

// withdraw deletes the standby record at path, in the background (the
// next wait's record waits for it).
func (h *stepDownHook) withdraw(path string) {
	if path == "" {
		return
	}
	h.withdrawing.Add(1)
	go func() {
		defer h.withdrawing.Done()
		ctx, cancel := context.WithTimeout(context.Background(), h.locker.Config().RequestTimeout)
		defer cancel()
		if err := h.locker.WithdrawStandby(ctx, path); err != nil {
			h.log.Warn("cannot withdraw the standby record: lock step-down shows it until its allocation is gone", "path", path, "error", err)
		}
	}()
}

// giveWay is the acquire's Defer: the handover's grace (Handover.Grace).
func (h *stepDownHook) giveWay(_ context.Context, prev lockclient.Holder) (time.Duration, bool) {
	ho := prev.Handover
	grace := ho.Grace(h.self, time.Now())
	if grace <= 0 {
		return 0, false
	}
	if key := ho.From + ">" + ho.To + "@" + ho.Until.String(); h.toldTo != key {
		h.toldTo = key
		h.log.Info("lock free after a step-down: giving way", "from", ho.From, "to", ho.To, "grace", grace)
		h.emit.Notice(Event{State: StateWaiting, Message: stepDownGivingWayMessage(ho, grace)})
	}
	return grace, false
}

// Holding watches the step-down requests while the lock is held.
func (h *stepDownHook) Holding(ctx context.Context, lease *lockclient.Lease) (<-chan HookEvent, error) {
	if !h.offered || lease.Holders > 0 {
		return nil, nil
	}
	out := make(chan HookEvent, 1)
	go func() {
		req, ok := <-lease.WatchStepDown(ctx)
		if !ok {
			return
		}
		h.accept(req)
		ev := HookEvent{Notice: true, Message: stepDownRequestedMessage(req, h.mode)}
		if h.mode == lockclient.StepDownStop {
			ev.StepDown = true
		}
		select {
		case out <- ev:
		case <-ctx.Done():
		}
	}()
	return out, nil
}

// accept makes req the request this tenure acts on.
func (h *stepDownHook) accept(req lockclient.StepDownRequest) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.req = &req
}

// accepted is the request this tenure acts on, if any.
func (h *stepDownHook) accepted() *lockclient.StepDownRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.req
}

// Stopping makes a stop request a step-down for a run that steps down by
// a restart of its allocation (a gate), once a request for it is proved:
// the one its watch delivered, or, as the restart may come first, one
// read now.
func (h *stepDownHook) Stopping(ctx context.Context, req StoppingRequest, resp *StoppingResponse) {
	if h.mode != lockclient.StepDownRestart || !h.offered || req.End != EndStopRequest || req.Lease == nil {
		return
	}
	if h.accepted() == nil {
		rctx, cancel := context.WithTimeout(ctx, h.locker.Config().RequestTimeout)
		defer cancel()
		if r, ok := req.Lease.StepDownRequested(rctx); ok {
			h.accept(r)
		}
	}
	if h.accepted() != nil {
		h.log.Info("stopped for a step-down: Nomad restarts the allocation")
		resp.StepDown = true
	}
}

// Release writes the handover with the clean mark, once the workload of a
// step-down is proven dead and the lock goes.
func (h *stepDownHook) Release(_ context.Context, req ReleaseRequest, resp *ReleaseResponse) {
	r := h.accepted()
	if req.End != EndStepDown || !req.Proven || r == nil {
		return
	}
	resp.MarkClean = true
	resp.Items = lockclient.Handover{From: h.self, To: r.To, Until: time.Now().Add(r.Wait)}.Items()
	h.mu.Lock()
	h.handedOver = true
	h.mu.Unlock()
}

// Released says that the run stepped down.
func (h *stepDownHook) Released(err error) {
	r := h.accepted()
	h.mu.Lock()
	handedOver := h.handedOver
	h.mu.Unlock()
	if err != nil || r == nil || !handedOver {
		return
	}
	h.emit.Notice(Event{State: StateReleased, Message: steppedDownMessage(*r, h.mode)})
}
