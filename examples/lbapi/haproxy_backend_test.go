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
	"strconv"
	"strings"
	"sync/atomic"
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

// servers lists the web backend's ready server slots as "address ready"
// (the others are the free pool).
func (e *haEnv) servers() []string {
	var out []string
	for _, s := range e.h.Servers(e.t, "web") {
		if s.Ready() {
			out = append(out, s.Address()+" ready")
		}
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
			want: []string{"Apply failed", `"127.0.0.1" port 99999 is not an IP address and port`, "REVERT OK"},
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
// (which puts every slot back in maintenance) or an operator's changes on the admin
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

	// An operator disables our slot and points another one at a server of
	// their own.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := e.h.Client
	for _, s := range e.h.Servers(t, "web") {
		if s.Ready() {
			mustNoErr(t, c.SetMaint(ctx, "web", s.Name))
		}
	}
	x := namedUpstream(t, "X")
	host, port, _ := net.SplitHostPort(x)
	p, _ := strconv.Atoi(port)
	last := fmt.Sprintf("%s%d", haproxy.SlotPrefix, haproxy.DefaultSlots)
	mustNoErr(t, c.SetAddr(ctx, "web", last, host, p))
	mustNoErr(t, c.SetReady(ctx, "web", last))
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
// rotation at once, but a request it is serving completes (the change waits
// for its streams, up to DrainTimeout).
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
	for _, s := range h.Servers(t, "web") {
		if s.Ready() {
			t.Errorf("after the removal HAProxy serves %s (%s)", s.Name, s.Address())
		}
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
	st := slices.DeleteFunc(h.Servers(t, haproxy.Name(svc)), func(s haproxy.ServerState) bool { return !s.Ready() })
	if len(st) != 2 || st[0].Name == st[1].Name {
		t.Fatalf("ready servers %+v, want two with distinct names", st)
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
	if st := slices.DeleteFunc(h.Servers(t, "mapped"), func(s haproxy.ServerState) bool { return !s.Ready() }); len(st) != 1 {
		t.Errorf("service other (mapped to backend mapped): ready servers %+v, want one", st)
	}
	if err := be.Sync(ctx, svc, []Target{{Upstream: "no-such-host.invalid:80", Group: "default"}}); err == nil || !strings.Contains(err.Error(), "no-such-host.invalid") {
		t.Errorf("unresolvable upstream: err %v", err)
	}
}

// slowUpstream answers "slow" after hold; started receives one value per
// request as it arrives.
func slowUpstream(t *testing.T, hold time.Duration) (string, chan struct{}) {
	started := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		time.Sleep(hold)
		fmt.Fprint(w, "slow")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), started
}

// TestHAProxyBusySlotIsNotReused: a slot taken out of rotation while a
// request is still running on it keeps its address until that request
// ends; the next upstream gets another slot, and with none free the change
// fails naming the cause instead of re-pointing a busy slot. Once the
// request has ended, its slot is free again.
func TestHAProxyBusySlotIsNotReused(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web"}}, Slots: 2})
	be, err := NewHAProxyBackend(HAProxyOptions{Socket: h.Config.Socket, DrainTimeout: 50 * time.Millisecond})
	mustNoErr(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	slow, started := slowUpstream(t, 1500*time.Millisecond)
	a := Target{Upstream: slow, Group: "default"}
	mustNoErr(t, be.Sync(ctx, "web", []Target{a}))
	done := make(chan string, 1)
	go func() {
		resp, err := http.Get(h.URL + "/")
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- string(b)
	}()
	<-started
	busy := ""
	for _, s := range h.Servers(t, "web") {
		if s.Ready() {
			busy = s.Name
		}
	}
	b := Target{Upstream: namedUpstream(t, "B"), Group: "default"}
	mustNoErr(t, be.Sync(ctx, "web", []Target{b})) // returns after the 50ms drain, the request still running
	for _, s := range h.Servers(t, "web") {
		switch {
		case s.Name == busy && (s.Ready() || s.Address() != slow):
			t.Errorf("busy slot %s: %+v, want it in maintenance, still at %s", busy, s, slow)
		case s.Name != busy && (!s.Ready() || s.Address() != b.Upstream):
			t.Errorf("slot %s: %+v, want it ready at %s", s.Name, s, b.Upstream)
		}
	}
	c := Target{Upstream: namedUpstream(t, "C"), Group: "default"}
	if err := be.Sync(ctx, "web", []Target{c}); err == nil || !strings.Contains(err.Error(), "no free server slot") {
		t.Errorf("swap with the only other slot busy: err %v, want no free server slot", err)
	}
	select {
	case body := <-done:
		if body != "slow" {
			t.Errorf("the request in flight got %q, want slow", body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight did not end")
	}
	waitFor(t, "the busy slot to have no stream", func() bool {
		l, err := h.Client.Loads(ctx, "web")
		return err == nil && l[busy].Idle()
	})
	mustNoErr(t, be.Sync(ctx, "web", []Target{c}))
	if status, body := (&haEnv{testEnv: &testEnv{t: t}, h: h}).through(); status != 200 || body != "C" {
		t.Errorf("after the swap to C: %d %q", status, body)
	}
}

// TestHAProxySwapsUnderLoad: four kept-alive clients send requests through
// HAProxy while the backend swaps one upstream for the next 40 times, every
// other time after the old one died mid-traffic (listener closed and
// connections reset, as a SIGKILL does). HAProxy survives every swap (same
// process), and every answer comes from the upstream of that moment or its
// successor.
func TestHAProxySwapsUnderLoad(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web"}}})
	be, err := NewHAProxyBackend(HAProxyOptions{Socket: h.Config.Socket, DrainTimeout: 200 * time.Millisecond})
	mustNoErr(t, err)
	pid := h.PID()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const swaps, clients = 40, 4
	var current atomic.Int64 // index of the upstream being swapped in
	servers := make([]*httptest.Server, swaps+1)
	start := func(i int) Target {
		servers[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "u%d", i) }))
		t.Cleanup(servers[i].Close)
		return Target{Upstream: strings.TrimPrefix(servers[i].URL, "http://"), Group: "default"}
	}
	mustNoErr(t, be.Sync(ctx, "web", []Target{start(0)}))

	type tally struct{ ok, failed, wrong int }
	results := make(chan tally, clients)
	stop := make(chan struct{})
	for c := 0; c < clients; c++ {
		go func() {
			var n tally
			cl := &http.Client{Timeout: 5 * time.Second}
			defer cl.CloseIdleConnections()
			for i := 0; i < 200_000; i++ { // bounded; stop ends it long before
				select {
				case <-stop:
					results <- n
					return
				default:
				}
				before := int(current.Load())
				resp, err := cl.Get(h.URL + "/")
				if err != nil {
					n.failed++
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					n.failed++
					continue
				}
				var got int
				if _, err := fmt.Sscanf(string(b), "u%d", &got); err != nil || got < before-1 || got > int(current.Load()) {
					n.wrong++
					t.Errorf("answer %q while swapping to u%d", b, before)
				}
				n.ok++
			}
			results <- n
		}()
	}
	for i := 1; i <= swaps; i++ {
		time.Sleep(20 * time.Millisecond)
		next := start(i)
		current.Store(int64(i))
		if i%2 == 0 { // the holder dies before it is swapped out
			servers[i-1].CloseClientConnections()
			servers[i-1].Close()
		}
		mustNoErr(t, be.Sync(ctx, "web", []Target{next}))
		select {
		case <-h.Done():
			t.Fatalf("HAProxy exited at swap %d:\n%s", i, h.Log())
		default:
		}
	}
	close(stop)
	var sum tally
	for c := 0; c < clients; c++ {
		n := <-results
		sum.ok, sum.failed, sum.wrong = sum.ok+n.ok, sum.failed+n.failed, sum.wrong+n.wrong
	}
	t.Logf("%d swaps: %d answers, %d failed, %d wrong", swaps, sum.ok, sum.failed, sum.wrong)
	if h.PID() != pid {
		t.Errorf("HAProxy pid %d, was %d", h.PID(), pid)
	}
	if sum.ok == 0 || sum.wrong != 0 {
		t.Errorf("%d answers, %d wrong", sum.ok, sum.wrong)
	}
}
