package harness

// A real HAProxy behind the reference LB API, and a client loop that sees
// what a user of the load balancer sees. HAProxy runs through
// examples/lbapi/haproxy/haproxytest: a missing haproxy fails the test (make
// test installs it) unless SINGLETON_E2E_NO_HAPROXY=1.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// HAProxyLB is an LB API server (StartLB) whose groups are served by a real
// HAProxy with one backend per service.
type HAProxyLB struct {
	*LB
	// HAProxy is the running HAProxy: its frontend URL, admin client,
	// Restart.
	HAProxy *haproxytest.Instance
	// Backend is the LB API's HAProxy backend.
	Backend *lbapi.HAProxyBackend
}

// StartHAProxyLB starts HAProxy with a backend for each of services (each
// routed by its base path; the first is also the default backend, so "/"
// reaches it) and an LB API driving it, with opts (Backend is set here).
// HAProxy is forked from the harness's pinned thread with Pdeathsig, so it
// dies with the test binary; cleanup stops the LB API, then HAProxy.
func StartHAProxyLB(t testing.TB, opts lbapi.Options, services ...haproxy.Service) *HAProxyLB {
	t.Helper()
	h := haproxytest.Start(t, haproxytest.Options{
		Services:    services,
		Spawn:       proctest.StartPinned,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	be, err := lbapi.NewHAProxyBackend(lbapi.HAProxyOptions{Socket: h.Config.Socket})
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	opts.Backend = be
	if opts.Logger == nil {
		// Its Info lines (every change, every reconcile) explain a failure.
		opts.Logger = NewLogger(t, "e2e")
		opts.Logger.SetLevel(hclog.Info)
	}
	return &HAProxyLB{LB: StartLB(t, opts), HAProxy: h, Backend: be}
}

// Servers lists the service's ready HAProxy server slots as "ip:port": what
// it serves (the other slots are its free pool, in maintenance).
func (l *HAProxyLB) Servers(t testing.TB, serviceID string) (ready []string) {
	t.Helper()
	for _, s := range l.HAProxy.Servers(t, l.Backend.BackendFor(serviceID)) {
		if s.Ready() {
			ready = append(ready, s.Address())
		}
	}
	return ready
}

// ProbeResult is one request of a Probe.
type ProbeResult struct {
	Start, End time.Time
	// Status is the HTTP status (0 when the request failed in transport).
	Status int
	// Body is the answer, trimmed.
	Body string
	Err  error
}

// OK reports a 200 answer.
func (r ProbeResult) OK() bool { return r.Err == nil && r.Status == http.StatusOK }

// ProbeOptions bound a Probe.
type ProbeOptions struct {
	// Interval is the time from one request's start to the next (default
	// 5ms): the resolution of the gaps Probe measures.
	Interval time.Duration
	// Max bounds the number of requests (default 5000).
	Max int
	// Until ends the loop early once it returns true for the results so far.
	Until func([]ProbeResult) bool
	// Timeout bounds each request (default 2s).
	Timeout time.Duration
}

// Probe is a client loop: it GETs url every Interval, one request at a
// time, until Max requests, Until, or ctx ends, and returns every result.
// Keep-alive is on, as for a typical client. url must be on loopback.
func Probe(ctx context.Context, url string, o ProbeOptions) []ProbeResult {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Millisecond
	}
	if o.Max <= 0 {
		o.Max = 5000
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		panic("harness: Probe is for loopback URLs only, got " + url)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: o.Timeout}
	var out []ProbeResult
	next := time.Now()
	for len(out) < o.Max && ctx.Err() == nil {
		if o.Until != nil && o.Until(out) {
			break
		}
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return out
			case <-time.After(d):
			}
		}
		next = time.Now().Add(o.Interval)
		r := ProbeResult{Start: time.Now()}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			panic(err)
		}
		resp, err := c.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			r.Status, r.Body, r.Err = resp.StatusCode, strings.TrimSpace(string(b)), rerr
		} else {
			r.Err = err
		}
		r.End = time.Now()
		if errors.Is(r.Err, context.Canceled) && ctx.Err() != nil {
			break
		}
		out = append(out, r)
	}
	return out
}

// ProbeSummary is what a client saw over a Probe.
type ProbeSummary struct {
	Requests, Failed int
	// LongestGap is the longest time from the end of a successful answer to
	// the start of the next successful one, over stretches that had failed
	// requests in between: how long the client found no backend (an upper
	// bound, to within the probe interval). 0 when nothing failed between
	// two successes.
	LongestGap time.Duration
	// Answers are the distinct successful bodies in the order they first
	// appeared, and Switches counts changes from one body to another
	// between consecutive successes.
	Answers  []string
	Switches int
	// FirstFail describes the first failure ("" if none).
	FirstFail string
}

// Summarize reduces probe results.
func Summarize(rs []ProbeResult) ProbeSummary {
	s := ProbeSummary{Requests: len(rs)}
	var last *ProbeResult
	failedSince := false
	for i := range rs {
		r := &rs[i]
		if !r.OK() {
			s.Failed++
			failedSince = true
			if s.FirstFail == "" {
				s.FirstFail = fmt.Sprintf("HTTP %d %q %v", r.Status, r.Body, r.Err)
			}
			continue
		}
		if last != nil {
			if failedSince {
				s.LongestGap = max(s.LongestGap, r.Start.Sub(last.End))
			}
			if r.Body != last.Body {
				s.Switches++
			}
		}
		if len(s.Answers) == 0 || !containsString(s.Answers, r.Body) {
			s.Answers = append(s.Answers, r.Body)
		}
		last, failedSince = r, false
	}
	return s
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
