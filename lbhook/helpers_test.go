package lbhook

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// testKey has characters that URL-escaping changes, so that redaction is
// tested on both forms.
const testKey = "s3cr3t+key/=="

// call is one HTTP request seen by a scripted front.
type call struct {
	method string
	path   string
	query  url.Values
	body   string
}

// action handles a request in place of the LB API; it returns false to let
// the request through.
type action func(w http.ResponseWriter, r *http.Request) bool

// front records every request and runs scripted actions before the real LB
// API: rules[method][n] applies to the n-th request (1-based) of that method,
// rules[method][0] to every request of that method.
type front struct {
	mu    sync.Mutex
	next  http.Handler
	calls []call
	count map[string]int
	rules map[string]map[int]action
}

func newFront(next http.Handler) *front {
	return &front{next: next, count: map[string]int{}, rules: map[string]map[int]action{}}
}

// on scripts the n-th request of method (0: every one).
func (f *front) on(method string, n int, a action) *front {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules[method] == nil {
		f.rules[method] = map[int]action{}
	}
	f.rules[method][n] = a
	return f
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.mu.Lock()
	f.calls = append(f.calls, call{r.Method, r.URL.Path, r.URL.Query(), string(body)})
	f.count[r.Method]++
	n := f.count[r.Method]
	every, nth := f.rules[r.Method][0], f.rules[r.Method][n]
	f.mu.Unlock()
	for _, a := range []action{nth, every} {
		if a != nil && a(w, r) {
			return
		}
	}
	if f.next == nil {
		http.NotFound(w, r)
		return
	}
	f.next.ServeHTTP(w, r)
}

// seen returns "METHOD last-path-segment" for every call.
func (f *front) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.method+" "+c.path[strings.LastIndex(c.path, "/")+1:])
	}
	return out
}

func (f *front) callList() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call{}, f.calls...)
}

func (f *front) countOf(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[method]
}

// Actions.

func answerStatus(status int, body string) action {
	return func(w http.ResponseWriter, _ *http.Request) bool {
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
		return true
	}
}

func dropConn() action {
	return func(w http.ResponseWriter, _ *http.Request) bool {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return true
	}
}

// truncatedBody promises 200 bytes and sends a few.
func truncatedBody() action {
	return func(w http.ResponseWriter, _ *http.Request) bool {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return true
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"loadBalancerState\":\"SUC")
		_ = buf.Flush()
		_ = conn.Close()
		return true
	}
}

// stall waits past the client's timeout, then lets the request through
// (the LB API still acts on it, as a slow server would).
func stall(d time.Duration) action {
	return func(_ http.ResponseWriter, r *http.Request) bool {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
		return false
	}
}

// forwardThenDrop lets the LB API act, then loses the answer.
func forwardThenDrop(next http.Handler) action {
	return func(w http.ResponseWriter, r *http.Request) bool {
		next.ServeHTTP(httptest.NewRecorder(), r)
		return dropConn()(w, r)
	}
}

// also runs f, then lets the request through.
func also(f func()) action {
	return func(http.ResponseWriter, *http.Request) bool {
		f()
		return false
	}
}

// lb is an lbapi server behind a scripted front.
type lb struct {
	srv   *lbapi.Server
	front *front
	ts    *httptest.Server
	uri   string
}

// newLB starts an lbapi server that requires testKey. A zero worker
// interval means a manual worker (driven by Step).
func newLB(t *testing.T, interval time.Duration, groups ...lbapi.Group) *lb {
	t.Helper()
	opts := lbapi.Options{AuthKeys: []string{testKey}, Groups: groups, WorkerInterval: interval, ManualWorker: interval == 0}
	srv, err := lbapi.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	f := newFront(srv)
	ts := httptest.NewServer(f)
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
	})
	return &lb{srv: srv, front: f, ts: ts, uri: srv.RequestURL(ts.URL)}
}

// step returns an action that runs the LB worker n times.
func (l *lb) step(n int) action {
	return also(func() {
		for range n {
			l.srv.Step()
		}
	})
}

// testConfig is a fast configuration for uri.
func testConfig(uri string) Config {
	return Config{
		URI:            uri,
		ServiceID:      "web",
		BasePath:       "/web",
		Groups:         []string{"default"},
		PortLabel:      "http",
		Owners:         []string{"team@example.com"},
		RequestTimeout: 300 * time.Millisecond,
		PollInterval:   MinPollInterval,
		AddDeadline:    3 * time.Second,
		RemoveDeadline: 3 * time.Second,
	}
}

// newTestClient builds a client with testKey (from the environment) and a
// trace logger into logs.
func newTestClient(t *testing.T, cfg Config, logs *proctest.SyncBuffer) *Client {
	t.Helper()
	opts := ClientOptions{Getenv: func(k string) string {
		if k == DefaultAuthKeyEnv {
			return testKey
		}
		return ""
	}}
	if logs != nil {
		opts.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace})
	}
	c, err := NewClient(cfg, opts)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// refusedURI is a request collection URL on which nothing listens.
func refusedURI(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return fmt.Sprintf("http://%s/baragon/v2/request", addr)
}

// assertNoSecret fails if s shows the auth key in any form.
func assertNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, form := range []string{testKey, url.QueryEscape(testKey), url.PathEscape(testKey)} {
		if strings.Contains(s, form) {
			t.Errorf("%s shows the auth key (%q): %s", what, form, s)
		}
	}
}
