package lbhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
)

// ErrNotFinal is wrapped by Run's error when the cancel wait ran out before
// Baragon reported a final state. The request may still finish later.
var ErrNotFinal = errors.New("lb request did not reach a final state")

// ErrNeverReached is wrapped by Run's error when the deadline passed and no
// call ever reached the LB API (every one failed to connect): the LB never
// saw the request, so there is nothing to cancel, and nothing to undo.
var ErrNeverReached = errors.New("never reached the LB API")

// alreadyEnqueued is the text of Baragon's FAILED answer to a POST whose id
// is active with a different body (RequestManager.enqueueRequest).
const alreadyEnqueued = "is already enqueued with different parameters"

// IsAlreadyEnqueued reports whether resp is Baragon's "Request X is already
// enqueued with different parameters" answer: FAILED, but nothing was stored,
// and the request with that id is still active.
func IsAlreadyEnqueued(resp BaragonResponse) bool {
	return resp.LoadBalancerState == StateFailed && strings.Contains(resp.Message, alreadyEnqueued)
}

// Run drives req to a final state and returns Baragon's final answer.
//
// It POSTs req, then GETs it every poll interval until its state is final.
// Any UNKNOWN result (transport error, timeout, 5xx, unreadable answer) and a
// 404 on GET ("not stored") make it POST the same id again, with exponential
// backoff; Baragon's POST is idempotent by id. A FAILED "already enqueued
// with different parameters" answer to a POST is re-sent once, as Singularity
// does; if it comes again, the request with our id is active, so Run polls
// it. A 4xx on POST is a final FAILED (message: status and body), unless
// Baragon already accepted the id, in which case Run keeps polling.
//
// At deadline (if not zero) an unfinished request is cancelled: Run DELETEs
// it and polls, for at most ClientOptions.CancelWait, until a final state.
// That state may be SUCCESS if the request won the race. Run makes at least
// one POST even when the deadline has passed.
//
// The error is nil whenever a final state was reached, whatever it is. It
// wraps ctx.Err() when ctx ends first (no cancel is sent then), or
// ErrNotFinal when the cancel wait ran out; the response is then the last one
// seen.
func (c *Client) Run(ctx context.Context, req BaragonRequest, deadline time.Time) (BaragonResponse, error) {
	if !idPattern.MatchString(req.LoadBalancerRequestID) {
		return BaragonResponse{}, fmt.Errorf("lb request id %q cannot be empty or contain whitespace, '/', or '|'", req.LoadBalancerRequestID)
	}
	r := &runner{
		c:        c,
		req:      req,
		id:       req.LoadBalancerRequestID,
		deadline: deadline,
		log:      c.log.With("request_id", req.LoadBalancerRequestID),
		last:     BaragonResponse{LoadBalancerRequestID: req.LoadBalancerRequestID, LoadBalancerState: StateUnknown},
	}
	resp, err := r.untilDeadline(ctx)
	if err != nil || resp.LoadBalancerState.IsFinal() {
		return resp, err
	}
	if !r.reached {
		r.log.Warn("deadline passed and no call reached the LB API; nothing to cancel", "error", r.lastErr)
		return resp, r.withLastCall(fmt.Errorf("lb request %s: %w before its deadline (last state %s)", r.id, ErrNeverReached, resp.LoadBalancerState))
	}
	return r.cancel(ctx)
}

// neverSent reports whether a call failed before any byte of it could
// reach the server: it could not connect (refused, unreachable, no such host).
func neverSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// runner is the state of one Run.
type runner struct {
	c        *Client
	req      BaragonRequest
	id       string
	deadline time.Time
	log      hclog.Logger

	last     BaragonResponse // last answer (or synthesized UNKNOWN)
	accepted bool            // Baragon answered this id with a live state
	resent   bool            // the "already enqueued" re-send was used
	reached  bool            // some call may have reached the LB API

	// lastErr is the latest call that got no usable answer, for the
	// error of a run that ends without a final state.
	lastErr error
	// streak is the current run of unanswered calls; reported is when
	// OnUnanswered last heard of it.
	streak   Unanswered
	reported time.Time
}

// unanswered records a call that got no usable answer and tells
// OnUnanswered of the first one of a run, then at its bounded rate.
func (r *runner) unanswered(err error) {
	r.lastErr = err
	var ce *CallError
	if !errors.As(err, &ce) {
		return
	}
	now := time.Now()
	if r.streak.Calls == 0 {
		r.streak.Since = now
	}
	r.streak.Calls++
	r.streak.RequestID, r.streak.Err = r.id, ce
	if r.c.opts.OnUnanswered == nil || (r.streak.Calls > 1 && now.Sub(r.reported) < r.c.opts.UnansweredEvery) {
		return
	}
	r.reported = now
	r.c.opts.OnUnanswered(r.streak)
}

