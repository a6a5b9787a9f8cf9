package shim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// ExitLBFailed is the exit code when the load balancer refused our ADD
// (FAILED, CANCELED or INVALID_REQUEST_NOOP): the workload was stopped.
const ExitLBFailed = 74

// DefaultLBRecheck is how often a registered holder checks that the LB still
// has its upstream, and re-adds it if it vanished out of band. MinLBRecheck
// is the least recheck_interval: the check is a GET of the service's state.
const (
	DefaultLBRecheck = 10 * time.Second
	MinLBRecheck     = time.Second
)

// LoadBalancer is the optional LB registration of the one live instance.
type LoadBalancer struct {
	lbhook.Config
	// Upstream is our host:port, resolved from the port label.
	Upstream string
	// Recheck is the interval of the "is our upstream still there" check.
	Recheck time.Duration
	// Health gates the ADD; nil adds as soon as the workload started.
	Health *HealthCheck
}

// HealthCheck must pass before the instance is added to the LB.
type HealthCheck struct {
	Type     string // "http" or "tcp"
	Path     string // http only; default "/"
	Address  string // host:port to check, resolved from the port label
	Interval time.Duration
	Timeout  time.Duration
	Grace    time.Duration // wait before the first check
}

// Health check defaults, and the least interval and timeout (zero takes the
// default): below them the root supervisor would busy-loop against a port
// of the job's choosing. A grace of 0 (check at once) is fine.
const (
	DefaultHealthInterval = time.Second
	DefaultHealthTimeout  = time.Second
	MinHealthInterval     = 100 * time.Millisecond
	MinHealthTimeout      = 100 * time.Millisecond
)

// Validate checks the health check with the fix in each message.
func (h *HealthCheck) Validate() error {
	var errs []error
	switch h.Type {
	case "http", "tcp":
	default:
		errs = append(errs, fmt.Errorf("health_check.type %q: use \"http\" or \"tcp\"", h.Type))
	}
	if _, _, err := net.SplitHostPort(h.Address); err != nil {
		errs = append(errs, fmt.Errorf("health_check address %q is not host:port: %w", h.Address, err))
	}
	if h.Path != "" && !strings.HasPrefix(h.Path, "/") {
		errs = append(errs, fmt.Errorf("health_check.path %q must start with /", h.Path))
	}
	if h.Interval < 0 || h.Timeout < 0 || h.Grace < 0 {
		errs = append(errs, errors.New("health_check interval, timeout and grace must not be negative"))
	}
	errs = append(errs, checkMin("health_check.interval", h.Interval, MinHealthInterval),
		checkMin("health_check.timeout", h.Timeout, MinHealthTimeout))
	return errors.Join(errs...)
}

// Validate checks the LB block and the resolved upstream.
func (lb *LoadBalancer) Validate() error {
	errs := []error{lb.Config.Validate()}
	if _, _, err := net.SplitHostPort(lb.Upstream); err != nil {
		errs = append(errs, fmt.Errorf("load_balancer upstream %q is not host:port (from port label %q): %w", lb.Upstream, lb.PortLabel, err))
	}
	if lb.Recheck < 0 {
		errs = append(errs, fmt.Errorf("load_balancer.recheck_interval %s must not be negative", lb.Recheck))
	}
	errs = append(errs, checkMin("load_balancer.recheck_interval", lb.Recheck, MinLBRecheck))
	if lb.Health != nil {
		errs = append(errs, lb.Health.Validate())
	}
	return errors.Join(errs...)
}

// checkMin refuses a positive d below min (zero takes the default; a
// negative d has its own error).
func checkMin(field string, d, min time.Duration) error {
	if d > 0 && d < min {
		return fmt.Errorf("%s = %s is below its minimum of %s", field, d, min)
	}
	return nil
}

// PortAddress resolves a Nomad port label to host:port from the task
// environment: NOMAD_HOST_ADDR_<label>, else NOMAD_ADDR_<label>.
func PortAddress(label string, getenv func(string) string) (string, error) {
	key := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, label)
	for _, v := range []string{"NOMAD_HOST_ADDR_" + key, "NOMAD_ADDR_" + key} {
		if addr := getenv(v); addr != "" {
			return addr, nil
		}
	}
	return "", fmt.Errorf("port label %q: the task has no NOMAD_HOST_ADDR_%s; add `port %q {}` to the group's network block", label, key, label)
}

// lbEvent is what the LB goroutines report to the supervisor loop.
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
// goroutines so the supervisor loop keeps reacting to loss and signals; the
// loop owns every field but events.
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
	// deregistered is set once deregister ran: the session is over (a
	// gate deregisters when its allocation is being stopped, before Nomad
	// kills the gated tasks, and again finds nothing to do when it stops).
	deregistered bool
	attempt      int
	// checkFails counts re-checks in a row that failed; checkNoticed is
	// when the last notice of them went out.
	checkFails   int
	checkNoticed time.Time
}

