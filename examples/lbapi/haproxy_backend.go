package lbapi

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
)

// DefaultDrainTimeout is how long a removed HAProxy server may keep
// connections before they are shut.
const DefaultDrainTimeout = 2 * time.Second

// HAProxyOptions configure an HAProxyBackend.
type HAProxyOptions struct {
	// Socket is HAProxy's admin stats socket (`stats socket <path> level
	// admin`).
	Socket string
	// Backends maps a serviceId to its HAProxy backend; a service not listed
	// uses haproxy.Name(serviceId). The backend must exist in HAProxy's
	// configuration (see haproxy.Config).
	Backends map[string]string
	// Timeout bounds each Runtime API command (default haproxy.DefaultTimeout).
	Timeout time.Duration
	// DrainTimeout is how long a removed server (already out of the
	// load-balancing rotation) may keep connections before they are shut
	// (default DefaultDrainTimeout).
	DrainTimeout time.Duration
	// Resolver resolves upstreams given by host name (default
	// net.DefaultResolver): HAProxy's dynamic servers take addresses only.
	Resolver *net.Resolver
}

// HAProxyBackend is a Backend that drives a running HAProxy through its
// Runtime API: each upstream is a dynamic server (`add server`, `enable`,
// `set … state maint`, `del server`) in the service's backend, and every
// change is read back with `show servers state`.
type HAProxyBackend struct {
	opts   HAProxyOptions
	client *haproxy.Client

	mu    sync.Mutex
	known map[string]map[string]server // backend → server name → what it stands for
}

// server is a server this backend created.
type server struct {
	target Target
	addr   string // resolved ip:port
}

// NewHAProxyBackend checks opts; it does not contact HAProxy.
func NewHAProxyBackend(opts HAProxyOptions) (*HAProxyBackend, error) {
	var errs []error
	if opts.Socket == "" {
		errs = append(errs, errors.New("haproxy: socket path is empty"))
	}
	for svc, be := range opts.Backends {
		if be == "" || haproxy.Name(be) != be {
			errs = append(errs, fmt.Errorf("haproxy: backend %q of service %q is not a valid HAProxy name", be, svc))
		}
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &HAProxyBackend{
		opts:   opts,
		client: &haproxy.Client{Socket: opts.Socket, Timeout: opts.Timeout},
		known:  map[string]map[string]server{},
	}, nil
}

// Name is the socket as a URL.
func (h *HAProxyBackend) Name() string { return "unix://" + h.opts.Socket }

// Version asks HAProxy for its version, to check that the socket answers.
func (h *HAProxyBackend) Version(ctx context.Context) (string, error) {
	info, err := h.client.Info(ctx)
	if err != nil {
		return "", err
	}
	return info["Version"], nil
}

// BackendFor returns the HAProxy backend of a service.
func (h *HAProxyBackend) BackendFor(serviceID string) string {
	if be, ok := h.opts.Backends[serviceID]; ok {
		return be
	}
	return haproxy.Name(serviceID)
}

// ServerName is the HAProxy server name of an upstream: the upstream itself
// when HAProxy accepts it as a name (e.g. "127.0.0.1:31005"), sanitised
// otherwise; a group other than "default" adds a hash, since (upstream,
// group) is what identifies an upstream.
func ServerName(t Target) string {
	name := haproxy.Name(t.Upstream)
	if t.Group != defaultGroup {
		h := fnv.New32a()
		_, _ = h.Write([]byte(t.Upstream + "|" + t.Group))
		name = fmt.Sprintf("%s-%08x", name, h.Sum32())
	}
	return name
}

// Sync makes the service's backend hold exactly want, each server ready:
// new servers are added and enabled first, then the others are taken out of
// rotation, drained (up to DrainTimeout) and deleted, so that swapping one
// upstream for another never leaves the backend empty. It then reads the
// backend back and fails unless it holds exactly want.
func (h *HAProxyBackend) Sync(ctx context.Context, serviceID string, want []Target) error {
	be := h.BackendFor(serviceID)
	desired := map[string]server{}
	for _, t := range want {
		addr, err := h.resolve(ctx, t.Upstream)
		if err != nil {
			return fmt.Errorf("upstream %s: %w", t.Upstream, err)
		}
		desired[ServerName(t)] = server{target: t, addr: addr}
	}
	cur, err := h.client.ServersState(ctx, be)
	if err != nil {
		return fmt.Errorf("backend %s: %w", be, err)
	}
	byName := map[string]haproxy.ServerState{}
	for _, s := range cur {
		byName[s.Name] = s
	}
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		d := desired[name]
		s, ok := byName[name]
		if ok && s.Address() != d.addr {
			if err := h.remove(ctx, be, name); err != nil {
				return err
			}
			ok = false
		}
		if !ok {
			if err := h.client.AddServer(ctx, be, name, d.addr); err != nil {
				return err
			}
		}
		if !ok || !s.Ready() {
			if err := h.client.EnableServer(ctx, be, name); err != nil {
				return err
			}
		}
		h.remember(be, name, d)
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		if _, ok := desired[name]; !ok {
			if err := h.remove(ctx, be, name); err != nil {
				return err
			}
		}
	}
	// A request succeeds only once HAProxy reports the change.
	after, err := h.client.ServersState(ctx, be)
	if err != nil {
		return fmt.Errorf("backend %s: read back: %w", be, err)
	}
	var problems []string
	seen := map[string]bool{}
	for _, s := range after {
		seen[s.Name] = true
		d, ok := desired[s.Name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("unexpected server %s (%s)", s.Name, s.Address()))
		case s.Address() != d.addr:
			problems = append(problems, fmt.Sprintf("server %s at %s, want %s", s.Name, s.Address(), d.addr))
		case !s.Ready():
			problems = append(problems, fmt.Sprintf("server %s not ready (op state %d, admin state %#x)", s.Name, s.OpState, s.AdminState))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		if !seen[name] {
			problems = append(problems, "server "+name+" missing")
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("backend %s after the change: %s", be, strings.Join(problems, "; "))
	}
	return nil
}

// Serving reads the service's backend: servers this backend created, at
// their address and ready, as their upstream; anything else with an empty
// Group.
func (h *HAProxyBackend) Serving(ctx context.Context, serviceID string) ([]Target, error) {
	be := h.BackendFor(serviceID)
	states, err := h.client.ServersState(ctx, be)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", be, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Target
	for _, s := range states {
		if k, ok := h.known[be][s.Name]; ok && k.addr == s.Address() && s.Ready() {
			out = append(out, k.target)
		} else {
			out = append(out, Target{Upstream: s.Address()})
		}
	}
	return out, nil
}

func (h *HAProxyBackend) remember(be, name string, s server) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.known[be] == nil {
		h.known[be] = map[string]server{}
	}
	h.known[be][name] = s
}

