package driver

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// waitGateHolding returns once a gate holds its lock: Nomad starts the
// group's other tasks only when StartTask has returned (a prestart sidecar
// is then running), so a standby never starts them. A gate whose supervisor
// ends first (its allocation stopped while it waited, a job it cannot gate
// safely, no permission) fails to start, with its reason.
func (d *Driver) waitGateHolding(h *taskHandle, root *securefs.Dir, path string) error {
	d.emitEvent(h.cfg, fmt.Sprintf("Gate waiting for lock %s: the group's other tasks start once it is held", path),
		map[string]string{"lock_state": string(shim.StateWaiting)})
	select {
	case <-h.holding:
		return nil
	case <-h.done:
	case <-d.ctx.Done():
		_ = h.kill("the plugin is shutting down")
	}
	d.tasks.delete(h.cfg.ID)
	if err := removeTaskState(root, h.cfg); err != nil {
		h.logger.Warn("remove the task's state dir", "error", err)
	}
	h.dir.Close()
	h.mu.Lock()
	res, msg := h.exit, h.status.Message
	h.mu.Unlock()
	why := cmp.Or(msg, "its supervisor exited")
	if res != nil && res.Err != nil {
		why += " (" + res.Err.Error() + ")"
	}
	return fmt.Errorf("gate %q did not take its lock: %s", h.cfg.Name, why)
}

// gateLeases keeps, between two runs of a gate in one allocation, the lease
// the first run left held. Nomad restarts a gate that `nomad alloc restart`
// restarted (whatever its restart policy) while its gated tasks run on: the
// new run must take the lease over, not wait for a lock that could expire
// into another allocation's hands meanwhile. A kept lease is good until its
// release cutoff (lockclient.Timing.ReleaseCutoff), from which the server
// may be expiring it and no one may renew, write or release it; the plugin
// forgets it then (and on restart: the gate then waits for its lock like
// any other, see shim.Gate).
type gateLeases struct {
	mu   sync.Mutex
	kept map[string]keptLease
}

type keptLease struct {
	lease shim.AdoptLease
	until time.Time // on lockclient's clock (CLOCK_BOOTTIME)
}

func gateKey(cfg *drivers.TaskConfig) string { return cfg.AllocID + "/" + cfg.Name }

// keep records the lease a destroyed gate left held, if any.
func (g *gateLeases) keep(h *taskHandle) {
	var spec supervisorSpec
	if readJSON(h.dir, specFile, &spec) != nil || spec.Gate == nil {
		return
	}
	var held heldLease
	if readJSON(h.dir, leaseFile, &held) != nil || held.LockID == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.expireLocked()
	if g.kept == nil {
		g.kept = map[string]keptLease{}
	}
	var st supervisorStatus
	_ = readJSON(h.dir, statusFile, &st)
	renewed := lastRenew(held, st)
	if renewed.IsZero() {
		return
	}
	g.kept[gateKey(h.cfg)] = keptLease{
		lease: shim.AdoptLease{LockID: held.LockID, Fence: held.Fence},
		until: lockclient.Timing{TTL: held.TTL, LockDelay: held.LockDelay}.ReleaseCutoff(renewed),
	}
	h.logger.Info("gate ended holding its lock: kept for a restart in this allocation", "fence", held.Fence)
}

// take returns (and forgets) the lease kept for the task's gate, or nil.
func (g *gateLeases) take(cfg *drivers.TaskConfig) *shim.AdoptLease {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.expireLocked()
	k, ok := g.kept[gateKey(cfg)]
	if !ok {
		return nil
	}
	delete(g.kept, gateKey(cfg))
	return &k.lease
}

func (g *gateLeases) expireLocked() {
	now := lockclient.BootNow()
	for key, k := range g.kept {
		if !now.Before(k.until) {
			delete(g.kept, key)
		}
	}
}

// supersedeGate ends the supervisor of an earlier start of the same gate
// (same allocation and task) that still runs, and returns its lease for the
// new one to take over. Nomad starts a gate again while one runs only when
// it lost the first: the agent restarted while StartTask waited for the lock
// (Nomad keeps no handle for a start that has not returned, and reattaches
// to this plugin), or it could not recover the task. Left alone, the first
// would hold (or win) the lock for nobody, and the new one would wait for it
// for ever. The gated tasks never started for a start Nomad lost, and for a
// task Nomad could not recover the new gate takes the lease over, so they
// are never left without it.
func (d *Driver) supersedeGate(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	var adopt *shim.AdoptLease
	for _, old := range d.tasks.all() {
		if old.holding == nil || old.cfg.ID == cfg.ID || old.cfg.AllocID != cfg.AllocID || old.cfg.Name != cfg.Name || old.exited() {
			continue
		}
		var held heldLease
		_ = readJSON(old.dir, leaseFile, &held)
		if err := old.kill("superseded by a new start of the same gate"); err != nil {
			old.logger.Error("end the superseded gate supervisor", "error", err)
		}
		d.tasks.delete(old.cfg.ID)
		if err := removeTaskState(root, old.cfg); err != nil {
			old.logger.Warn("remove the superseded gate's state dir", "error", err)
		}
		if held.LockID != "" {
			old.logger.Info("a new start of this gate takes its lease over", "fence", held.Fence)
			adopt = &shim.AdoptLease{LockID: held.LockID, Fence: held.Fence}
		}
	}
	return adopt
}
