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

// held writes the gate's spec and the lease it acquired ago.
func (r *restartRig) held(t *testing.T, mode string, ago time.Duration) {
	t.Helper()
	spec := supervisorSpec{Mode: mode, Gate: &gateSpec{AllocID: r.cfg.AllocID, Task: r.cfg.Name}}
	lease := heldLease{LockID: "lock-1", Fence: 7, TTL: 10 * time.Second, LockDelay: time.Second,
		LastRenewBoot: lockclient.BootNanos(lockclient.BootNow().Add(-ago))}
	for name, v := range map[string]any{specFile: spec, leaseFile: lease} {
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
