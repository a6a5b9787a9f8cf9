package shim

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// ExitLBFailed is the exit code when the load balancer refused our ADD
// (FAILED, CANCELED or INVALID_REQUEST_NOOP): the workload was stopped.
const ExitLBFailed = 74

// endLBFailed: the LB ADD failed for good.
const endLBFailed Ending = "LB add failed"

// lbHook registers the one live instance with a load balancer while it
// holds the lock (Holding: health check, ADD, then a re-check that re-adds
// an upstream that vanished), and takes it out again before the workload
// is signalled (PreKill: REMOVE, within what the workload's kill leaves of
// the time to the stop deadline). A drain of the run (a gate whose
// allocation is being stopped, before Nomad kills its gated tasks) is a
// PreKill too: the hook knows no reason for it.
type lbHook struct {
	cfg *LoadBalancer
	// allocID names the requests (the holder's allocation, or pid<N>).
	allocID string
	getenv  func(string) string
	log     hclog.Logger
	// rec keeps the registration for a crash REMOVE (the driver's); nil
	// for none.
	rec LBRecorder
	// startFailed and addFailed word the failures that end the run: the
	// workload's stop, or a gate's failure (Attach).
	startFailed func(err error) string
	addFailed   func(err error, cfg lbhook.Config) string
	// onRequest hears of every request the LB client ran to its end (the
	// metrics hook's); nil for none. It must not block.
	onRequest func(lbhook.RequestReport)

	// sess is the lease's session once Holding began it; run, its loop,
	// ends with stop, which PreKill calls first; removed once PreKill ran.
	sess    *lbSession
	stop    context.CancelFunc
	stopped chan struct{}
	removed bool
}

// LBRecorder keeps a run's LB registration where a crash REMOVE finds it
// (the driver's lb.json).
type LBRecorder interface {
	// LBPosted runs before the ADD is sent.
	LBPosted(cfg lbhook.Config, hook *lbhook.Hook, self lbhook.UpstreamInfo)
	// LBRemoved runs once our REMOVE succeeded, or once the ADD is known
	// to have registered nothing.
	LBRemoved()
}

func (h *lbHook) Name() string { return "lb" }

// Holding starts the session for lease: the health check, then one ADD
// that also removes the previous holder's upstream (recorded in the lock),
// then a re-check every recheck interval. Its events are the hold's.
func (h *lbHook) Holding(ctx context.Context, lease *lockclient.Lease) (<-chan HookEvent, error) {
	sess, err := h.startSession(lease)
	if err != nil {
		h.log.Error("cannot register with the load balancer", "error", err)
		return nil, &Failure{Code: ExitLBFailed, End: endLBFailed, Err: err, Event: h.startFailed(err)}
	}
	h.sess = sess
	ctx, h.stop = context.WithCancel(ctx)
	h.stopped = make(chan struct{})
	events := make(chan HookEvent)
	go h.run(ctx, events)
	return events, nil
}

// run is the session's loop: it turns the LB's answers into the hold's
// events, and re-checks, until ctx ends or the ADD failed for good.
func (h *lbHook) run(ctx context.Context, out chan<- HookEvent) {
	defer close(h.stopped)
	sess := h.sess
	defer sess.recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-sess.events:
			hev, send := sess.handle(ev, h)
			if !send {
				continue
			}
			select {
			case out <- hev:
			case <-ctx.Done():
				return
			}
			if hev.Fail != nil {
				return
			}
		case <-sess.recheck.C:
			if sess.registered && !sess.busy {
				sess.check()
			}
		}
	}
}

// PreKillBound is the longest PreKill takes for req: its REMOVE's budget
// and the one state read a failed REMOVE may add.
func (h *lbHook) PreKillBound(req PreKillRequest) time.Duration {
	return h.removeBudget(req) + h.cfg.WithDefaults().RequestTimeout
}

