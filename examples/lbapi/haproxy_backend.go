package lbapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
)

// DefaultDrainTimeout is how long a change waits for the streams of a
// server it took out of rotation to end.
const DefaultDrainTimeout = 2 * time.Second

// HAProxyOptions configure an HAProxyBackend.
type HAProxyOptions struct {
	// Socket is HAProxy's admin stats socket (`stats socket <path> level
	// admin`).
	Socket string
	// Backends maps a serviceId to its HAProxy backend; a service not listed
	// uses haproxy.Name(serviceId). The backend must exist in HAProxy's
	// configuration with its server slots (see haproxy.Config).
	Backends map[string]string
	// DrainTimeout is how long a change waits for the streams of the
	// servers it took out of rotation to end, so that a REMOVE succeeds
	// once the requests in flight got their answers (default
	// DefaultDrainTimeout). Streams still running then are left to finish.
	DrainTimeout time.Duration
}

// HAProxyBackend is a Backend that drives a running HAProxy through its
// Runtime API. Each service's backend has a fixed pool of server slots
// (haproxy.Config writes them with `server-template`); an upstream is a
// slot pointed at its address (`set server … addr`) and made ready, and
// removing it puts the slot in maintenance, where its streams run to their
// end. A slot is pointed elsewhere only once no stream refers to it, and no
// server is ever added or deleted at run time: HAProxy 2.6 can crash when
// `del server` removes a server a stream still refers to (one retrying or
// being redispatched, say), which a failover under traffic does. Every
// change is read back with `show servers state`.
type HAProxyBackend struct {
	opts   HAProxyOptions
	client *haproxy.Client

	mu    sync.Mutex
	known map[string]map[string]slot // backend → slot name → what it serves
}

