package lbapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
)

// Tests of the HAProxy backend against a real HAProxy (haproxytest): what a
// user of the LB API would see through HAProxy's frontend.

// haEnv is a manual-worker LB API whose group "default" is served by a
// real HAProxy with a backend for the service "web".
type haEnv struct {
	*testEnv
	h  *haproxytest.Instance
	be *HAProxyBackend
}

func newHAEnv(t *testing.T, edit func(*Options)) *haEnv {
	t.Helper()
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web", PathPrefix: "/"}}})
	be, err := NewHAProxyBackend(HAProxyOptions{Socket: h.Config.Socket})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Backend: be, ReconcileInterval: -1}
	if edit != nil {
		edit(&opts)
	}
	return &haEnv{testEnv: newEnv(t, opts), h: h, be: be}
}

// finish steps the worker until request id is final, and returns its
// response; before, each time the state changes, check sees the response.
func (e *haEnv) finish(id string, check func(wireResponse)) wireResponse {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.srv.Step()
		r := e.resp(e.get(id))
		if check != nil {
			check(r)
		}
		if r.State != stateWaiting && r.State != stateCanceling {
			return r
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s still %s after 10s: %s", id, r.State, r.Message)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// servers lists the web backend's servers as "address ready|not-ready".
func (e *haEnv) servers() []string {
	var out []string
	for _, s := range e.h.Servers(e.t, "web") {
		state := "ready"
		if !s.Ready() {
			state = fmt.Sprintf("not-ready(op %d admin %#x)", s.OpState, s.AdminState)
		}
		out = append(out, s.Address()+" "+state)
	}
	return out
}

// through GETs the HAProxy frontend: status and body.
func (e *haEnv) through() (int, string) {
	e.t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(e.h.URL + "/")
	if err != nil {
		e.t.Fatalf("GET through HAProxy: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stateUpstreams reads GET /state/web.
func (e *haEnv) stateUpstreams() (int, []string, string) {
	e.t.Helper()
	a := e.state("web")
	if a.status != http.StatusOK {
		return a.status, nil, a.body
	}
	var st struct {
		Upstreams []struct {
			Upstream string `json:"upstream"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(a.body), &st); err != nil {
		e.t.Fatalf("decode %s: %v", a.body, err)
	}
	var out []string
	for _, u := range st.Upstreams {
		out = append(out, u.Upstream)
	}
	return a.status, out, a.body
}

// namedUpstream is an HTTP server that answers its name.
func namedUpstream(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestHAProxyRequestsDriveHAProxy: an ADD reaches SUCCESS only when HAProxy
// already serves the upstream (checked at the first GET that says SUCCESS);
// a swap (add b, remove a) leaves exactly b; a REMOVE empties the backend.
// What the frontend answers follows each step.
func TestHAProxyRequestsDriveHAProxy(t *testing.T) {
	e := newHAEnv(t, nil)
	a, b := namedUpstream(t, "A"), namedUpstream(t, "B")

	steps := []struct {
		spec    reqSpec
		servers []string // HAProxy's servers at SUCCESS
		body    string   // the frontend's answer ("" for a 503)
	}{
		{reqSpec{id: "web-ADD-1", add: []string{a}}, []string{a + " ready"}, "A"},
		{reqSpec{id: "web-ADD-2", add: []string{b}, remove: []string{a}}, []string{b + " ready"}, "B"},
		{reqSpec{id: "web-REMOVE-2", remove: []string{b}}, nil, ""},
	}
	for _, s := range steps {
		e.resp(e.post(s.spec.json()))
		sawSuccess := false
		r := e.finish(s.spec.id, func(r wireResponse) {
			if r.State == stateSuccess && !sawSuccess {
				sawSuccess = true
				if got := e.servers(); !slices.Equal(got, s.servers) {
					t.Errorf("%s: SUCCESS while HAProxy has %q, want %q", s.spec.id, got, s.servers)
				}
			}
		})
		if r.State != stateSuccess {
			t.Fatalf("%s ended %s: %s", s.spec.id, r.State, r.Message)
		}
		apply := r.Agents[typeApply]
		if len(apply) != 1 || apply[0].URL != "unix://"+e.h.Config.Socket+"/request/"+s.spec.id || apply[0].StatusCode == nil || *apply[0].StatusCode != 200 {
			t.Errorf("%s: APPLY agent responses %+v, want one 200 from the HAProxy socket", s.spec.id, apply)
		}
		status, body := e.through()
		switch {
		case s.body == "" && status != http.StatusServiceUnavailable:
			t.Errorf("after %s: the frontend answers %d %q, want 503 (no server)", s.spec.id, status, body)
		case s.body != "" && (status != 200 || body != s.body):
			t.Errorf("after %s: the frontend answers %d %q, want 200 %q", s.spec.id, status, body, s.body)
		}
	}
}

// TestHAProxyRefusalFailsTheRequest: a change HAProxy refuses ends FAILED
// with HAProxy's own words in the message; nothing is committed and HAProxy
// keeps what it served.
func TestHAProxyRefusalFailsTheRequest(t *testing.T) {
	e := newHAEnv(t, func(o *Options) { o.Groups = []Group{{Name: "default"}, {Name: "other"}} })
	a := namedUpstream(t, "A")
	e.resp(e.post(reqSpec{id: "ok", add: []string{a}}.json()))
	if r := e.finish("ok", nil); r.State != stateSuccess {
		t.Fatalf("ok ended %s: %s", r.State, r.Message)
	}

	for _, tc := range []struct {
		name string
		spec reqSpec
		want []string // in the message
	}{
		{
			name: "invalid port",
			spec: reqSpec{id: "badport", add: []string{"127.0.0.1:99999"}},
			want: []string{"Apply failed", `haproxy refused "add server web/127.0.0.1:99999 127.0.0.1:99999": invalid port '99999'`, "REVERT OK"},
		},
		{
			name: "no backend for the service",
			spec: reqSpec{id: "nobackend", svc: "nobackend", add: []string{namedUpstream(t, "B")}},
			want: []string{"Apply failed", "Can't find backend."},
		},
	} {
		e.resp(e.post(tc.spec.json()))
		r := e.finish(tc.spec.id, nil)
		if r.State != stateFailed {
			t.Errorf("%s: ended %s, want FAILED: %s", tc.name, r.State, r.Message)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.Message, w) {
				t.Errorf("%s: message %q lacks %q", tc.name, r.Message, w)
			}
		}
		t.Logf("%s: %s %s", tc.name, r.State, r.Message)
	}
	if got := e.srv.Upstreams("web"); !slices.Equal(got, []string{a}) {
		t.Errorf("committed upstreams %q, want [%s]", got, a)
	}
	if got := e.servers(); !slices.Equal(got, []string{a + " ready"}) {
		t.Errorf("HAProxy has %q after the refusals, want only %s", got, a)
	}
	if status, body := e.through(); status != 200 || body != "A" {
		t.Errorf("frontend answers %d %q, want 200 A", status, body)
	}
}

// TestHAProxyStateIsWhatHAProxyServes: GET /state reports what HAProxy
// serves, not what was asked: 503 while HAProxy is down; after a restart
// (which drops every dynamic server) or an operator's changes on the admin
// socket, reading the state puts the upstreams back first (the periodic
// reconcile is off here).
func TestHAProxyStateIsWhatHAProxyServes(t *testing.T) {
	e := newHAEnv(t, nil)
	a := namedUpstream(t, "A")
	e.resp(e.post(reqSpec{id: "add-a", add: []string{a}}.json()))
	if r := e.finish("add-a", nil); r.State != stateSuccess {
		t.Fatalf("add-a ended %s: %s", r.State, r.Message)
	}
	if status, ups, body := e.stateUpstreams(); status != 200 || !slices.Equal(ups, []string{a}) {
		t.Fatalf("GET /state: %d %q %s, want [%s]", status, ups, body, a)
	}

	if err := e.h.Stop(time.Second); err != nil {
		t.Fatal(err)
	}
	if status, _, body := e.stateUpstreams(); status != http.StatusServiceUnavailable || !strings.Contains(body, "admin.sock") {
		t.Errorf("GET /state with HAProxy down: %d %s, want 503 naming the socket", status, body)
	}

	e.h.Restart(t)
	if got := e.servers(); len(got) != 0 {
		t.Fatalf("restarted HAProxy has %q, want nothing", got)
	}
	if status, ups, body := e.stateUpstreams(); status != 200 || !slices.Equal(ups, []string{a}) {
		t.Errorf("GET /state after the restart: %d %q %s, want [%s]", status, ups, body, a)
	}
	if got := e.servers(); !slices.Equal(got, []string{a + " ready"}) {
		t.Errorf("after GET /state HAProxy has %q, want %s ready", got, a)
	}

	// An operator disables our server and adds one of their own.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := e.h.Client
	mustNoErr(t, c.SetMaint(ctx, "web", ServerName(Target{Upstream: a, Group: "default"})))
	mustNoErr(t, c.AddServer(ctx, "web", "intruder", namedUpstream(t, "X")))
	mustNoErr(t, c.EnableServer(ctx, "web", "intruder"))
	if status, ups, body := e.stateUpstreams(); status != 200 || !slices.Equal(ups, []string{a}) {
		t.Errorf("GET /state after operator changes: %d %q %s, want [%s]", status, ups, body, a)
	}
	if got := e.servers(); !slices.Equal(got, []string{a + " ready"}) {
		t.Errorf("after GET /state HAProxy has %q, want only %s ready", got, a)
	}
}

// TestHAProxyReconcileLoop: with the periodic reconcile on, a restarted
// HAProxy gets its servers back without anyone asking.
func TestHAProxyReconcileLoop(t *testing.T) {
	e := newHAEnv(t, func(o *Options) { o.ReconcileInterval = 50 * time.Millisecond })
	a := namedUpstream(t, "A")
	e.resp(e.post(reqSpec{id: "add-a", add: []string{a}}.json()))
	if r := e.finish("add-a", nil); r.State != stateSuccess {
		t.Fatalf("add-a ended %s: %s", r.State, r.Message)
	}
	restarted := time.Now()
	e.h.Restart(t)
	waitFor(t, "HAProxy to serve "+a+" again", func() bool {
		return slices.Equal(e.servers(), []string{a + " ready"})
	})
	t.Logf("HAProxy served %s again %s after the restart began", a, time.Since(restarted).Round(time.Millisecond))
	if status, body := e.through(); status != 200 || body != "A" {
		t.Errorf("frontend answers %d %q, want 200 A", status, body)
	}
}

// TestHAProxyRemoveLetsRequestsFinish: removing an upstream takes it out of
// rotation at once, but a request it is serving completes (HAProxy deletes
// the server only once its connections are gone, up to DrainTimeout).
func TestHAProxyRemoveLetsRequestsFinish(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web"}}})
	be, err := NewHAProxyBackend(HAProxyOptions{Socket: h.Config.Socket, DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		time.Sleep(500 * time.Millisecond)
		fmt.Fprint(w, "slow")
	}))
	t.Cleanup(slow.Close)
	target := Target{Upstream: strings.TrimPrefix(slow.URL, "http://"), Group: "default"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mustNoErr(t, be.Sync(ctx, "web", []Target{target}))

	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Get(h.URL + "/")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{status: resp.StatusCode, body: string(b)}
	}()
	<-started
	mustNoErr(t, be.Sync(ctx, "web", nil))
	select {
	case r := <-done:
		if r.err != nil || r.status != 200 || r.body != "slow" {
			t.Errorf("in-flight request: %d %q %v, want 200 slow", r.status, r.body, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request did not complete")
	}
	if st := h.Servers(t, "web"); len(st) != 0 {
		t.Errorf("after the removal HAProxy has %+v", st)
	}
}

// TestHAProxyBackendNamesAndResolution: an upstream given by host name is
// added at its address; the same upstream in two groups is two servers;
// Serving maps them back.
func TestHAProxyBackendNamesAndResolution(t *testing.T) {
	const svc = "svc|a" // '|' is no HAProxy name character
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: haproxy.Name(svc)}, {Backend: "mapped"}}})
	be, err := NewHAProxyBackend(HAProxyOptions{Socket: h.Config.Socket, Backends: map[string]string{"other": "mapped"}})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(namedUpstream(t, "A"))
	want := []Target{
		{Upstream: "localhost:" + port, Group: "default"},
		{Upstream: "localhost:" + port, Group: "blue"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mustNoErr(t, be.Sync(ctx, svc, want))
	st := h.Servers(t, haproxy.Name(svc))
	if len(st) != 2 || st[0].Name == st[1].Name {
		t.Fatalf("servers %+v, want two with distinct names", st)
	}
	for _, s := range st {
		if s.Address() != "127.0.0.1:"+port && s.Address() != "[::1]:"+port {
			t.Errorf("server %s at %s, want localhost's address", s.Name, s.Address())
		}
	}
	got, err := be.Serving(ctx, svc)
	mustNoErr(t, err)
	if !sameTargets(got, want) {
		t.Errorf("Serving = %v, want %v", got, want)
	}

	mustNoErr(t, be.Sync(ctx, "other", want[:1]))
	if st := h.Servers(t, "mapped"); len(st) != 1 {
		t.Errorf("service other (mapped to backend mapped): servers %+v, want one", st)
	}
	if err := be.Sync(ctx, svc, []Target{{Upstream: "no-such-host.invalid:80", Group: "default"}}); err == nil || !strings.Contains(err.Error(), "no-such-host.invalid") {
		t.Errorf("unresolvable upstream: err %v", err)
	}
}