// startLB begins health-gating and the ADD for this lease. previous is the
// upstream of the holder before us, read from the lock's Items: it is removed
// in the same request, so a crashed holder is swapped out.
func (s *Supervisor) startLB(lease *lockclient.Lease) (*lbSession, error) {
	cfg := s.Config.LB
	recheck := max(cfg.Recheck, time.Second)
	var lb *lbSession
	client, err := lbhook.NewClient(cfg.Config, lbhook.ClientOptions{
		Logger: s.Logger.Named("lb"), Getenv: s.getenv,
		// An LB API that comes back is tried again within one recheck
		// interval (and within the client's own cap, if lower).
		MaxRetryWait: min(recheck, 8*cfg.WithDefaults().PollInterval),
		OnUnanswered: func(u lbhook.Unanswered) { lb.unanswered(u) },
		OnRequest:    s.lbRequestObserver(),
	})
	if err != nil {
		return nil, fmt.Errorf("load balancer client: %w", err)
	}
	allocID := s.Locker.Config().Holder.AllocID
	if allocID == "" {
		allocID = fmt.Sprintf("pid%d", s.Locker.Config().Holder.PID)
	}
	hook, err := client.ForAlloc(allocID, lease.Fence)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	lb = &lbSession{
		cfg: cfg, client: client, hook: hook,
		self: client.Self(cfg.Upstream),
		ctx:  ctx, cancel: cancel,
		events:  make(chan lbEvent, 4),
		recheck: time.NewTicker(recheck),
		busy:    true, attempt: 1,
	}
	if up := lease.Previous.Upstream; up != "" {
		// The previous holder ran the same task: its upstream is in our group.
		lb.prev = []lbhook.UpstreamInfo{{Upstream: up, Group: cfg.Group}}
	}
	go lb.healthThenAdd(s)
	return lb, nil
}

func (lb *lbSession) healthThenAdd(s *Supervisor) {
	if h := lb.cfg.Health; h != nil {
		if err := h.Wait(lb.ctx); err != nil {
			lb.events <- lbEvent{kind: "healthy", err: err}
			return
		}
		lb.events <- lbEvent{kind: "healthy"}
	}
	if lb.ctx.Err() != nil {
		return
	}
	if s.OnLBPosted != nil {
		s.OnLBPosted(lb.cfg, lb.hook, lb.self)
	}
	lb.posted.Store(true)
	resp, err := lb.hook.Add(lb.ctx, lb.self, lb.prev)
	lb.events <- lbEvent{kind: "added", resp: resp, err: err}
}

// unanswered passes a report of unanswered calls to the supervisor loop.
// It runs on the goroutine of the request; once the session is cancelled
// (we are stopping: the REMOVE reports its own failure) it is dropped.
func (lb *lbSession) unanswered(u lbhook.Unanswered) {
	if lb == nil {
		return
	}
	select {
	case lb.events <- lbEvent{kind: "unanswered", unanswered: u}:
	case <-lb.ctx.Done():
	}
}

// eventsC and recheckC are nil (never ready) without an LB.
func (lb *lbSession) eventsC() <-chan lbEvent {
	if lb == nil {
		return nil
	}
	return lb.events
}

func (lb *lbSession) recheckC() <-chan time.Time {
	if lb == nil {
		return nil
	}
	return lb.recheck.C
}

// check asks the LB whether our upstream is still registered.
func (lb *lbSession) check() {
	lb.busy = true
	go func() {
		ctx, cancel := context.WithTimeout(lb.ctx, lb.client.Config().RequestTimeout*2)
		defer cancel()
		ups, err := lb.hook.State(ctx)
		lb.events <- lbEvent{kind: "checked", err: err, missing: err == nil && !lbhook.HasUpstream(ups, lb.self)}
	}()
}

// readd registers our upstream again under a new attempt id.
func (lb *lbSession) readd() {
	lb.busy = true
	lb.attempt++
	attempt := lb.attempt
	go func() {
		resp, err := lb.hook.ReAdd(lb.ctx, lb.self, attempt)
		lb.events <- lbEvent{kind: "readded", resp: resp, err: err}
	}()
}