// PreKill ends the session and REMOVEs our upstream if an ADD may have
// reached the LB, within removeBudget. Idempotent: a drained run finds
// nothing left to do when it stops.
func (h *lbHook) PreKill(_ context.Context, req PreKillRequest, resp *PreKillResponse) {
	sess := h.sess
	if sess == nil || h.removed {
		return
	}
	h.removed = true
	h.stop()
	<-h.stopped
	sess.cancel()
	if !sess.posted.Load() {
		return
	}
	budget := h.removeBudget(req)
	if budget <= 0 {
		h.log.Warn("no time left for the lb remove", "upstream", sess.self.Upstream)
		resp.Events = append(resp.Events, HookEvent{State: StateStopping, Message: lbRemoveSkippedMessage(sess.self.Upstream, h.cfg.ServiceID)})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	began := time.Now()
	r, err := sess.hook.Remove(ctx, sess.self)
	if err != nil {
		h.log.Error("lb remove did not complete; stopping the workload anyway", "error", err, "state", r.LoadBalancerState, "took", time.Since(began))
		resp.Events = append(resp.Events, HookEvent{State: StateStopping, Message: lbRemoveFailedMessage(err, sess.client.Config(), sess.self.Upstream)})
		return
	}
	h.log.Info("removed from the load balancer", "upstream", sess.self.Upstream, "took", time.Since(began).Round(time.Millisecond))
	resp.Events = append(resp.Events, HookEvent{State: StateStopping, Message: lbRemovedMessage(sess.self.Upstream, h.cfg.ServiceID, r)})
	if h.rec != nil {
		h.rec.LBRemoved()
	}
}

// removeBudget is how long the REMOVE may delay the kill signal: the
// remove deadline, and after a loss at most half the time left to the
// stop deadline, and no more than what the workload's kill leaves of it
// (req.KillBound: a gate's REMOVE after a loss delays its failure, and so
// Nomad's kill of the gated tasks, which must be dead by the stop
// deadline) less the one state read a failed REMOVE may add.
func (h *lbHook) removeBudget(req PreKillRequest) time.Duration {
	cfg := h.cfg.WithDefaults()
	budget := cfg.RemoveDeadline
	if lease := req.Lease; chans.Closed(lease.Lost()) {
		left := lockclient.BootUntil(lease.StopDeadline())
		budget = min(budget, left/2)
		if req.KillBound > 0 {
			budget = min(budget, left-req.KillBound-cfg.RequestTimeout)
		}
	}
	return max(budget, 0)
}

// startSession begins health-gating and the ADD for this lease. The
// upstream of the holder before us, read from the lock's Items, is removed
// in the same request, so a crashed holder is swapped out.
func (h *lbHook) startSession(lease *lockclient.Lease) (*lbSession, error) {
	cfg := h.cfg
	recheck := max(cfg.Recheck, time.Second)
	var sess *lbSession
	client, err := lbhook.NewClient(cfg.Config, lbhook.ClientOptions{
		Logger: h.log.Named("lb"), Getenv: h.getenv,
		// An LB API that comes back is tried again within one recheck
		// interval (and within the client's own cap, if lower).
		MaxRetryWait: min(recheck, 8*cfg.WithDefaults().PollInterval),
		OnUnanswered: func(u lbhook.Unanswered) { sess.unanswered(u) },
		OnRequest:    h.onRequest,
	})
	if err != nil {
		return nil, fmt.Errorf("load balancer client: %w", err)
	}
	hook, err := client.ForAlloc(h.allocID, lease.Fence)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sess = &lbSession{
		cfg: cfg, client: client, hook: hook,
		self: client.Self(cfg.Upstream),
		ctx:  ctx, cancel: cancel,
		events:  make(chan lbEvent, 4),
		recheck: time.NewTicker(recheck),
		busy:    true, attempt: 1,
	}
	if up := lease.Previous.Upstream; up != "" {
		// The previous holder ran the same task: its upstream is in our group.
		sess.prev = []lbhook.UpstreamInfo{{Upstream: up, Group: cfg.Group}}
	}
	go sess.healthThenAdd(h.rec)
	return sess, nil
}

// lbEvent is what the session's requests report to its loop.
type lbEvent struct {
	kind string // "healthy", "added", "checked", "readded", "unanswered"
	resp lbhook.BaragonResponse
	err  error
	// missing is set by "checked": our upstream is gone from the LB.
	missing bool
	// unanswered is set by "unanswered": calls of an ADD got no answer.
	unanswered lbhook.Unanswered
}

// lbSession is one acquisition's LB registration. Its requests run in
// goroutines so that its loop (lbHook.run) keeps reacting; the loop owns
// every field but events and posted.
type lbSession struct {
	cfg    *LoadBalancer
	client *lbhook.Client
	hook   *lbhook.Hook
	self   lbhook.UpstreamInfo
	prev   []lbhook.UpstreamInfo

	ctx     context.Context
	cancel  context.CancelFunc
	events  chan lbEvent
	recheck *time.Ticker

	busy       bool        // a request or check is in flight
	posted     atomic.Bool // an ADD may have reached the LB: REMOVE on the way out
	registered bool
	attempt    int
	// checkFails counts re-checks in a row that failed; checkNoticed is
	// when the last notice of them went out.
	checkFails   int
	checkNoticed time.Time
}

// send reports ev to the loop, unless the session is over.
func (lb *lbSession) send(ev lbEvent) {
	select {
	case lb.events <- ev:
	case <-lb.ctx.Done():
	}
}

func (lb *lbSession) healthThenAdd(rec LBRecorder) {
	if h := lb.cfg.Health; h != nil {
		if err := h.Wait(lb.ctx); err != nil {
			lb.send(lbEvent{kind: "healthy", err: err})
			return
		}
		lb.send(lbEvent{kind: "healthy"})
	}
	if lb.ctx.Err() != nil {
		return
	}
	if rec != nil {
		rec.LBPosted(lb.cfg.Config, lb.hook, lb.self)
	}
	lb.posted.Store(true)
	resp, err := lb.hook.Add(lb.ctx, lb.self, lb.prev)
	lb.send(lbEvent{kind: "added", resp: resp, err: err})
}

// unanswered passes a report of unanswered calls to the loop. It runs on
// the goroutine of the request; once the session is over (we are
// stopping: the REMOVE reports its own failure) it is dropped.
func (lb *lbSession) unanswered(u lbhook.Unanswered) {
	if lb == nil {
		return
	}
	lb.send(lbEvent{kind: "unanswered", unanswered: u})
}

// check asks the LB whether our upstream is still registered.
func (lb *lbSession) check() {
	lb.busy = true
	go func() {
		ctx, cancel := context.WithTimeout(lb.ctx, lb.client.Config().RequestTimeout*2)
		defer cancel()
		ups, err := lb.hook.State(ctx)
		lb.send(lbEvent{kind: "checked", err: err, missing: err == nil && !lbhook.HasUpstream(ups, lb.self)})
	}()
}

// readd registers our upstream again under a new attempt id.
func (lb *lbSession) readd() {
	lb.busy = true
	lb.attempt++
	attempt := lb.attempt
	go func() {
		resp, err := lb.hook.ReAdd(lb.ctx, lb.self, attempt)
		lb.send(lbEvent{kind: "readded", resp: resp, err: err})
	}()
}

// handle turns one answer of the LB into the hold's event, if any (send).
// An ADD that failed for good (the LB refused it, or never answered it by
// add_deadline) is a Fail event: the workload must stop.
func (lb *lbSession) handle(ev lbEvent, h *lbHook) (out HookEvent, send bool) {
	if ev.kind == "unanswered" {
		// The request goes on: a notice, not a change of state.
		return HookEvent{Notice: true, Message: lbUnansweredMessage(ev.unanswered, lb.registered, lb.client.Config())}, true
	}
	lb.busy = false
	switch ev.kind {
	case "healthy":
		if ev.err != nil {
			return out, false // only a cancelled wait ends the health gate with an error
		}
		lb.busy = true // the ADD follows in the same goroutine
		return HookEvent{State: StateHealthy, Message: lbHealthyMessage(lb.cfg.Health.Address)}, true
	case "added":
		if ev.err != nil {
			if lb.ctx.Err() != nil {
				return out, false
			}
			var oe *lbhook.OutcomeError
			if errors.As(ev.err, &oe) || errors.Is(ev.err, lbhook.ErrNeverReached) {
				// The ADD reached a final state other than SUCCESS (FAILED,
				// CANCELED or INVALID_REQUEST_NOOP): Baragon applied nothing
				// or reverted it; or no call of it ever connected, so the LB
				// never saw it. Like Singularity, send no REMOVE, here or
				// from the driver: one would only make the service appear in
				// Baragon's state with no upstream, or wait on an LB that is
				// down while the workload runs unrouted.
				lb.posted.Store(false)
				if h.rec != nil {
					h.rec.LBRemoved()
				}
			}
			h.log.Error("stopping: the load balancer ADD failed", "error", ev.err)
			return HookEvent{Fail: &Failure{Code: ExitLBFailed, End: endLBFailed, Err: ev.err,
				Event: h.addFailed(ev.err, lb.client.Config())}}, true
		}
		lb.registered = true
		return HookEvent{State: StateRegistered, Message: lbRegisteredMessage(lb.self.Upstream, lb.cfg.ServiceID)}, true
	case "checked":
		if ev.err == nil {
			lb.checkFails = 0
		}
		switch {
		case ev.err != nil:
			h.log.Warn("lb re-check failed; trying again next interval", "error", ev.err)
			lb.checkFails++
			if lb.checkFails == 1 || time.Since(lb.checkNoticed) >= lbhook.DefaultUnansweredEvery {
				lb.checkNoticed = time.Now()
				return HookEvent{Notice: true, Message: lbRecheckFailedMessage(ev.err, lb.checkFails, lb.client.Config(), lb.cfg.Recheck)}, true
			}
		case ev.missing:
			h.log.Warn("our upstream vanished from the load balancer; adding it again", "upstream", lb.self.Upstream)
			lb.readd()
		}
	case "readded":
		if ev.err != nil {
			if lb.ctx.Err() == nil {
				h.log.Error("lb re-add failed; trying again next interval", "error", ev.err)
			}
			return out, false
		}
		// Each re-add is an event of its own, counted, so that an LB that
		// keeps losing our upstream shows.
		return HookEvent{State: StateRegistered, Notice: true, Message: lbReaddedMessage(lb.self.Upstream, lb.cfg.ServiceID, lb.attempt-1)}, true
	}
	return out, false
}
