package lbhook

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RequestKind is the middle part of our request ids.
type RequestKind string

// The kinds of request a Hook sends.
const (
	KindAdd    RequestKind = "ADD"
	KindRemove RequestKind = "REMOVE"
)

// maxIDLen is Baragon's limit on an upstream's requestId, which carries our
// request id.
const maxIDLen = 250

// RequestID returns "<allocID>-<KIND>-<fence>" for attempt 1 and
// "<allocID>-<KIND>-<fence>-<attempt>" after. The id is keyed by alloc,
// unique per acquisition (the fence), and stable across retries of one
// attempt. A new attempt is needed only after a final FAILED or CANCELED,
// because Baragon never re-executes a finished id (Singularity increments
// its REMOVE attempt number for the same reason).
func RequestID(allocID string, kind RequestKind, fence uint64, attempt int) string {
	id := fmt.Sprintf("%s-%s-%d", allocID, kind, fence)
	if attempt > 1 {
		id = fmt.Sprintf("%s-%d", id, attempt)
	}
	return id
}

// Service returns the BaragonService described by the client's Config, in
// Singularity's shape: owners, additionalPaths, domains and edgeCacheDomains
// always present, options and templateName only when set.
func (c *Client) Service() BaragonService {
	return BaragonService{
		ServiceID:          c.cfg.ServiceID,
		Owners:             append([]string{}, c.cfg.Owners...),
		ServiceBasePath:    c.cfg.BasePath,
		AdditionalPaths:    append([]string{}, c.cfg.AdditionalPaths...),
		LoadBalancerGroups: append([]string{}, c.cfg.Groups...),
		Options:            c.cfg.Options,
		TemplateName:       c.cfg.TemplateName,
		Domains:            append([]string{}, c.cfg.Domains...),
		EdgeCacheDomains:   []string{},
	}
}

// Self is our upstream at addr ("host:port"), with the configured group
// and rackId.
func (c *Client) Self(addr string) UpstreamInfo {
	return UpstreamInfo{Upstream: addr, Group: c.cfg.Group, RackID: c.cfg.RackID}
}

// NewRequest returns an UPDATE request for the configured service that adds
// and removes the given upstreams, with Singularity's flags
// (noDuplicateUpstreams=true, everything else false). Every upstream is
// tagged with id, and an empty group becomes "default".
func (c *Client) NewRequest(id string, add, remove []UpstreamInfo) BaragonRequest {
	return BaragonRequest{
		LoadBalancerRequestID: id,
		LoadBalancerService:   c.Service(),
		AddUpstreams:          tagUpstreams(add, id),
		RemoveUpstreams:       tagUpstreams(remove, id),
		ReplaceUpstreams:      []UpstreamInfo{},
		Action:                ActionUpdate,
		NoDuplicateUpstreams:  true,
	}
}

// tagUpstreams sets our request id and a group on every upstream.
func tagUpstreams(ups []UpstreamInfo, id string) []UpstreamInfo {
	out := make([]UpstreamInfo, 0, len(ups))
	for _, u := range ups {
		u.RequestID = id
		u.Group = u.GroupOrDefault()
		out = append(out, u)
	}
	return out
}

// HasUpstream reports whether ups holds u's (upstream, group).
func HasUpstream(ups []UpstreamInfo, u UpstreamInfo) bool {
	for _, x := range ups {
		if x.SameTarget(u) {
			return true
		}
	}
	return false
}

// OutcomeError is a request that reached a final state other than SUCCESS.
type OutcomeError struct {
	// RequestID is the Baragon request id.
	RequestID string
	// State is FAILED, CANCELED or INVALID_REQUEST_NOOP.
	State RequestState
	// Message is Baragon's message (or the HTTP failure for a rejected POST).
	Message string
	// Deadline is the deadline that was set; a CANCELED request was
	// normally cancelled by us when it passed.
	Deadline time.Duration
}

// Error says which request ended how, and why. The request id and the
// message, which may be the LB's, say at most MaxLBText each.
func (e *OutcomeError) Error() string {
	msg := fmt.Sprintf("lb request %s ended %s", clipLB(e.RequestID), e.State)
	if e.State == StateCanceled {
		msg += fmt.Sprintf(" (not final within its %s deadline)", e.Deadline)
	}
	if e.Message != "" {
		msg += ": " + clipLB(e.Message)
	}
	return msg
}

// outcome is nil for SUCCESS and an *OutcomeError otherwise.
func outcome(resp BaragonResponse, deadline time.Duration) error {
	if resp.LoadBalancerState == StateSuccess {
		return nil
	}
	return &OutcomeError{
		RequestID: resp.LoadBalancerRequestID,
		State:     resp.LoadBalancerState,
		Message:   resp.Message,
		Deadline:  deadline,
	}
}

