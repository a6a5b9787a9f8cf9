package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	env := map[string]string{"NOMAD_ALLOC_ID": "0bc279c5-95ff-3634-67d3-8bddc839b19d", "NOMAD_LOCK_FENCE": "42"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		path string
		want string
	}{
		{"root", env, "/", "alloc 0bc279c5-95ff-3634-67d3-8bddc839b19d fence 42\n"},
		{"any path", env, "/web/x?y=1", "alloc 0bc279c5-95ff-3634-67d3-8bddc839b19d fence 42\n"},
		{"health", env, "/healthz", "ok\n"},
		{"outside Nomad", nil, "/", "alloc (not under Nomad) fence -\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			handler(func(k string) string { return tc.env[k] }).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if rec.Code != 200 || rec.Body.String() != tc.want {
				t.Errorf("GET %s: %d %q, want 200 %q", tc.path, rec.Code, rec.Body.String(), tc.want)
			}
		})
	}
}

// TestRunServesUntilStopped: it answers until stopped, then stops listening
// and exits 0.
func TestRunServesUntilStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	code := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		code <- run(ctx, []string{"-listen", "127.0.0.1:0"}, func(k string) string {
			return map[string]string{"NOMAD_ALLOC_ID": "a1"}[k]
		}, &stderr, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("not listening after 5s")
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(b), "alloc a1 ") {
		t.Errorf("answer %q", b)
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit %d: %s", c, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still running 10s after the stop")
	}
	if _, err := http.Get("http://" + addr + "/"); err == nil {
		t.Error("still answering after the stop")
	}
}

func TestRunBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"-listen", "not-an-address"}} {
		if c := run(context.Background(), args, func(string) string { return "" }, io.Discard, nil); c == 0 {
			t.Errorf("%q: exit 0", args)
		}
	}
}
