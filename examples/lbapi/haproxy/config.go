package haproxy

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strings"
)

// Name turns s into a valid HAProxy proxy or server name: letters, digits,
// '-', '_', '.' and ':' are kept, anything else becomes '_'. When that loses
// information, an 8-hex-digit hash of s is appended so that distinct inputs
// keep distinct names.
func Name(s string) string {
	var b strings.Builder
	lossy := s == ""
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.', r == ':':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
			lossy = true
		}
	}
	if lossy {
		h := fnv.New32a()
		_, _ = h.Write([]byte(s))
		fmt.Fprintf(&b, "-%08x", h.Sum32())
	}
	return b.String()
}

// Service is one LB service's backend and the path prefix that routes to it.
type Service struct {
	// Backend is the backend name, e.g. Name(serviceID).
	Backend string
	// PathPrefix routes requests whose path starts with it (the service's
	// base path); "" or "/" routes nothing by path (see Config.Default).
	PathPrefix string
}

// DefaultSlots is how many server slots a backend gets when Config.Slots
// is 0: a singleton needs two at a swap, and a slot left in maintenance with
// streams still finishing is not reused until they end.
const DefaultSlots = 8

// SlotPrefix names a backend's server slots: slot1, slot2, …
const SlotPrefix = "slot"

// Config is the configuration the LB API needs from HAProxy: the admin
// socket, one HTTP frontend, and a backend per service with a fixed pool of
// server slots in maintenance, which the LB API points at upstreams at run
// time (`set server … addr`, `state ready|maint`). No server is ever added
// or deleted at run time: HAProxy 2.6 can crash deleting a server that a
// stream still refers to.
type Config struct {
	// Socket is the admin stats socket path.
	Socket string
	// Bind is the frontend's address, host:port.
	Bind string
	// Services get one backend each.
	Services []Service
	// Default is the backend of requests no prefix matches ("" for the
	// first service's).
	Default string
	// Slots is the number of server slots per backend (default
	// DefaultSlots).
	Slots int
}

// Render returns the configuration text.
func (c Config) Render() (string, error) {
	var errs []error
	if c.Socket == "" || strings.ContainsAny(c.Socket, " \t\n") {
		errs = append(errs, fmt.Errorf("socket path %q is empty or has a space", c.Socket))
	}
	if _, _, err := net.SplitHostPort(c.Bind); err != nil {
		errs = append(errs, fmt.Errorf("bind %q: %w", c.Bind, err))
	}
	if len(c.Services) == 0 {
		errs = append(errs, errors.New("no service"))
	}
	seen := map[string]bool{}
	for _, s := range c.Services {
		if s.Backend == "" || Name(s.Backend) != s.Backend {
			errs = append(errs, fmt.Errorf("backend name %q is not a valid HAProxy name (use Name)", s.Backend))
		}
		if seen[s.Backend] {
			errs = append(errs, fmt.Errorf("backend %q is listed twice", s.Backend))
		}
		seen[s.Backend] = true
		if strings.ContainsAny(s.PathPrefix, " \t\n{}") {
			errs = append(errs, fmt.Errorf("path prefix %q has a space or a brace", s.PathPrefix))
		}
	}
	if c.Slots < 0 || c.Slots > 1000 {
		errs = append(errs, fmt.Errorf("slots %d: want 1 to 1000 (0 for %d)", c.Slots, DefaultSlots))
	}
	slots := c.Slots
	if slots == 0 {
		slots = DefaultSlots
	}
	def := c.Default
	if def == "" && len(c.Services) > 0 {
		def = c.Services[0].Backend
	}
	if def != "" && !seen[def] {
		errs = append(errs, fmt.Errorf("default backend %q is not a service's", def))
	}
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("haproxy config: %w", err)
	}

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# Generated for the reference LB API (examples/lbapi): one frontend, one")
	w("# backend per LB service, each with a fixed pool of server slots that the")
	w("# LB API points at upstreams at run time through the admin socket.")
	w("global")
	w("    stats socket %s level admin mode 600", c.Socket)
	w("    stats timeout 10s")
	w("")
	for _, line := range strings.Split(Defaults, "\n") {
		w("%s", line)
	}
	w("")
	w("frontend lbapi")
	w("    bind %s", c.Bind)
	for _, s := range c.Services {
		if p := strings.TrimRight(s.PathPrefix, "/"); p != "" {
			w("    use_backend %s if { path %s } || { path_beg %s/ }", s.Backend, p, p)
		}
	}
	w("    default_backend %s", def)
	for _, s := range c.Services {
		w("")
		w("backend %s", s.Backend)
		w("%s", BackendLines(slots))
	}
	return b.String(), nil
}

// Defaults is the `defaults` section for a singleton behind HAProxy. The
// retries and redispatch carry a request through a crash: the connection to
// the dead holder is refused, HAProxy waits min(timeout connect, 1s) and
// retries on another server, by then usually the successor; only when no
// server is ready at all does a client get a 503 at once. The server
// timeout bounds how long a hung holder keeps a slot busy.
const Defaults = `defaults
    mode http
    option redispatch 1
    retries 3
    timeout connect 1s
    timeout queue 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 5s`

// BackendLines is the body of a service's backend with n server slots,
// all in maintenance until the LB API points one at an upstream.
func BackendLines(n int) string {
	// A dynamic algorithm, so that weights and states change at run time.
	return fmt.Sprintf("    balance roundrobin\n    server-template %s 1-%d 127.0.0.1:1 disabled", SlotPrefix, n)
}

// Write renders the configuration into the file at path.
func (c Config) Write(path string) error {
	text, err := c.Render()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("haproxy config: %w", err)
	}
	return nil
}
