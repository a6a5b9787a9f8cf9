package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/testutils"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// TestMain lets the test binary act as the supervisor (and its group guard)
// that the plugin re-execs: os.Executable is the test binary here.
func TestMain(m *testing.M) {
	shim.MaybeRunGuard(os.Args, OpenGuardTree)
	MaybeRunSupervisor(os.Args)
	os.Exit(m.Run())
}

// newPluginHarness runs the plugin in process behind Nomad's own gRPC driver
// harness (plugins/drivers/testutils), configured as an operator would,
// with its state dir in a temporary directory.
func newPluginHarness(t *testing.T) (*testutils.DriverHarness, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the plugin runs as root (its state dir must be root-owned)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := New(ctx, hclog.NewNullLogger())
	h := testutils.NewDriverHarness(t, d)
	t.Cleanup(h.Kill)
	stateDir := filepath.Join(t.TempDir(), "state")
	var data []byte
	if err := base.MsgPackEncode(&data, &PluginConfig{StateDir: stateDir, DefaultUser: "root", AllowRoot: true,
		DefaultTTL: "10s", DefaultDelay: "1s"}); err != nil {
		t.Fatal(err)
	}
	if err := h.SetConfig(&base.Config{PluginConfig: data}); err != nil {
		t.Fatalf("SetConfig: %v", err)
	}
	return h, stateDir
}

func harnessTask(t *testing.T, tc TaskConfig) *drivers.TaskConfig {
	t.Helper()
	allocID := uuid.Generate()
	cfg := &drivers.TaskConfig{
		ID: allocID + "/t/" + uuid.Short(), AllocID: allocID, Name: "t",
		JobID: "j", JobName: "j", TaskGroupName: "g", Namespace: "default",
		// A token, so the identity check passes; there is no Task API
		// socket in the harness's task dir.
		Env: map[string]string{"NOMAD_TOKEN": "not-a-real-token"},
	}
	if err := cfg.EncodeConcreteDriverConfig(&tc); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestPluginHarness drives the plugin through Nomad's driver harness:
// fingerprint and capabilities, a bad config refused at StartTask with the
// field to fix, a task whose supervisor cannot reach the Task API waiting
// (never running its command) until StopTask, DestroyTask removing its
// state, and a gate that cannot take its lock failing StartTask itself, with
// its reason and nothing left behind.
func TestPluginHarness(t *testing.T) {
	h, _ := newPluginHarness(t)

	fp, err := h.Fingerprint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-fp:
		if f.Health != drivers.HealthStateHealthy {
			t.Fatalf("fingerprint %s: %s", f.Health, f.HealthDescription)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no fingerprint within 10s")
	}
	caps, err := h.Capabilities()
	if err != nil || !caps.SendSignals || !caps.Exec {
		t.Fatalf("capabilities %+v, %v: want signals and exec", caps, err)
	}

	t.Run("missing_command_refused", func(t *testing.T) {
		// MkAllocDir's clean-up closes the harness: one per subtest.
		h, _ := newPluginHarness(t)
		cfg := harnessTask(t, TaskConfig{})
		defer h.MkAllocDir(cfg, true)()
		_, _, err := h.StartTask(cfg)
		if err == nil || !strings.Contains(err.Error(), "config.command is missing") || !strings.Contains(err.Error(), "config.gate = true") {
			t.Fatalf("StartTask without a command: %v, want the error naming config.command and config.gate", err)
		}
	})

	t.Run("no_task_api_waits_and_stops", func(t *testing.T) {
		// MkAllocDir's clean-up closes the harness: one per subtest.
		h, stateDir := newPluginHarness(t)
		cfg := harnessTask(t, TaskConfig{Command: "/bin/true"})
		defer h.MkAllocDir(cfg, true)()
		if _, _, err := h.StartTask(cfg); err != nil {
			t.Fatalf("StartTask: %v", err)
		}
		// Nomad unreachable: the supervisor keeps trying (it never
		// runs the command without the lock) until it is stopped.
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := h.InspectTask(cfg.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.DriverAttributes["lock_state"] == string(shim.StateWaiting) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task state %+v, want lock_state waiting", st)
			}
			time.Sleep(50 * time.Millisecond)
		}
		ch, err := h.WaitTask(context.Background(), cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.StopTask(cfg.ID, 5*time.Second, "SIGINT"); err != nil {
			t.Fatalf("StopTask: %v", err)
		}
		select {
		case res := <-ch:
			t.Logf("stopped while waiting: %+v", res)
		case <-time.After(30 * time.Second):
			t.Fatal("no exit within 30s of StopTask")
		}
		if err := h.DestroyTask(cfg.ID, false); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(stateDir, cfg.AllocID)); !os.IsNotExist(err) {
			t.Fatalf("state of the destroyed task left behind: %v", err)
		}
	})

	t.Run("gate_that_cannot_lock_fails_start", func(t *testing.T) {
		// MkAllocDir's clean-up closes the harness: one per subtest.
		h, stateDir := newPluginHarness(t)
		cfg := harnessTask(t, TaskConfig{Gate: true})
		defer h.MkAllocDir(cfg, true)()
		began := time.Now()
		_, _, err := h.StartTask(cfg)
		if err == nil || !strings.Contains(err.Error(), `gate "t" did not take its lock`) {
			t.Fatalf("StartTask of a gate without a Task API: %v, want it to fail with the gate's reason", err)
		}
		t.Logf("StartTask failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
		if _, err := h.InspectTask(cfg.ID); err == nil {
			t.Error("the failed gate is still known to the plugin")
		}
		if _, err := os.Stat(filepath.Join(stateDir, cfg.AllocID)); !os.IsNotExist(err) {
			t.Fatalf("state of the failed gate left behind: %v", err)
		}
	})
}