// handleLB reacts to one LB event. It returns a non-nil error when the
// workload must be stopped because the ADD failed: the LB refused it, or
// never answered it by add_deadline.
func (s *Supervisor) handleLB(lb *lbSession, ev lbEvent, held func(State, string) Event) error {
	if lb.deregistered {
		return nil // late news of a session that is over
	}
	if ev.kind == "unanswered" {
		// The request goes on: a notice, not a change of state.
		s.notify(held(s.state, lbUnansweredMessage(ev.unanswered, lb.registered, lb.client.Config())))
		return nil
	}
	lb.busy = false
	switch ev.kind {
	case "healthy":
		if ev.err != nil {
			return nil // only a cancelled wait ends the health gate with an error
		}
		lb.busy = true // the ADD follows in the same goroutine
		s.emit(held(StateHealthy, lbHealthyMessage(lb.cfg.Health.Address)))
	case "added":
		if ev.err != nil {
			if lb.ctx.Err() != nil {
				return nil
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
				if s.OnLBRemoved != nil {
					s.OnLBRemoved()
				}
			}
			return ev.err
		}
		lb.registered = true
		s.emit(held(StateRegistered, lbRegisteredMessage(lb.self.Upstream, lb.cfg.ServiceID)))
	case "checked":
		if ev.err == nil {
			lb.checkFails = 0
		}
		switch {
		case ev.err != nil:
			s.Logger.Warn("lb re-check failed; trying again next interval", "error", ev.err)
			lb.checkFails++
			if lb.checkFails == 1 || time.Since(lb.checkNoticed) >= lbhook.DefaultUnansweredEvery {
				lb.checkNoticed = time.Now()
				s.notify(held(s.state, lbRecheckFailedMessage(ev.err, lb.checkFails, lb.client.Config(), lb.cfg.Recheck)))
			}
		case ev.missing:
			s.Logger.Warn("our upstream vanished from the load balancer; adding it again", "upstream", lb.self.Upstream)
			lb.readd()
		}
	case "readded":
		if ev.err != nil {
			if lb.ctx.Err() == nil {
				s.Logger.Error("lb re-add failed; trying again next interval", "error", ev.err)
			}
			return nil
		}
		// Each re-add is an event of its own, counted, so that an LB that
		// keeps losing our upstream shows.
		s.notify(held(StateRegistered, lbReaddedMessage(lb.self.Upstream, lb.cfg.ServiceID, lb.attempt-1)))
	}
	return nil
}

// deregister stops all LB work and removes our upstream if an ADD may have
// reached the LB, within budget. It runs before the workload is signalled.
// While the REMOVE runs, every renew of the lease calls onRenew (the
// caller re-arms its guard and republishes its deadlines: a REMOVE may take
// longer than a renew interval, and a stale fence deadline would make the
// driver's watchdog kill a supervisor that is only waiting for the LB).
func (s *Supervisor) deregister(lb *lbSession, budget time.Duration, held func(State, string) Event,
	renewed <-chan struct{}, onRenew func()) {
	if lb == nil || lb.deregistered {
		return
	}
	lb.deregistered = true
	lb.cancel()
	lb.recheck.Stop()
	if !lb.posted.Load() {
		return
	}
	if budget <= 0 {
		s.Logger.Warn("no time left for the lb remove", "upstream", lb.self.Upstream)
		s.emit(held(StateStopping, lbRemoveSkippedMessage(lb.self.Upstream, lb.cfg.ServiceID)))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(budget, 0))
	defer cancel()
	began := time.Now()
	type result struct {
		resp lbhook.BaragonResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := lb.hook.Remove(ctx, lb.self)
		done <- result{resp, err}
	}()
	var r result
	for waiting := true; waiting; {
		select {
		case r = <-done:
			waiting = false
		case <-renewed:
			onRenew()
		}
	}
	resp, err := r.resp, r.err
	if err != nil {
		s.Logger.Error("lb remove did not complete; stopping the workload anyway", "error", err, "state", resp.LoadBalancerState, "took", time.Since(began))
		s.emit(held(StateStopping, lbRemoveFailedMessage(err, lb.client.Config(), lb.self.Upstream)))
		return
	}
	s.Logger.Info("removed from the load balancer", "upstream", lb.self.Upstream, "took", time.Since(began).Round(time.Millisecond))
	s.emit(held(StateStopping, lbRemovedMessage(lb.self.Upstream, lb.cfg.ServiceID, resp)))
	if s.OnLBRemoved != nil {
		s.OnLBRemoved()
	}
}

// Wait runs the check until it passes or ctx ends.
func (h *HealthCheck) Wait(ctx context.Context) error {
	if err := ctxsleep.Sleep(ctx, h.Grace); err != nil {
		return err
	}
	interval := h.Interval
	if interval == 0 {
		interval = DefaultHealthInterval
	}
	// The first checks usually run before the workload listens: retry fast
	// at first, then settle at the interval.
	wait := min(50*time.Millisecond, interval)
	for {
		if err := checkOnce(ctx, h); err == nil {
			return nil
		}
		if err := ctxsleep.Sleep(ctx, wait); err != nil {
			return err
		}
		wait = min(2*wait, interval)
	}
}

func checkOnce(ctx context.Context, h *HealthCheck) error {
	timeout := h.Timeout
	if timeout == 0 {
		timeout = DefaultHealthTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if h.Type == "tcp" {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", h.Address)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	path := h.Path
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.Address+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("health check %s: HTTP %d", req.URL, resp.StatusCode)
	}
	return nil
}
