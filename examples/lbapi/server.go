package lbapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults and fixed settings.
const (
	// BasePath is Baragon's applicationContextPath in its docker config:
	// the request collection is {base URL}/baragon/v2/request.
	BasePath = "/baragon/v2"
	// DefaultWorkerInterval is small so that tests run fast; Baragon's
	// worker runs every second (BaragonWorkerConfiguration.intervalMs).
	DefaultWorkerInterval = 50 * time.Millisecond
	// DefaultGroup is the group configured when Options.Groups is empty.
	DefaultGroup = "default"

	// maxRequestsPerPoll is BaragonWorkerConfiguration.maxRequestsPerPoll.
	maxRequestsPerPoll = 10
	// maxBatchSize is BaragonWorkerConfiguration.maxBatchSize.
	maxBatchSize = 50
	// historyPerService bounds the finished responses kept per service
	// (HistoryConfiguration.maxRequestsPerService), the oldest going first,
	// so that a long demo or bench run does not grow without bound.
	historyPerService = 1000
	// faultSeed seeds the fault generator: a given arrival order always
	// sees the same faults.
	faultSeed = 1
)

// Group is a load balancer group, simulated by one agent unless a Backend
// serves it.
type Group struct {
	// Name is the group name (loadBalancerGroups entry).
	Name string
	// Domains are the domains the group serves.
	Domains []string
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Groups are the existing load balancer groups (default: "default").
	Groups []Group
	// AuthKeys are the accepted auth keys; none disables auth, like
	// Baragon's auth.enabled=false.
	AuthKeys []string
	// WorkerInterval is the worker period (default 50ms; Baragon: 1s).
	WorkerInterval time.Duration
	// ManualWorker starts no background worker: only Step advances requests.
	ManualWorker bool
	// Logger receives the server's logs (default: none).
	Logger hclog.Logger
	// Clock stamps the moments a request is enqueued and reaches a final
	// state, as reported by Server.Request (default: Unix nanoseconds). It
	// is read under the server's lock, at the instant the state changes, so
	// it must not call back into the Server. Tests pass CLOCK_MONOTONIC to
	// order those moments against other processes' timestamps.
	Clock func() int64

	// Backend, when set, is a real load balancer (e.g. NewHAProxyBackend)
	// that acts as the one agent of BackendGroups: requests for their
	// services reach SUCCESS only once it serves the change, a change it
	// refuses ends FAILED with its error in the message, and GET /state
	// reports what it actually serves. Without it every group is simulated
	// in memory.
	Backend Backend
	// BackendGroups are the groups Backend serves (default: all of Groups).
	BackendGroups []string
	// ReconcileInterval is how often Backend is compared with the API's
	// state and repaired, e.g. after a restart lost its servers (default
	// DefaultReconcileInterval; negative: only when GET /state reads it).
	ReconcileInterval time.Duration
}

func (o Options) withDefaults() Options {
	if len(o.Groups) == 0 {
		o.Groups = []Group{{Name: DefaultGroup}}
	}
	if o.WorkerInterval == 0 {
		o.WorkerInterval = DefaultWorkerInterval
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Clock == nil {
		o.Clock = func() int64 { return time.Now().UnixNano() }
	}
	if o.Backend != nil && len(o.BackendGroups) == 0 {
		for _, g := range o.Groups {
			o.BackendGroups = append(o.BackendGroups, g.Name)
		}
	}
	if o.ReconcileInterval == 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, g := range o.Groups {
		switch {
		case g.Name == "":
			errs = append(errs, fmt.Errorf("groups[%d]: name is empty", i))
		case seen[g.Name]:
			errs = append(errs, fmt.Errorf("groups[%d]: %q is listed twice", i, g.Name))
		}
		seen[g.Name] = true
	}
	for i, k := range o.AuthKeys {
		if k == "" {
			errs = append(errs, fmt.Errorf("auth keys[%d] is empty", i))
		}
	}
	if o.WorkerInterval < 0 {
		errs = append(errs, fmt.Errorf("worker interval must not be negative (got %s)", o.WorkerInterval))
	}
	for _, g := range o.BackendGroups {
		if !seen[g] {
			errs = append(errs, fmt.Errorf("backend group %q is not one of the groups", g))
		}
	}
	if o.Backend == nil && len(o.BackendGroups) > 0 {
		errs = append(errs, errors.New("backend groups are set but there is no backend"))
	}
	return errors.Join(errs...)
}

// Server is the reference LB API. It is an http.Handler and safe for
// concurrent use.
type Server struct {
	opts   Options
	log    hclog.Logger
	faults *injector

	mu       sync.Mutex // guards st
	st       *store
	authKeys [][]byte

	// agent runs Options.Backend's calls (nil without a backend).
	agent *agent

	paused   atomic.Bool
	stop     chan struct{}
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool
	httpSrv  *http.Server
	baseURL  string
	listener net.Listener

	connMu sync.Mutex
	fresh  map[net.Conn]bool // connections that have not sent a request yet
}

// NewServer validates opts and returns a Server whose worker is running
// (unless opts.ManualWorker).
func NewServer(opts Options) (*Server, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("lbapi options: %w", err)
	}
	s := &Server{
		opts:   opts,
		log:    opts.Logger.Named("lbapi"),
		faults: newInjector(faultSeed),
		st:     newStore(opts.Clock),
		stop:   make(chan struct{}),
	}
	for _, k := range opts.AuthKeys {
		s.authKeys = append(s.authKeys, []byte(k))
	}
	for _, g := range opts.Groups {
		s.st.groups[g.Name] = &groupState{agents: 1, domains: slices.Clone(g.Domains)}
	}
	if opts.Backend != nil {
		s.agent = newAgent(opts.Backend, opts.BackendGroups, opts.ReconcileInterval, s.log.Named("backend"))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.agent.run(s.stop)
		}()
	}
	if !opts.ManualWorker {
		s.wg.Add(1)
		go s.runWorker()
	}
	return s, nil
}