// remove takes a server out of rotation, waits up to DrainTimeout for its
// connections to end, shuts what is left, and deletes it.
func (h *HAProxyBackend) remove(ctx context.Context, be, name string) error {
	if err := h.client.SetMaint(ctx, be, name); err != nil {
		if isNoSuchServer(err) {
			return nil
		}
		return err
	}
	del := func(within time.Duration) error {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 20*time.Millisecond, 200*time.Millisecond, within
		return backoff.Retry(func() error {
			err := h.client.DelServer(ctx, be, name)
			switch {
			case err == nil, isNoSuchServer(err):
				return nil
			case isBusy(err):
				return err
			}
			return backoff.Permanent(err)
		}, backoff.WithContext(b, ctx))
	}
	err := del(h.opts.DrainTimeout)
	if err != nil && isBusy(err) {
		if serr := h.client.ShutdownSessions(ctx, be, name); serr != nil && !isNoSuchServer(serr) {
			return serr
		}
		err = del(time.Second)
	}
	if err != nil {
		return err
	}
	h.mu.Lock()
	delete(h.known[be], name)
	h.mu.Unlock()
	return nil
}

// resolve turns host:port into ip:port.
func (h *HAProxyBackend) resolve(ctx context.Context, upstream string) (string, error) {
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil {
		return net.JoinHostPort(ip.String(), port), nil
	}
	ips, err := h.opts.Resolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return "", err
	}
	// Prefer IPv4, as Nomad's host addresses usually are.
	slices.SortStableFunc(ips, func(a, b net.IP) int {
		a4, b4 := a.To4() != nil, b.To4() != nil
		switch {
		case a4 && !b4:
			return -1
		case b4 && !a4:
			return 1
		}
		return 0
	})
	return net.JoinHostPort(ips[0].String(), port), nil
}

func isNoSuchServer(err error) bool {
	var ce *haproxy.CommandError
	return errors.As(err, &ce) && strings.Contains(ce.Answer, "No such server")
}

// isBusy: HAProxy refused to delete a server that still has connections or
// queued streams.
func isBusy(err error) bool {
	var ce *haproxy.CommandError
	if !errors.As(err, &ce) {
		return false
	}
	a := strings.ToLower(ce.Answer)
	return strings.Contains(a, "connection") || strings.Contains(a, "stream") || strings.Contains(a, "queue")
}
