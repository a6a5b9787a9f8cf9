package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

func TestParseFlags(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# comment\nk1\n\n  k2  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cfg, err := parseFlags([]string{"-listen", ":0", "-groups", "default, prod", "-authkeys-file", keys, "-worker-interval", "20ms"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.opts.Groups) != 2 || cfg.opts.Groups[0].Name != "default" || cfg.opts.Groups[1].Name != "prod" {
		t.Errorf("groups = %+v", cfg.opts.Groups)
	}
	if !slices.Equal(cfg.opts.AuthKeys, []string{"k1", "k2"}) {
		t.Errorf("keys = %v", cfg.opts.AuthKeys)
	}
	if cfg.listen != ":0" || cfg.opts.WorkerInterval != 20*time.Millisecond {
		t.Errorf("listen %q, worker interval %s", cfg.listen, cfg.opts.WorkerInterval)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-groups", ","},
		{"-authkeys-file", "/does/not/exist"},
		{"sekret"},
		{"-nope"},
		{"-haproxy-backends", "web=be_web"},
		{"-haproxy-socket", "/x.sock", "-haproxy-backends", "web"},
		{"-haproxy-socket", "/x.sock", "-haproxy-backends", "web=bad name"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestRunServesUntilWaitReturns(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"-listen", "127.0.0.1:0"}, &stderr, func() {})
	if code != 0 || !strings.Contains(stderr.String(), "/baragon/v2/request") {
		t.Errorf("exit %d, stderr %s", code, stderr.String())
	}
	if code := run([]string{"-worker-interval", "-1s"}, &stderr, func() {}); code != 64 {
		t.Errorf("bad options: exit %d, want 64", code)
	}
}

func TestParseFlagsHAProxy(t *testing.T) {
	cfg, err := parseFlags([]string{
		"-groups", "web-lb,other", "-haproxy-socket", "/run/lbapi/admin.sock", "-haproxy-backends", "web=be_web,api=be_api",
		"-haproxy-groups", "web-lb", "-reconcile-interval", "250ms",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	be, ok := cfg.opts.Backend.(*lbapi.HAProxyBackend)
	if !ok {
		t.Fatalf("backend %T, want *lbapi.HAProxyBackend", cfg.opts.Backend)
	}
	if be.Name() != "unix:///run/lbapi/admin.sock" || be.BackendFor("web") != "be_web" || be.BackendFor("api") != "be_api" || be.BackendFor("x/y") == "x/y" {
		t.Errorf("backend %s maps web→%s api→%s x/y→%s", be.Name(), be.BackendFor("web"), be.BackendFor("api"), be.BackendFor("x/y"))
	}
	if !slices.Equal(cfg.opts.BackendGroups, []string{"web-lb"}) || cfg.opts.ReconcileInterval != 250*time.Millisecond {
		t.Errorf("groups %q, reconcile %s", cfg.opts.BackendGroups, cfg.opts.ReconcileInterval)
	}
	if cfg, err := parseFlags(nil, &bytes.Buffer{}); err != nil || cfg.opts.Backend != nil {
		t.Errorf("without -haproxy-socket: backend %v, err %v; want the in-memory agents", cfg.opts.Backend, err)
	}
}

// TestRunDrivesHAProxy: the program with -haproxy-socket puts a request's
// upstream into a real HAProxy, which then forwards to it.
func TestRunDrivesHAProxy(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Options{Services: []haproxy.Service{{Backend: "web", PathPrefix: "/"}}})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "upstream") }))
	defer up.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	release := make(chan struct{})
	exited := make(chan int, 1)
	var stderr proctest.SyncBuffer
	go func() {
		exited <- run([]string{"-listen", addr, "-worker-interval", "10ms", "-haproxy-socket", h.Config.Socket},
			&stderr, func() { <-release })
	}()
	defer func() {
		close(release)
		if code := <-exited; code != 0 {
			t.Errorf("exit %d: %s", code, stderr.String())
		}
	}()

	uri := "http://" + addr + "/baragon/v2/request"
	body := fmt.Sprintf(`{"loadBalancerRequestId":"web-ADD-1","loadBalancerService":{"serviceId":"web","owners":[],"serviceBasePath":"/web","loadBalancerGroups":["default"]},"addUpstreams":[{"upstream":%q}],"removeUpstreams":[]}`,
		strings.TrimPrefix(up.URL, "http://"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post(uri, "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("POST %s: %v; stderr:\n%s", uri, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		resp, err := http.Get(uri + "/web-ADD-1")
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			State   string `json:"loadBalancerState"`
			Message string `json:"message"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if r.State == "SUCCESS" {
			break
		}
		if r.State != "WAITING" || time.Now().After(deadline) {
			t.Fatalf("request %s %s; stderr:\n%s", r.State, r.Message, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get(h.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "upstream" {
		t.Errorf("through HAProxy: %d %q, want 200 upstream", resp.StatusCode, b)
	}
	if !strings.Contains(stderr.String(), "driving HAProxy 2.") {
		t.Errorf("stderr does not name the HAProxy it drives:\n%s", stderr.String())
	}
}