// runWorker ticks the worker until Close.
func (s *Server) runWorker() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.WorkerInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if !s.paused.Load() {
				s.tick()
			}
		}
	}
}

// Step runs the worker once, synchronously.
func (s *Server) Step() { s.tick() }

// Pause stops the background worker from advancing requests until Resume.
func (s *Server) Pause() { s.paused.Store(true) }

// Resume undoes Pause.
func (s *Server) Resume() { s.paused.Store(false) }

// RequestURL returns the request collection URL under baseURL (scheme and
// host, e.g. an httptest.Server's URL): what a client's uri should be.
func (s *Server) RequestURL(baseURL string) string {
	return strings.TrimRight(baseURL, "/") + BasePath + "/request"
}

// Start listens on addr (":0" picks a free port) and serves in the
// background. It returns the base URL, e.g. "http://127.0.0.1:41234".
func (s *Server) Start(addr string) (string, error) {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return "", errors.New("lbapi: server is closed")
	}
	if s.httpSrv != nil {
		return "", errors.New("lbapi: server already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("lbapi: listen %s: %w", addr, err)
	}
	s.listener = ln
	s.fresh = map[net.Conn]bool{}
	s.httpSrv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ConnState: s.trackConn}
	s.baseURL = "http://" + ln.Addr().String()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve failed", "error", err)
		}
	}()
	s.log.Info("listening", "url", s.RequestURL(s.baseURL))
	return s.baseURL, nil
}

// trackConn remembers connections that have not sent a request yet.
// http.Server.Shutdown counts those as busy for 5s, and Go clients open such
// connections when racing dials.
func (s *Server) trackConn(c net.Conn, state http.ConnState) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if state == http.StateNew {
		s.fresh[c] = true
	} else {
		delete(s.fresh, c)
	}
}

// closeFreshConns closes the connections that never sent a request.
func (s *Server) closeFreshConns() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for c := range s.fresh {
		_ = c.Close()
		delete(s.fresh, c)
	}
}

// Close stops the worker and, if Start was called, shuts the HTTP server
// down gracefully: requests in progress get up to 5s to finish, then the
// remaining connections are closed. It is idempotent.
func (s *Server) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	srv := s.httpSrv
	s.closeMu.Unlock()

	var err error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.SetKeepAlivesEnabled(false)
		s.closeFreshConns()
		if shutErr := srv.Shutdown(ctx); shutErr != nil {
			_ = srv.Close()
			err = fmt.Errorf("lbapi: shutdown: %w", shutErr)
		}
	}
	s.wg.Wait()
	return err
}

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.faults.set(f)
	return nil
}

// SetAgents sets the number of agents of a group; 0 makes every request
// for it end FAILED "not enough agents".
func (s *Server) SetAgents(group string, n int) error {
	return s.withGroup(group, func(g *groupState) error {
		if n < 0 {
			return fmt.Errorf("lbapi: agents must not be negative (got %d)", n)
		}
		g.agents = n
		return nil
	})
}

// SetApplyFailure makes the agents of a group fail (HTTP 500) every APPLY,
// so requests are reverted and end FAILED, until called with false.
func (s *Server) SetApplyFailure(group string, fail bool) error {
	return s.withGroup(group, func(g *groupState) error {
		g.failApply = fail
		return nil
	})
}

func (s *Server) withGroup(name string, f func(*groupState) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.st.groups[name]
	if !ok {
		return fmt.Errorf("lbapi: no group %q", name)
	}
	return f(g)
}

// Upstreams returns the upstreams ("host:port") registered for a service,
// or nil if the service does not exist.
func (s *Server) Upstreams(serviceID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.upstreamStrings(serviceID)
}

// RequestState returns the public state of a request (active or in
// history), and whether it is known.
func (s *Server) RequestState(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp, ok := s.st.getResponse(id)
	return resp.LoadBalancerState, ok
}

// authorized is BaragonAuthFilter: the authkey query parameter must be one
// of the keys, when any are configured.
func (s *Server) authorized(r *http.Request) bool {
	if len(s.authKeys) == 0 {
		return true
	}
	got := []byte(r.URL.Query().Get("authkey"))
	ok := false
	for _, k := range s.authKeys {
		if subtle.ConstantTimeCompare(got, k) == 1 {
			ok = true
		}
	}
	return ok
}