// answered ends a run of unanswered calls.
func (r *runner) answered() {
	r.streak = Unanswered{}
}

// step is what one call tells the loop to do next.
type step int

const (
	stepDone     step = iota // r.last is final
	stepPoll                 // in progress: GET after the poll interval
	stepRepost               // POST again after a backoff
	stepResend               // POST again at once
	stepRetry                // cancel phase, UNKNOWN: same call after a backoff
	stepRedelete             // cancel phase: DELETE after the poll interval
)

// untilDeadline POSTs and polls until a final state, the deadline or ctx.
// It returns with r.last not final only when the deadline passed.
func (r *runner) untilDeadline(ctx context.Context) (BaragonResponse, error) {
	bo := r.c.newBackoff()
	post := true
	// Polls start fast and slow down to PollInterval: a quick LB answers in
	// tens of milliseconds, and every poll we skip is time the workload
	// waits to be registered or to get its kill signal.
	pollWait := min(firstPoll, r.c.cfg.PollInterval)
	for {
		var resp BaragonResponse
		var err error
		if post {
			resp, err = r.c.Post(ctx, r.req)
		} else {
			resp, err = r.c.Get(ctx, r.id)
		}
		// A call cut short by the caller says nothing about Baragon.
		if ctxErr := ctx.Err(); ctxErr != nil {
			return r.last, r.ctxError(ctxErr)
		}
		if err == nil {
			r.answered()
		}
		r.reached = r.reached || !neverSent(err)
		var next step
		if post {
			next = r.afterPost(resp, err)
		} else {
			next = r.afterGet(resp, err)
		}
		if next == stepDone {
			r.logFinal()
			return r.last, nil
		}
		post = next != stepPoll
		var wait time.Duration
		switch next {
		case stepResend:
			wait = 0
		case stepRepost:
			wait = bo.NextBackOff()
		default:
			bo.Reset()
			wait, pollWait = pollWait, min(2*pollWait, r.c.cfg.PollInterval)
		}
		if r.deadlinePassed() {
			return r.last, nil
		}
		if err := sleepUntil(ctx, wait, r.deadline); err != nil {
			return r.last, r.ctxError(err)
		}
		if r.deadlinePassed() {
			return r.last, nil
		}
	}
}

// afterPost classifies the answer to a POST.
func (r *runner) afterPost(resp BaragonResponse, err error) step {
	var ce *CallError
	switch {
	case err == nil && IsAlreadyEnqueued(resp):
		if !r.resent {
			r.resent = true
			r.log.Info("Baragon says the id is enqueued with different parameters; sending once more", "message", resp.Message)
			return stepResend
		}
		// The id is active on Baragon (the worker may have rewritten the
		// stored body, e.g. noValidate on a remove-only request): poll it.
		r.log.Info("request with our id is active on Baragon; polling it", "message", resp.Message)
		r.accepted = true
		return stepPoll
	case err == nil:
		return r.record(resp)
	case errors.As(err, &ce) && ce.State == StateFailed && r.accepted:
		r.log.Warn("POST rejected after Baragon had accepted the id; polling instead", "error", err)
		return stepPoll
	case errors.As(err, &ce) && ce.State == StateFailed:
		r.last = resp
		return stepDone
	default:
		r.log.Warn("POST result unknown; will POST the same id again", "error", err)
		r.unanswered(err)
		r.last.LoadBalancerState, r.last.Message = StateUnknown, resp.Message
		return stepRepost
	}
}

// afterGet classifies the answer to a GET.
func (r *runner) afterGet(resp BaragonResponse, err error) step {
	switch {
	case err == nil:
		return r.record(resp)
	case errors.Is(err, ErrNotFound):
		r.log.Warn("Baragon has no request with our id (not stored); POSTing it again")
		return stepRepost
	default:
		r.log.Warn("GET result unknown; will POST the same id again", "error", err)
		r.unanswered(err)
		r.last.LoadBalancerState, r.last.Message = StateUnknown, resp.Message
		return stepRepost
	}
}

// record keeps a decoded answer and says whether it is final.
func (r *runner) record(resp BaragonResponse) step {
	r.last = resp
	switch {
	case resp.LoadBalancerState.IsFinal():
		return stepDone
	case resp.LoadBalancerState.InProgress():
		if !r.accepted {
			r.log.Debug("Baragon accepted the request", "state", resp.LoadBalancerState, "message", resp.Message)
		}
		r.accepted = true
		return stepPoll
	default:
		// A server that answers UNKNOWN itself: treat as unknown.
		return stepRepost
	}
}

