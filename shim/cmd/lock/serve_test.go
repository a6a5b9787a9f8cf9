package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/promtooltest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lockIDPattern matches locktest's lock IDs.
var lockIDPattern = regexp.MustCompile(`locktest-lock-[0-9]+`)

// freeAddr is a loopback host:port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// lock -http-addr: /metrics passes promtool's check; /holder answers 503
// until the run holds the lock, then 200 with its path and fence, 503 again
// after the release, and never shows the lock ID.
func TestServeHTTP(t *testing.T) {
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.HTTPAddr = "nomad/jobs/web/lock", "default", freeAddr(t)
	holder := lockclient.Holder{AllocID: "5d0c3a1e-1111-2222-3333-444455556666", JobID: "web", Group: "web", Task: "web"}
	m := shim.NewMetrics(nil)
	if err := serveHTTP(cfg, holder, m, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	base := "http://" + cfg.HTTPAddr
	code, body := get(t, base+"/holder")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"held":false`) {
		t.Errorf("/holder before the lock is held: %d %s", code, body)
	}
	_, metrics := get(t, base+"/metrics")
	promtooltest.CheckMetrics(t, []byte(metrics))
	want := `nomad_singleton_lock_held{namespace="default",job="web",group="web",task="web",alloc_id="5d0c3a1e-1111-2222-3333-444455556666",path="nomad/jobs/web/lock",slot=""} 0`
	if !strings.Contains(metrics, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, metrics)
	}
	if err := serveHTTP(cfg, holder, m, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "-http-addr") {
		t.Errorf("a second server on the same address: %v, want an error naming -http-addr", err)
	}

	// A real run, over an in-memory lock API.
	srv := locktest.New()
	spec := shim.Spec{Config: shim.Config{Path: cfg.Path, Command: []string{"/bin/sleep", "30"}, KillSignal: syscall.SIGTERM, KillTimeout: time.Second}}
	stop := make(chan shim.StopRequest, 1)
	env := shim.Env{Locker: srv.Locker(t, lockclient.Config{Path: cfg.Path, Timing: locktest.Timing(), Holder: holder}),
		Metrics: m, Stop: stop}
	env.Env = []string{"PATH=/usr/bin:/bin"}
	exited := make(chan int, 1)
	go func() {
		code, _ := shim.Supervise(context.Background(), spec, env, make(chan os.Signal))
		exited <- code
	}()
	var h holderState
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		code, body = get(t, base+"/holder")
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &h); err != nil {
				t.Fatalf("/holder: %v: %s", err, body)
			}
			break
		}
		if time.Now().After(deadline) {
			stop <- shim.StopRequest{Signal: syscall.SIGKILL}
			t.Fatalf("/holder not 200 within 10s of the run's start: %d %s", code, body)
		}
	}
	fence, _ := srv.LastGrant()
	if !h.Held || h.Fence != fence || h.Path != cfg.Path || h.HeldSince == nil || time.Since(*h.HeldSince) > time.Minute {
		t.Errorf("/holder while held: %s; want fence %d", body, fence)
	}
	_, metrics = get(t, base+"/metrics")
	promtooltest.CheckMetrics(t, []byte(metrics))
	if !strings.Contains(metrics, strings.Replace(want, "} 0", "} 1", 1)) {
		t.Errorf("/metrics while held lacks held 1:\n%s", metrics)
	}
	stop <- shim.StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end within 10s of its stop")
	}
	code, body = get(t, base+"/holder")
	_, metrics = get(t, base+"/metrics")
	if code != http.StatusServiceUnavailable || !strings.Contains(metrics, want) {
		t.Errorf("after the release: /holder %d %s; /metrics:\n%s", code, body, metrics)
	}
	if id := lockIDPattern.FindString(body + metrics); id != "" {
		t.Errorf("a lock ID (%q) in /holder or /metrics", id)
	}
}