// slot is a server slot this backend pointed at an upstream.
type slot struct {
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
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &HAProxyBackend{
		opts:   opts,
		client: &haproxy.Client{Socket: opts.Socket},
		known:  map[string]map[string]slot{},
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

// Sync makes the service's backend serve exactly want: a slot already
// serving an upstream keeps it; a missing upstream gets a free slot (in
// maintenance, no stream), pointed at it and made ready; only then are the
// other ready slots put in maintenance, so that swapping one upstream for
// another never leaves the backend empty. It waits up to DrainTimeout for
// their streams to end, then reads the backend back and fails unless
// exactly want is ready.
func (h *HAProxyBackend) Sync(ctx context.Context, serviceID string, want []Target) error {
	be := h.BackendFor(serviceID)
	desired := map[Target]string{} // target → resolved ip:port
	for _, t := range want {
		addr, err := h.resolve(ctx, t.Upstream)
		if err != nil {
			return fmt.Errorf("upstream %s: %w", t.Upstream, err)
		}
		desired[t] = addr
	}
	states, err := h.client.ServersState(ctx, be)
	if err != nil {
		return fmt.Errorf("backend %s: %w", be, err)
	}
	if len(states) == 0 {
		return fmt.Errorf("backend %s has no server slots: give it `%s` (haproxy.BackendLines)", be,
			strings.TrimSpace(strings.Split(haproxy.BackendLines(haproxy.DefaultSlots), "\n")[1]))
	}
	loads, err := h.client.Loads(ctx, be)
	if err != nil {
		return fmt.Errorf("backend %s: %w", be, err)
	}
	served := h.match(be, states, desired)
	for _, t := range sortedTargets(desired) {
		if _, ok := served[t]; ok {
			continue
		}
		name, err := h.fill(ctx, be, states, loads, served, t, desired[t])
		if err != nil {
			return err
		}
		served[t] = name
	}
	inUse := map[string]bool{}
	for _, name := range served {
		inUse[name] = true
	}
	var removed []string
	for _, s := range states {
		if s.Ready() && !inUse[s.Name] {
			if err := h.client.SetMaint(ctx, be, s.Name); err != nil {
				return err
			}
			removed = append(removed, s.Name)
		}
		if !inUse[s.Name] {
			h.forget(be, s.Name)
		}
	}
	h.drain(ctx, be, removed)
	return h.check(ctx, be, desired)
}

// match finds the ready slots that already serve a desired target: those
// this backend pointed at it, then (after the LB API restarted, say) any
// ready slot at its address.
func (h *HAProxyBackend) match(be string, states []haproxy.ServerState, desired map[Target]string) map[Target]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	served := map[Target]string{}
	taken := map[string]bool{}
	for _, s := range states {
		k, ok := h.known[be][s.Name]
		if addr, want := desired[k.target]; ok && want && s.Ready() && k.addr == s.Address() && addr == k.addr && served[k.target] == "" {
			served[k.target], taken[s.Name] = s.Name, true
		}
	}
	for _, t := range sortedTargets(desired) {
		if served[t] != "" {
			continue
		}
		for _, s := range states {
			if s.Ready() && !taken[s.Name] && s.Address() == desired[t] {
				served[t], taken[s.Name] = s.Name, true
				h.rememberLocked(be, s.Name, slot{target: t, addr: desired[t]})
				break
			}
		}
	}
	return served
}

// fill points a free slot (not ready, no stream) at addr and makes it
// ready.
func (h *HAProxyBackend) fill(ctx context.Context, be string, states []haproxy.ServerState, loads map[string]haproxy.Load,
	served map[Target]string, t Target, addr string) (string, error) {
	taken := map[string]bool{}
	for _, name := range served {
		taken[name] = true
	}
	for _, s := range states {
		l, ok := loads[s.Name]
		if s.Ready() || taken[s.Name] || !ok || !l.Idle() {
			continue
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", err
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return "", fmt.Errorf("upstream %s: port %q: %w", t.Upstream, port, err)
		}
		if err := h.client.SetAddr(ctx, be, s.Name, host, p); err != nil {
			return "", err
		}
		if err := h.client.SetReady(ctx, be, s.Name); err != nil {
			return "", err
		}
		h.mu.Lock()
		h.rememberLocked(be, s.Name, slot{target: t, addr: addr})
		h.mu.Unlock()
		return s.Name, nil
	}
	return "", fmt.Errorf("backend %s: no free server slot for %s: all %d are serving or still have streams (give it more slots)", be, t.Upstream, len(states))
}

// drain waits up to DrainTimeout until no stream refers to the slots
// named; what still runs then is left to finish, and the slots are not
// reused until it has.
func (h *HAProxyBackend) drain(ctx context.Context, be string, names []string) {
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.DrainTimeout)
	defer cancel()
	for {
		loads, err := h.client.Loads(ctx, be)
		if err == nil && !slices.ContainsFunc(names, func(n string) bool { return !loads[n].Idle() }) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// check reads the backend back: exactly the desired addresses are ready.
func (h *HAProxyBackend) check(ctx context.Context, be string, desired map[Target]string) error {
	after, err := h.client.ServersState(ctx, be)
	if err != nil {
		return fmt.Errorf("backend %s: read back: %w", be, err)
	}
	want := map[string]int{}
	for _, addr := range desired {
		want[addr]++
	}
	var problems []string
	for _, s := range after {
		if !s.Ready() {
			continue
		}
		if want[s.Address()] == 0 {
			problems = append(problems, fmt.Sprintf("unexpected ready server %s (%s)", s.Name, s.Address()))
			continue
		}
		want[s.Address()]--
	}
	for _, addr := range slices.Sorted(maps.Keys(want)) {
		if want[addr] > 0 {
			problems = append(problems, "no ready server at "+addr)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("backend %s after the change: %s", be, strings.Join(problems, "; "))
	}
	return nil
}

// Serving reads the service's backend: its ready slots, as the upstream
// this backend pointed them at, or with an empty Group if it did not (or
// the address changed under it).
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
		if !s.Ready() {
			continue
		}
		if k, ok := h.known[be][s.Name]; ok && k.addr == s.Address() {
			out = append(out, k.target)
		} else {
			out = append(out, Target{Upstream: s.Address()})
		}
	}
	return out, nil
}

func (h *HAProxyBackend) rememberLocked(be, name string, s slot) {
	if h.known[be] == nil {
		h.known[be] = map[string]slot{}
	}
	h.known[be][name] = s
}

func (h *HAProxyBackend) forget(be, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.known[be], name)
}

func sortedTargets(m map[Target]string) []Target {
	ts := slices.Collect(maps.Keys(m))
	sortTargets(ts)
	return ts
}

// resolve turns host:port into ip:port: HAProxy servers take addresses only.
func (h *HAProxyBackend) resolve(ctx context.Context, upstream string) (string, error) {
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil {
		return net.JoinHostPort(ip.String(), port), nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
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