// cancel DELETEs the request and polls until a final state or CancelWait.
func (r *runner) cancel(ctx context.Context) (BaragonResponse, error) {
	wait := r.c.opts.CancelWait
	r.log.Warn("deadline passed before a final state; cancelling", "state", r.last.LoadBalancerState, "cancel_wait", wait)
	cctx, stop := context.WithTimeout(ctx, wait)
	defer stop()
	bo := r.c.newBackoff()
	del := true
	for {
		method := http.MethodGet
		call := r.c.Get
		if del {
			method, call = http.MethodDelete, r.c.Cancel
		}
		resp, err := call(cctx, r.id)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return r.last, r.ctxError(ctxErr)
		}
		if err == nil {
			r.answered()
		}
		next := r.afterCancelCall(method, resp, err)
		if next == stepDone {
			r.logFinal()
			return r.last, nil
		}
		pause := r.c.cfg.PollInterval
		switch next {
		case stepRetry:
			pause = bo.NextBackOff()
		case stepRedelete:
			del = true
		default:
			del = false
			bo.Reset()
		}
		if cctx.Err() != nil || sleepUntil(cctx, pause, time.Time{}) != nil {
			if err := ctx.Err(); err != nil {
				return r.last, r.ctxError(err)
			}
			return r.last, r.withLastCall(fmt.Errorf("lb request %s: %w within the cancel wait of %s (last state %s)",
				r.id, ErrNotFinal, wait, r.last.LoadBalancerState))
		}
	}
}

// afterCancelCall classifies an answer during the cancel phase. Nothing is
// re-POSTed there: a 404 on GET is answered by DELETE, which reports
// "does not exist" as CANCELED; a WAITING request is DELETEd again.
func (r *runner) afterCancelCall(method string, resp BaragonResponse, err error) step {
	switch {
	case err == nil && resp.LoadBalancerState.IsFinal():
		r.last = resp
		return stepDone
	case err == nil && resp.LoadBalancerState == StateWaiting:
		r.last = resp
		return stepRedelete
	case err == nil && resp.LoadBalancerState.InProgress():
		r.last = resp
		return stepPoll
	case errors.Is(err, ErrNotFound):
		return stepRedelete
	default:
		r.log.Warn("cancel-phase call result unknown; retrying", "method", method, "error", err)
		r.unanswered(err)
		if method == http.MethodDelete {
			return stepRetry
		}
		return stepRedelete
	}
}

// deadlinePassed reports whether the cancel deadline (if any) is reached.
func (r *runner) deadlinePassed() bool {
	return !r.deadline.IsZero() && !time.Now().Before(r.deadline)
}

// ctxError wraps the caller's context error with the request and its last state.
func (r *runner) ctxError(err error) error {
	return r.withLastCall(fmt.Errorf("lb request %s: %w (last state %s)", r.id, err, r.last.LoadBalancerState))
}

// withLastCall adds the latest unanswered call to err while the state is
// UNKNOWN: the cause an operator needs, e.g. "connection refused". The
// result wraps both (errors.As finds the *CallError).
func (r *runner) withLastCall(err error) error {
	if r.lastErr == nil || r.last.LoadBalancerState != StateUnknown {
		return err
	}
	return fmt.Errorf("%w; last call: %w", err, r.lastErr)
}

func (r *runner) logFinal() {
	level := hclog.Info
	if r.last.LoadBalancerState != StateSuccess {
		level = hclog.Warn
	}
	r.log.Log(level, "lb request finished", "state", r.last.LoadBalancerState, "message", r.last.Message)
}

// newBackoff paces retries after UNKNOWN results: from the poll interval up
// to MaxRetryWait (default 8× it), with jitter; the caller's deadline bounds the total.
func (c *Client) newBackoff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.cfg.PollInterval),
		backoff.WithMultiplier(1.5),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxInterval(c.opts.MaxRetryWait),
		backoff.WithMaxElapsedTime(0),
	)
}

// firstPoll is the wait before the first poll of a request in progress.
const firstPoll = 25 * time.Millisecond

// sleepUntil waits d, or until the deadline (if not zero), or until ctx ends.
func sleepUntil(ctx context.Context, d time.Duration, deadline time.Time) error {
	if !deadline.IsZero() {
		if left := time.Until(deadline); left < d {
			d = left
		}
	}
	return ctxsleep.Sleep(ctx, d)
}