// Hook sends the LB requests of one allocation for one acquisition of the
// lock (its fence).
type Hook struct {
	c       *Client
	allocID string
	fence   uint64
}

// ForAlloc returns the Hook of allocID for the acquisition with this fence.
func (c *Client) ForAlloc(allocID string, fence uint64) (*Hook, error) {
	if !idPattern.MatchString(allocID) {
		return nil, fmt.Errorf("alloc id %q cannot be empty or contain whitespace, '/', or '|'", allocID)
	}
	if n := len(RequestID(allocID, KindRemove, fence, 1000)); n > maxIDLen {
		return nil, fmt.Errorf("alloc id %q is too long: request ids would reach %d characters (Baragon allows %d)", allocID, n, maxIDLen)
	}
	return &Hook{c: c, allocID: allocID, fence: fence}, nil
}

// Fence is the acquisition this hook registers.
func (h *Hook) Fence() uint64 { return h.fence }

// ID returns the request id of this hook for kind and attempt.
func (h *Hook) ID(kind RequestKind, attempt int) string {
	return RequestID(h.allocID, kind, h.fence, attempt)
}

// AddRequest builds the ADD request (attempt 1): it adds self and removes
// the previous holders' upstreams in the same request, so a crashed holder
// is swapped out atomically. Previous upstreams that are empty, repeated or
// the same (upstream, group) as self are left out: removing ourselves would
// undo the add.
func (h *Hook) AddRequest(self UpstreamInfo, removePrevious []UpstreamInfo) (BaragonRequest, error) {
	return h.addRequest(self, removePrevious, 1)
}

func (h *Hook) addRequest(self UpstreamInfo, removePrevious []UpstreamInfo, attempt int) (BaragonRequest, error) {
	if err := validateUpstream(self); err != nil {
		return BaragonRequest{}, fmt.Errorf("lb add: %w", err)
	}
	var remove []UpstreamInfo
	for _, p := range removePrevious {
		if p.Upstream == "" || p.SameTarget(self) || HasUpstream(remove, p) {
			continue
		}
		remove = append(remove, p)
	}
	id := h.ID(KindAdd, attempt)
	return h.c.NewRequest(id, []UpstreamInfo{self}, remove), nil
}

// RemoveRequest builds the REMOVE request of the given attempt.
func (h *Hook) RemoveRequest(self UpstreamInfo, attempt int) (BaragonRequest, error) {
	if err := validateUpstream(self); err != nil {
		return BaragonRequest{}, fmt.Errorf("lb remove: %w", err)
	}
	return h.c.NewRequest(h.ID(KindRemove, attempt), nil, []UpstreamInfo{self}), nil
}

// Add registers self and removes removePrevious in one request, and runs it
// to a final state within AddDeadline (then it is cancelled). The error is
// an *OutcomeError when the final state is not SUCCESS; the caller should
// stop the task and say why.
func (h *Hook) Add(ctx context.Context, self UpstreamInfo, removePrevious []UpstreamInfo) (BaragonResponse, error) {
	return h.runAdd(ctx, self, removePrevious, 1)
}

// ReAdd registers self again under attempt n (≥ 2), for when the upstream
// vanished out of band after a successful Add: the first ADD id is finished
// and Baragon would only return its old answer.
func (h *Hook) ReAdd(ctx context.Context, self UpstreamInfo, attempt int) (BaragonResponse, error) {
	if attempt < 2 {
		return BaragonResponse{}, fmt.Errorf("lb re-add: attempt must be at least 2 (got %d)", attempt)
	}
	return h.runAdd(ctx, self, nil, attempt)
}

// AddAt is Add under attempt n (≥ 1): a follower that adds its upstream
// again in one tenure, after a REMOVE (its health check failed, then
// passed), needs an id of its own each time, since Baragon never re-runs a
// finished id.
func (h *Hook) AddAt(ctx context.Context, self UpstreamInfo, removePrevious []UpstreamInfo, attempt int) (BaragonResponse, error) {
	return h.runAdd(ctx, self, removePrevious, max(attempt, 1))
}

func (h *Hook) runAdd(ctx context.Context, self UpstreamInfo, removePrevious []UpstreamInfo, attempt int) (BaragonResponse, error) {
	req, err := h.addRequest(self, removePrevious, attempt)
	if err != nil {
		return BaragonResponse{}, err
	}
	d := h.c.cfg.AddDeadline
	op := "add"
	if attempt > 1 {
		op = "readd"
	}
	resp, err := h.run(ctx, op, req, time.Now().Add(d))
	if err != nil {
		return resp, err
	}
	return resp, outcome(resp, d)
}

