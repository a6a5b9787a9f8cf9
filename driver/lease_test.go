package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Lease mode's settings reach the supervisor (heartbeat and escrow paths,
// the profile's timings, renews every 2 s), and every refusal names the
// field to fix.
func TestLeaseModeConfig(t *testing.T) {
	cfg := &drivers.TaskConfig{ID: "a/t/1", AllocID: "a", JobID: "web", JobName: "web", TaskGroupName: "g", Name: "t"}
	lease := func(extra LockConfig) TaskConfig {
		l := LockConfig{"mode": "lease"}
		for k, v := range extra {
			l[k] = v
		}
		return taskWithLock("/bin/app", l)
	}
	tests := []struct {
		name    string
		tc      TaskConfig
		want    lockclient.Heartbeat // zero when an error is wanted
		wantErr string
	}{
		{"default profile", lease(nil), lockclient.Heartbeat{Interval: time.Second, Fence: 6 * time.Second, KillGrace: 2 * time.Second}, ""},
		{"aggressive profile", lease(LockConfig{"lease_profile": "aggressive"}),
			lockclient.Heartbeat{Interval: 500 * time.Millisecond, Fence: 2 * time.Second, KillGrace: time.Second}, ""},
		{"a setting over the profile", lease(LockConfig{"lease_fence": "8s"}),
			lockclient.Heartbeat{Interval: time.Second, Fence: 8 * time.Second, KillGrace: 2 * time.Second}, ""},
		{"unknown mode", taskWithLock("/bin/app", LockConfig{"mode": "fast"}), lockclient.Heartbeat{}, `config.lock.mode = "fast"`},
		{"unknown profile", lease(LockConfig{"lease_profile": "fast"}), lockclient.Heartbeat{}, `config.lock.lease_profile = "fast"`},
		{"lease settings without lease mode", taskWithLock("/bin/app", LockConfig{"lease_fence": "8s"}),
			lockclient.Heartbeat{}, `add mode = "lease"`},
		{"fence past the lock's own", lease(LockConfig{"lease_fence": "14s"}), lockclient.Heartbeat{}, "lease_fence 14s must be below"},
		{"interval below its minimum", lease(LockConfig{"lease_interval": "100ms"}), lockclient.Heartbeat{}, "config.lock.lease_interval = 100ms is below"},
		{"with a semaphore", lease(LockConfig{"holders": "2"}), lockclient.Heartbeat{}, "with holders"},
		{"with the workload's token", func() TaskConfig { tc := lease(nil); tc.ShareNomadToken = true; return tc }(),
			lockclient.Heartbeat{}, "config.share_nomad_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := tc.tc.runSpec(cfg, 15*time.Second, time.Second)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec, err := buildSpec(cfg, tc.tc, sc, userPolicy{defaultUser: "root", allowRoot: true})
			if err != nil {
				t.Fatal(err)
			}
			got := specThroughFile(t, spec).Heartbeat()
			want := tc.want
			want.Path, want.EscrowPath = DefaultLockPath(cfg)+"/lease", "singleton/escrow/"+DefaultLockPath(cfg)
			if got == nil || *got != want {
				t.Fatalf("supervisor's heartbeat = %+v, want %+v", got, want)
			}
			if r := specThroughFile(t, spec).Timing().RenewInterval; r != shim.LeaseRenew {
				t.Errorf("renew interval in lease mode = %s, want %s", r, shim.LeaseRenew)
			}
		})
	}
}

// A client without the plugin's release_token_file refuses lease mode at
// start, naming the plugin setting; a plain lock starts as before.
func TestLeaseModeNeedsTheReleaseToken(t *testing.T) {
	d := &Driver{}
	if err := d.checkLeaseMode(supervisorSpec{Run: shim.Spec{Config: shim.Config{Mode: shim.ModeLease}}}); err == nil || !strings.Contains(err.Error(), "release_token_file") {
		t.Fatalf("lease mode without release_token_file: err = %v, want it refused naming release_token_file", err)
	}
	if err := d.checkLeaseMode(supervisorSpec{}); err != nil {
		t.Fatalf("a plain lock: %v", err)
	}
	d.config.ReleaseTokenFile = "/etc/nomad.d/singleton-release.token"
	if err := d.checkLeaseMode(supervisorSpec{Run: shim.Spec{Config: shim.Config{Mode: shim.ModeLease}}}); err != nil {
		t.Fatalf("lease mode with release_token_file: %v", err)
	}
}

// A task recovered after its supervisor had exited (a node that comes back
// after its processes died) has no supervisor to stop: StopTask waits for
// the clean-up under way instead of crashing the plugin.
func TestStopTaskWithoutSupervisor(t *testing.T) {
	d := &Driver{tasks: newTaskStore()}
	h := &taskHandle{done: make(chan struct{})}
	d.tasks.set("t1", h)
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(h.done)
	}()
	if err := d.StopTask("t1", time.Minute, ""); err != nil {
		t.Fatalf("StopTask: %v", err)
	}
}
