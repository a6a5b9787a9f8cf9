package shim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
)

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
