package lbapi

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults of Options.
const (
	// DefaultBasePath is Baragon's applicationContextPath in its docker config.
	DefaultBasePath = "/baragon/v2"
	// DefaultWorkerInterval is small so that tests run fast; Baragon's
	// worker runs every second (BaragonWorkerConfiguration.intervalMs).
	DefaultWorkerInterval = 50 * time.Millisecond
	// DefaultMaxRequestsPerPoll is BaragonWorkerConfiguration.maxRequestsPerPoll.
	DefaultMaxRequestsPerPoll = 10
	// DefaultMaxBatchSize is BaragonWorkerConfiguration.maxBatchSize.
	DefaultMaxBatchSize = 50
	// DefaultHistoryPerService is HistoryConfiguration.maxRequestsPerService.
	DefaultHistoryPerService = 1000
	// DefaultGroup is the group configured when Options.Groups is empty.
	DefaultGroup = "default"
)

// Group is a load balancer group and its simulated agents.
type Group struct {
	// Name is the group name (loadBalancerGroups entry).
	Name string
	// Agents is the number of simulated agents; values below 1 mean 1.
	// Server.SetAgents(name, 0) simulates a group with no agent.
	Agents int
	// Domains are the domains the group serves.
	Domains []string
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// BasePath is the application context path (default /baragon/v2).
	BasePath string
	// Groups are the existing load balancer groups (default: "default").
	Groups []Group
	// AuthKeys are the accepted auth keys; none disables auth, like
	// Baragon's auth.enabled=false.
	AuthKeys []string
	// WorkerInterval is the worker period (default 50ms; Baragon: 1s).
	WorkerInterval time.Duration
	// ManualWorker starts no background worker: only Step advances requests.
	ManualWorker bool
	// MaxRequestsPerPoll bounds the requests one worker run handles (default 10).
	MaxRequestsPerPoll int
	// MaxBatchSize bounds the agent requests one worker run sends (default 50).
	MaxBatchSize int
	// HistoryPerService bounds the finished responses kept per service
	// (default 1000); the oldest go first.
	HistoryPerService int
	// Faults are the faults injected from the start (see SetFaults).
	Faults Faults
	// Seed seeds the fault generator.
	Seed uint64
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
	// BackendTimeout bounds each change, reconcile or read of Backend
	// (default DefaultBackendTimeout).
	BackendTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.BasePath == "" {
		o.BasePath = DefaultBasePath
	}
	o.BasePath = "/" + strings.Trim(o.BasePath, "/")
	if o.BasePath == "/" {
		o.BasePath = ""
	}
	if len(o.Groups) == 0 {
		o.Groups = []Group{{Name: DefaultGroup}}
	}
	if o.WorkerInterval == 0 {
		o.WorkerInterval = DefaultWorkerInterval
	}
	if o.MaxRequestsPerPoll == 0 {
		o.MaxRequestsPerPoll = DefaultMaxRequestsPerPoll
	}
	if o.MaxBatchSize == 0 {
		o.MaxBatchSize = DefaultMaxBatchSize
	}
	if o.HistoryPerService == 0 {
		o.HistoryPerService = DefaultHistoryPerService
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
	if o.BackendTimeout <= 0 {
		o.BackendTimeout = DefaultBackendTimeout
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if strings.ContainsAny(o.BasePath, "?#") {
		errs = append(errs, fmt.Errorf("base path %q must be a plain path", o.BasePath))
	}
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
	for name, v := range map[string]int{
		"max requests per poll": o.MaxRequestsPerPoll, "max batch size": o.MaxBatchSize,
		"history per service": o.HistoryPerService,
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %d)", name, v))
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
	errs = append(errs, o.Faults.validate())
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
		faults: newInjector(opts.Faults, opts.Seed),
		st:     newStore(opts.HistoryPerService, opts.Clock),
		stop:   make(chan struct{}),
	}
	for _, k := range opts.AuthKeys {
		s.authKeys = append(s.authKeys, []byte(k))
	}
	for _, g := range opts.Groups {
		s.st.groups[g.Name] = &groupState{agents: max(g.Agents, 1), domains: slices.Clone(g.Domains)}
	}
	if opts.Backend != nil {
		s.agent = newAgent(opts.Backend, opts.BackendGroups, opts.ReconcileInterval, opts.BackendTimeout, s.log.Named("backend"))
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

// BasePath returns the application context path, e.g. "/baragon/v2".
func (s *Server) BasePath() string { return s.opts.BasePath }

// RequestURL returns the request collection URL under baseURL (scheme and
// host, e.g. an httptest.Server's URL): what a client's uri should be.
func (s *Server) RequestURL(baseURL string) string {
	return strings.TrimRight(baseURL, "/") + s.opts.BasePath + "/request"
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

// Faults returns the injected faults.
func (s *Server) Faults() Faults { return s.faults.get() }

// SetGroup adds or replaces a load balancer group.
func (s *Server) SetGroup(g Group) error {
	if g.Name == "" {
		return errors.New("lbapi: group name is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.groups[g.Name] = &groupState{agents: max(g.Agents, 1), domains: slices.Clone(g.Domains)}
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

// ReadAuthKeysFile reads auth keys, one per line; blank lines and lines
// starting with # are skipped.
func ReadAuthKeysFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth keys file: %w", err)
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth keys file %s: %w", path, err)
	}
	return keys, nil
}
