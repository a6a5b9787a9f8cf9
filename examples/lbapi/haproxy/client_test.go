package haproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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

// TestClientDynamicServers drives a real HAProxy 2.6 the way the LB API
// does: a server added at run time is in maintenance until enabled, then
// takes the frontend's traffic; it can be deleted only from maintenance;
// HAProxy's refusals come back as CommandErrors quoting it.
func TestClientDynamicServers(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web", PathPrefix: "/"}}})
	c, cx := h.Client, ctx(t)
	a := upstream(t, "server-a")

	if status, _ := get(t, h.URL+"/"); status != http.StatusServiceUnavailable {
		t.Errorf("empty backend: HTTP %d, want 503", status)
	}
	if err := c.AddServer(cx, "web", "a", a); err != nil {
		t.Fatal(err)
	}
	st := h.Servers(t, "web")
	if len(st) != 1 || st[0].Name != "a" || st[0].Address() != a || st[0].Ready() || st[0].AdminState&haproxy.AdminForcedMaint == 0 {
		t.Fatalf("after add: %+v, want one server a at %s in forced maintenance", st, a)
	}
	if status, _ := get(t, h.URL+"/"); status != http.StatusServiceUnavailable {
		t.Errorf("server in maintenance: HTTP %d, want 503", status)
	}
	if err := c.EnableServer(cx, "web", "a"); err != nil {
		t.Fatal(err)
	}
	if st := h.Servers(t, "web"); len(st) != 1 || !st[0].Ready() {
		t.Fatalf("after enable: %+v, want a ready", st)
	}
	if status, body := get(t, h.URL+"/any/path"); status != 200 || body != "server-a" {
		t.Errorf("through HAProxy: %d %q, want 200 server-a", status, body)
	}

	refusals := []struct {
		name string
		do   func() error
		want string
	}{
		{"add twice", func() error { return c.AddServer(cx, "web", "a", a) }, "Already exists a server with the same name"},
		{"add to unknown backend", func() error { return c.AddServer(cx, "nope", "a", a) }, "No such backend."},
		{"delete a server in service", func() error { return c.DelServer(cx, "web", "a") }, "Only servers in maintenance mode can be deleted."},
		{"delete an unknown server", func() error { return c.DelServer(cx, "web", "zz") }, "No such server."},
		{"state of an unknown backend", func() error { _, err := c.ServersState(cx, "nope"); return err }, "Can't find backend."},
	}
	for _, r := range refusals {
		err := r.do()
		var ce *haproxy.CommandError
		if !errors.As(err, &ce) || !strings.Contains(ce.Answer, r.want) {
			t.Errorf("%s: err %v, want a CommandError quoting %q", r.name, err, r.want)
		}
	}

	if err := c.SetMaint(cx, "web", "a"); err != nil {
		t.Fatal(err)
	}
	if status, _ := get(t, h.URL+"/"); status != http.StatusServiceUnavailable {
		t.Errorf("after maint: HTTP %d, want 503", status)
	}
	if err := c.DelServer(cx, "web", "a"); err != nil {
		t.Fatal(err)
	}
	if st := h.Servers(t, "web"); len(st) != 0 {
		t.Errorf("after delete: %+v, want none", st)
	}
}

func TestClientRefusesInjectedCommands(t *testing.T) {
	c := &haproxy.Client{Socket: "/nonexistent.sock"}
	for _, cmd := range []string{"show info; shutdown frontend lbapi", "show info\nshow stat"} {
		if _, err := c.Command(context.Background(), cmd); err == nil || !strings.Contains(err.Error(), "';' or a line break") {
			t.Errorf("Command(%q): err %v, want a refusal", cmd, err)
		}
	}
	if err := c.AddServer(context.Background(), "web", "a b", "127.0.0.1:80"); err == nil {
		t.Error("AddServer accepted a name with a space")
	}
}

func TestClientSocketErrors(t *testing.T) {
	c := &haproxy.Client{Socket: filepath.Join(t.TempDir(), "none.sock"), Timeout: time.Second}
	_, err := c.Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("missing socket: err %v, want one naming the socket", err)
	}
}

// TestProcessRestartLosesDynamicServers: a restarted HAProxy is a new
// process with the same configuration and none of the servers added at run
// time, which is what the LB API must reconcile.
func TestProcessRestartLosesDynamicServers(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web"}}})
	cx := ctx(t)
	if err := h.Client.AddServer(cx, "web", "a", upstream(t, "a")); err != nil {
		t.Fatal(err)
	}
	pid := h.PID()
	h.Restart(t)
	if h.PID() == pid {
		t.Errorf("restart kept pid %d", pid)
	}
	if st := h.Servers(t, "web"); len(st) != 0 {
		t.Errorf("after restart: %+v, want no server", st)
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
