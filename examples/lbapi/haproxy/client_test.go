package haproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
)

// upstream is an HTTP server answering its name.
func upstream(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// get fetches url and returns status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// split is host and port of an address httptest gave.
func split(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return host, p
}

// TestClientServerSlots drives a real HAProxy 2.6 the way the LB API does:
// the backend's slots start in maintenance (the frontend answers 503); a
// slot pointed at an upstream and made ready takes the frontend's traffic;
// pointed elsewhere, it sends the next request there, even over a client's
// kept-alive connection; back in maintenance it takes none. HAProxy's
// refusals come back as CommandErrors quoting it.
func TestClientServerSlots(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web", PathPrefix: "/"}}})
	c, cx := h.Client, ctx(t)
	st := h.Servers(t, "web")
	if len(st) != haproxy.DefaultSlots {
		t.Fatalf("%d slots, want %d", len(st), haproxy.DefaultSlots)
	}
	for _, s := range st {
		if s.Ready() || s.AdminState&haproxy.AdminForcedMaint == 0 || !strings.HasPrefix(s.Name, haproxy.SlotPrefix) {
			t.Errorf("fresh slot %+v, want %s<n> in forced maintenance", s, haproxy.SlotPrefix)
		}
	}
	if status, _ := get(t, h.URL+"/"); status != http.StatusServiceUnavailable {
		t.Errorf("no slot ready: HTTP %d, want 503", status)
	}
	a, b := upstream(t, "server-a"), upstream(t, "server-b")
	host, port := split(t, a)
	if err := c.SetAddr(cx, "web", "slot1", host, port); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReady(cx, "web", "slot1"); err != nil {
		t.Fatal(err)
	}
	if st := h.Servers(t, "web"); !st[0].Ready() || st[0].Address() != a {
		t.Fatalf("after set addr and ready: %+v, want slot1 ready at %s", st[0], a)
	}
	kept := &http.Client{Timeout: 5 * time.Second}
	getWith := func(c *http.Client) (int, string) {
		resp, err := c.Get(h.URL + "/any/path")
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if status, body := getWith(kept); status != 200 || body != "server-a" {
		t.Errorf("through HAProxy: %d %q, want 200 server-a", status, body)
	}
	// HAProxy counts the answered request's session until it has closed
	// it on its side: wait for that, bounded.
	var loads map[string]haproxy.Load
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		loads, err = c.Loads(cx, "web")
		if err == nil && len(loads) == haproxy.DefaultSlots && loads["slot1"].Idle() || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(loads) != haproxy.DefaultSlots || !loads["slot1"].Idle() {
		t.Errorf("Loads = %+v, %v; want %d idle slots", loads, err, haproxy.DefaultSlots)
	}

	// The same slot, pointed at b while a still runs: neither HAProxy's
	// idle connection to a nor the client's kept-alive one brings a back.
	if err := c.SetMaint(cx, "web", "slot1"); err != nil {
		t.Fatal(err)
	}
	if status, _ := getWith(kept); status != http.StatusServiceUnavailable {
		t.Errorf("slot in maintenance: HTTP %d, want 503", status)
	}
	host, port = split(t, b)
	if err := c.SetAddr(cx, "web", "slot1", host, port); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReady(cx, "web", "slot1"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if status, body := getWith(kept); status != 200 || body != "server-b" {
			t.Fatalf("request %d after re-pointing the slot: %d %q, want 200 server-b", i, status, body)
		}
	}

	refusals := []struct {
		name string
		do   func() error
		want string
	}{
		{"unknown slot", func() error { return c.SetAddr(cx, "web", "slot99", "127.0.0.1", 80) }, "No such server."},
		{"unknown backend", func() error { return c.SetReady(cx, "nope", "slot1") }, "No such backend."},
		{"state of an unknown backend", func() error { _, err := c.ServersState(cx, "nope"); return err }, "Can't find backend."},
		{"loads of an unknown backend", func() error { _, err := c.Loads(cx, "nope"); return err }, "No such proxy."},
	}
	for _, r := range refusals {
		err := r.do()
		var ce *haproxy.CommandError
		if !errors.As(err, &ce) || !strings.Contains(ce.Answer, r.want) {
			t.Errorf("%s: err %v, want a CommandError quoting %q", r.name, err, r.want)
		}
	}
	// HAProxy would take port 99999 modulo 65536; the client refuses it.
	for _, bad := range []struct {
		ip   string
		port int
	}{{"127.0.0.1", 99999}, {"127.0.0.1", 0}, {"localhost", 80}} {
		if err := c.SetAddr(cx, "web", "slot2", bad.ip, bad.port); err == nil || !strings.Contains(err.Error(), "not an IP address and port") {
			t.Errorf("SetAddr(%s, %d): err %v, want a refusal", bad.ip, bad.port, err)
		}
	}
}

func TestClientRefusesInjectedCommands(t *testing.T) {
	c := &haproxy.Client{Socket: "/nonexistent.sock"}
	for _, cmd := range []string{"show info; shutdown frontend lbapi", "show info\nshow stat"} {
		if _, err := c.Command(context.Background(), cmd); err == nil || !strings.Contains(err.Error(), "';' or a line break") {
			t.Errorf("Command(%q): err %v, want a refusal", cmd, err)
		}
	}
}

func TestClientSocketErrors(t *testing.T) {
	c := &haproxy.Client{Socket: filepath.Join(t.TempDir(), "none.sock"), Timeout: time.Second}
	_, err := c.Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("missing socket: err %v, want one naming the socket", err)
	}
}

// TestProcessRestartLosesRuntimeChanges: a restarted HAProxy is a new
// process with the same configuration, every slot back in maintenance at
// its placeholder address, which is what the LB API must reconcile.
func TestProcessRestartLosesRuntimeChanges(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web"}}})
	cx := ctx(t)
	host, port := split(t, upstream(t, "a"))
	if err := h.Client.SetAddr(cx, "web", "slot1", host, port); err != nil {
		t.Fatal(err)
	}
	if err := h.Client.SetReady(cx, "web", "slot1"); err != nil {
		t.Fatal(err)
	}
	pid := h.PID()
	h.Restart(t)
	if h.PID() == pid {
		t.Errorf("restart kept pid %d", pid)
	}
	for _, s := range h.Servers(t, "web") {
		if s.Ready() || s.Port == port {
			t.Errorf("after restart: %+v, want every slot in maintenance at its placeholder", s)
		}
	}
	info, err := h.Client.Info(cx)
	if err != nil || !strings.HasPrefix(info["Version"], "2.") {
		t.Errorf("show info after restart: %v %v", info["Version"], err)
	}
	if err := h.Stop(time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	default:
		t.Error("Stop returned before HAProxy exited")
	}
	if err := h.Stop(time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := h.Client.Info(cx); err == nil {
		t.Error("the admin socket still answers after Stop")
	}
}
