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

// Config is the configuration the LB API needs from HAProxy: the admin
// socket, one HTTP frontend, and an empty backend per service (servers are
// added at run time).
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
	w("# backend per LB service. The LB API adds and removes the servers at run")
	w("# time through the admin socket.")
	w("global")
	w("    stats socket %s level admin mode 600", c.Socket)
	w("    stats timeout 10s")
	w("")
	w("defaults")
	w("    mode http")
	w("    timeout connect 1s")
	w("    timeout client 30s")
	w("    timeout server 30s")
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
		// Dynamic servers need a dynamic algorithm.
		w("    balance roundrobin")
	}
	return b.String(), nil
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
