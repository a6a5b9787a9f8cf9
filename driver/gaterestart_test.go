package driver

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// restartRig is a gate's state dir under a plugin state root, as a gate
// that held leaves it.
type restartRig struct {
	root *securefs.Dir
	cfg  *drivers.TaskConfig
	h    *taskHandle
	pub  *publisher
}

func newRestartRig(t *testing.T) *restartRig {
	t.Helper()
	root, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	const alloc = "5d171c8d-1421-633e-e44a-52cb9501d563"
	cfg := &drivers.TaskConfig{ID: alloc + "/gate/1", AllocID: alloc, Name: "gate"}
	dir, err := openTaskState(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close(); root.Close() })
	return &restartRig{root: root, cfg: cfg, h: &taskHandle{cfg: cfg, dir: dir, logger: hclog.NewNullLogger()},
		pub: &publisher{dir: dir, path: "nomad/jobs/j/g/gate/lock", log: hclog.NewNullLogger()}}
}

// held writes the gate's spec, the lease it acquired ago, and its exit
// 0 (a restart).

func (r *restartRig) held(t *testing.T, mode string, ago time.Duration) {
	t.Helper()
	spec := gateSpecFile(shim.GateSpec{AllocID: r.cfg.AllocID, Task: r.cfg.Name})
	spec.Run.Mode = mode
	lease := heldLease{LockID: "lock-1", Fence: 7, TTL: 10 * time.Second, LockDelay: time.Second,
		LastRenewBoot: lockclient.BootNanos(lockclient.BootNow().Add(-ago))}
	for name, v := range map[string]any{specFile: spec, leaseFile: lease, exitFile: exitStatus{}} {
		if err := writeJSON(r.h.dir, name, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeptLeaseSurvivesAWordingEvent: a gate that has held its lock for
// longer than the release cutoff after its acquire, then is stopped for a
// restart, publishes "Lock kept" without deadlines; the lease it keeps is
// still the one its last renew gave, and the restarted gate takes it over.
// (Before: the event zeroed the published last renew, the plugin took the
// acquire for it, forgot the lease as past its cutoff, and the restarted
// gate waited for its own lock until the server expired it.)
func TestKeptLeaseSurvivesAWordingEvent(t *testing.T) {
	r := newRestartRig(t)
	r.held(t, "", 40*time.Second)
	now := lockclient.BootNow()
	renewed := now.Add(-time.Second)
	r.pub.observe(shim.Event{State: shim.StateHolding, Fence: 7, Message: "Acquired lock (fence 7)",
		FenceDeadline: renewed.Add(9 * time.Second), StopDeadline: renewed.Add(19 * time.Second), LastRenew: renewed})
	r.pub.observe(shim.Event{State: shim.StateStopping, Fence: 7, Message: "Stopping gate"})
	r.pub.observe(shim.Event{State: shim.StateStopping, Fence: 7, Message: "Lock kept: Nomad stopped the gate while its allocation keeps running"})

	var st supervisorStatus
	if err := readJSON(r.h.dir, statusFile, &st); err != nil {
		t.Fatal(err)
	}
	if st.LastRenewBoot != lockclient.BootNanos(renewed) || st.FenceDeadlineBoot == 0 || st.StopDeadlineBoot == 0 {
		t.Errorf("status after a wording event: last renew %d (want %d), fence deadline %d, stop deadline %d: "+
			"the watchdog is blind and the kept lease dated from the acquire", st.LastRenewBoot, lockclient.BootNanos(renewed), st.FenceDeadlineBoot, st.StopDeadlineBoot)
	}
	var g gateLeases
	g.keep(r.h, r.root)
	if got := g.take(r.cfg, r.root); got == nil || got.LockID != "lock-1" {
		t.Fatalf("take = %+v, want the kept lease lock-1: the restarted gate would wait for its own lock", got)
	}
}

// A released lease, or a new one, takes no deadline of the last.
func TestPublisherKeepsDeadlinesOnlyForTheSameLease(t *testing.T) {
	r := newRestartRig(t)
	now := lockclient.BootNow()
	r.pub.observe(shim.Event{State: shim.StateHolding, Fence: 7, FenceDeadline: now.Add(time.Second), StopDeadline: now.Add(2 * time.Second), LastRenew: now})
	for _, ev := range []shim.Event{
		{State: shim.StateReleased, Fence: 7, Message: "Released lock"},
		{State: shim.StateStopping, Fence: 8, Message: "another lease"},
		{State: shim.StateWaiting, Message: "Waiting"},
	} {
		r.pub.observe(shim.Event{State: shim.StateHolding, Fence: 7, FenceDeadline: now.Add(time.Second), StopDeadline: now.Add(2 * time.Second), LastRenew: now})
		r.pub.observe(ev)
		var st supervisorStatus
		if err := readJSON(r.h.dir, statusFile, &st); err != nil {
			t.Fatal(err)
		}
		if st.FenceDeadlineBoot != 0 || st.StopDeadlineBoot != 0 || st.LastRenewBoot != 0 {
			t.Errorf("%s (fence %d) kept the deadlines of fence 7: %+v", ev.State, ev.Fence, st)
		}
	}
}

// R3: a gate's kept lease may be taken over until its fence deadline, in
// lock and lease mode (a lease-mode gate kept none before: C1); a run that
// failed keeps none (Nomad does not restart it); without a published
// deadline a lease-mode lease is not kept (its last heartbeat is unknown).
func TestKeptLeaseUntilItsFenceDeadline(t *testing.T) {
	now := lockclient.BootNow()
	for _, tc := range []struct {
		name    string
		mode    string
		fence   time.Duration // the status's fence deadline from now (0: none published)
		exit    *exitStatus   // nil: crashed
		planned bool          // the plugin killed it (stop, destroy, supersede)
		kept    bool
	}{
		{"lock mode, restart", "", 3 * time.Second, &exitStatus{}, false, true},
		{"lease mode, restart", shim.ModeLease, 3 * time.Second, &exitStatus{}, false, true},
		{"lease mode, no deadline published", shim.ModeLease, 0, &exitStatus{}, false, false},
		{"lock mode, no deadline published: from the last renew", "", 0, &exitStatus{}, false, true},
		{"past its fence deadline", shim.ModeLease, -time.Millisecond, &exitStatus{}, false, false},
		{"failed (lost, signal)", "", 3 * time.Second, &exitStatus{ExitCode: 76}, false, false},
		{"killed by the plugin to stop it", shim.ModeLease, 3 * time.Second, nil, true, true},
		{"crashed", "", 3 * time.Second, nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRestartRig(t)
			r.held(t, tc.mode, time.Second)
			_ = r.h.dir.Remove(exitFile)
			if tc.exit != nil {
				if err := writeJSON(r.h.dir, exitFile, *tc.exit); err != nil {
					t.Fatal(err)
				}
			}
			r.h.killedByPlugin = tc.planned
			st := supervisorStatus{State: "stopping", Fence: 7, LastRenewBoot: lockclient.BootNanos(now.Add(-time.Second))}
			if tc.fence != 0 {
				st.FenceDeadlineBoot = lockclient.BootNanos(now.Add(tc.fence))
				st.StopDeadlineBoot = lockclient.BootNanos(now.Add(tc.fence + 2*time.Second))
			}
			if err := writeJSON(r.h.dir, statusFile, st); err != nil {
				t.Fatal(err)
			}
			var g gateLeases
			g.keep(r.h, r.root)
			got := g.take(r.cfg, r.root)
			if (got != nil) != tc.kept {
				t.Fatalf("take = %+v, want kept %v", got, tc.kept)
			}
			if got != nil && tc.fence > 0 && (got.FenceBoot != st.FenceDeadlineBoot || got.StopBoot != st.StopDeadlineBoot) {
				t.Errorf("kept until %d, kill by %d; want the published fence deadline %d and stop deadline %d",
					got.FenceBoot, got.StopBoot, st.FenceDeadlineBoot, st.StopDeadlineBoot)
			}
		})
	}
}
