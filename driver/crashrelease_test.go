package driver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// The plugin's LB clean-up runs only for a supervisor that died without
// writing its exit status. After a normal exit it sends nothing (the
// supervisor sent its own REMOVE), and no event speaks of a crash.
func TestLBCleanUpOnlyAfterACrash(t *testing.T) {
	for _, tc := range []struct {
		name       string
		exited     bool
		wantRemove bool
	}{
		{"normal exit whose REMOVE failed", true, false},
		{"crash while registered", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts atomic.Int32
			dir := registeredState(t, func() { posts.Add(1) })
			if tc.exited {
				if err := writeJSON(dir, exitFile, exitStatus{ExitCode: shim.ExitLBFailed}); err != nil {
					t.Fatal(err)
				}
			}
			d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
			h := &taskHandle{cfg: &drivers.TaskConfig{ID: "a1/t", Name: "t", AllocID: "a1"}, dir: dir, logger: hclog.NewNullLogger()}
			d.cleanUpAfterExit(h)

			if got := posts.Load() > 0; got != tc.wantRemove {
				t.Errorf("REMOVE sent: %v, want %v", got, tc.wantRemove)
			}
			for _, ev := range d.pending {
				if tc.exited && strings.Contains(ev.Message, "crash") {
					t.Errorf("event after a normal exit speaks of a crash: %s", ev.Message)
				}
			}
			if !tc.exited && (len(d.pending) != 1 || !strings.Contains(d.pending[0].Message, "on behalf of crashed supervisor")) {
				t.Errorf("events %v, want one saying the upstream was removed on behalf of the crashed supervisor", d.pending)
			}
		})
	}
}

// Notices are task events each time they come; a state's message only
// when it changes (renew heartbeats repeat it).
func TestPublisherNoticesAreEventsEachTime(t *testing.T) {
	dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	p := &publisher{dir: dir, path: "nomad/jobs/x/lock", log: hclog.NewNullLogger()}
	held := shim.Event{State: shim.StateHealthy, Message: "Health check passed on 127.0.0.1:80", Fence: 3}
	notice := shim.Event{State: shim.StateHealthy, Message: "Holding the lock; not yet in the load balancer: …", Fence: 3, Notice: true}
	for _, ev := range []shim.Event{held, held, notice, held, notice} {
		p.observe(ev)
	}
	evs, err := (&eventTail{dir: dir}).read()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Message)
	}
	want := []string{held.Message, notice.Message, notice.Message}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("events %q, want %q", got, want)
	}
	var st supervisorStatus
	if err := readJSON(dir, statusFile, &st); err != nil || st.Message != held.Message {
		t.Errorf("status message %q (%v), want the state's own %q", st.Message, err, held.Message)
	}
}

// A crashed gate's upstream (its gated task's) is removed beside the exit
// report, not before it: Nomad's kill of the gated tasks is not held up by
// the LB. Past the gate's stop deadline nothing is sent (the lock may be
// free, and a next holder registered on the same host:port).
func TestLBCleanUpAfterGateCrash(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stopIn     time.Duration
		wantRemove bool
	}{
		{"within the stop deadline", 20 * time.Second, true},
		{"past the stop deadline", -time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts atomic.Int32
			unblock := make(chan struct{})
			defer close(unblock) // runs before registeredState's clean-up closes the LB
			dir := registeredState(t, func() { posts.Add(1); <-unblock })
			if err := writeJSON(dir, specFile, gateSpecFile(shim.GateSpec{AllocID: "a1", Task: "gate"})); err != nil {
				t.Fatal(err)
			}
			d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
			h := &taskHandle{cfg: &drivers.TaskConfig{ID: "a1/gate", Name: "gate", AllocID: "a1"}, dir: dir, logger: hclog.NewNullLogger(),
				status: supervisorStatus{State: string(shim.StateRegistered), StopDeadlineBoot: bootNow() + int64(tc.stopIn)}}
			began := time.Now()
			d.cleanUpAfterExit(h) // the LB answers nothing until unblock
			if took := time.Since(began); took > time.Second {
				t.Errorf("the crash clean-up of a gate took %s: it must not wait for the LB", took)
			}
			if !tc.wantRemove {
				if len(d.pending) != 1 || !strings.Contains(d.pending[0].Message, "skipped") {
					t.Errorf("events %v, want one saying the REMOVE was skipped", d.pending)
				}
				if posts.Load() != 0 { // no goroutine is left to send one
					t.Error("REMOVE sent past the gate's stop deadline")
				}
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for posts.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no REMOVE of the crashed gate's upstream within 10s")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// registeredState is a task state dir holding the LB registration of
// upstream 127.0.0.1:8080 in service web, with a test LB that calls onPost
// for every request it gets and then answers SUCCESS.
func registeredState(t *testing.T, onPost func()) *securefs.Dir {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			onPost()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"loadBalancerRequestId":"x","loadBalancerState":"SUCCESS"}`))
	}))
	t.Cleanup(ts.Close)
	dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	reg := lbRegistration{
		Config: lbhook.Config{URI: ts.URL + "/baragon/v2/request", ServiceID: "web", BasePath: "/web",
			Groups: []string{"g"}, PortLabel: "http", RemoveDeadline: 2 * time.Second},
		AllocID: "a1", Fence: 3, Upstream: lbhook.UpstreamInfo{Upstream: "127.0.0.1:8080"},
	}
	if err := writeJSON(dir, lbFile, reg); err != nil {
		t.Fatal(err)
	}
	return dir
}