// Remove deregisters self within RemoveDeadline. A FAILED or CANCELED
// attempt is retried under the next attempt id while the deadline allows
// (Baragon never re-runs a finished id). INVALID_REQUEST_NOOP is not retried:
// nothing would change. The error is an *OutcomeError when the last state is
// not SUCCESS.
//
// A request that ended CANCELED, or with no final state seen, may still
// have been applied: a REMOVE cancelled at its deadline while Baragon's
// agents applied it ends CANCELED, and an answer can be lost. So before it
// reports such a failure,
// Remove reads the service's state (one call, bounded by RequestTimeout,
// even if ctx has ended): if self is no longer there the removal took
// effect, and Remove returns the last response with a nil error (its state
// is then not SUCCESS; see RemovedAnyway).
func (h *Hook) Remove(ctx context.Context, self UpstreamInfo) (BaragonResponse, error) {
	resp, _, err := h.RemoveFrom(ctx, self, 1)
	return resp, err
}

// RemoveFrom is Remove with its first attempt numbered first (≥ 1), for a
// registration that is removed more than once under one fence (a follower
// whose health check failed, then passed again): Baragon never re-runs a
// finished id, so each REMOVE needs ids of its own. last is the highest
// attempt it sent; the next REMOVE starts above it.
func (h *Hook) RemoveFrom(ctx context.Context, self UpstreamInfo, first int) (resp BaragonResponse, last int, err error) {
	first = max(first, 1)
	resp, last, err = h.remove(ctx, self, first)
	if err == nil || !mayHaveApplied(resp) || !h.goneFromState(ctx, self) {
		return resp, last, err
	}
	h.c.log.Warn("lb remove did not end SUCCESS, but the service's state no longer has our upstream: it was applied",
		"state", resp.LoadBalancerState, "error", err)
	return resp, last, nil
}

// mayHaveApplied reports whether a request that ended with resp may have
// taken effect: it was cancelled (Baragon may have applied it before the
// cancel), or never reached a final state we saw. FAILED was reverted and
// INVALID_REQUEST_NOOP changed nothing.
func mayHaveApplied(resp BaragonResponse) bool {
	switch resp.LoadBalancerState {
	case StateFailed, StateInvalidRequestNoop, StateSuccess:
		return false
	}
	return true
}

// RemovedAnyway reports whether a Remove that returned no error with resp
// ended other than SUCCESS, its change seen in the service's state.
func RemovedAnyway(resp BaragonResponse) bool {
	return resp.LoadBalancerState != StateSuccess
}

// goneFromState reads the service's state once and reports whether it
// answered without self.
func (h *Hook) goneFromState(ctx context.Context, self UpstreamInfo) bool {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.c.cfg.RequestTimeout)
	defer cancel()
	ups, err := h.State(sctx)
	if err != nil {
		h.c.log.Warn("lb remove: cannot read the service's state to see whether the removal was applied", "error", err)
		return false
	}
	return !HasUpstream(ups, self)
}

func (h *Hook) remove(ctx context.Context, self UpstreamInfo, first int) (BaragonResponse, int, error) {
	d := h.c.cfg.RemoveDeadline
	deadline := time.Now().Add(d)
	for attempt := first; ; attempt++ {
		req, err := h.RemoveRequest(self, attempt)
		if err != nil {
			return BaragonResponse{}, attempt, err
		}
		resp, err := h.run(ctx, "remove", req, deadline)
		if err != nil {
			return resp, attempt, err
		}
		switch resp.LoadBalancerState {
		case StateSuccess:
			return resp, attempt, nil
		case StateFailed, StateCanceled:
			if time.Until(deadline) > h.c.cfg.PollInterval {
				h.c.log.Warn("lb remove attempt failed; retrying under a new id",
					"request_id", req.LoadBalancerRequestID, "state", resp.LoadBalancerState, "message", resp.Message)
				if err := sleepUntil(ctx, h.c.cfg.PollInterval, deadline); err != nil {
					return resp, attempt, fmt.Errorf("lb remove: %w", err)
				}
				continue
			}
		}
		return resp, attempt, outcome(resp, d)
	}
}

// run is Client.Run, reported to ClientOptions.OnRequest as op.
func (h *Hook) run(ctx context.Context, op string, req BaragonRequest, deadline time.Time) (BaragonResponse, error) {
	began := time.Now()
	resp, err := h.c.Run(ctx, req, deadline)
	if report := h.c.opts.OnRequest; report != nil {
		result := "unknown"
		if err == nil && resp.LoadBalancerState.IsFinal() {
			result = strings.ToLower(string(resp.LoadBalancerState))
		}
		report(RequestReport{Op: op, Result: result, Took: time.Since(began)})
	}
	return resp, err
}

// State returns the upstreams Baragon holds for the configured service; an
// unknown service has none.
func (h *Hook) State(ctx context.Context) ([]UpstreamInfo, error) {
	st, err := h.c.ServiceState(ctx)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lb state: %w", err)
	}
	return st.Upstreams, nil
}
