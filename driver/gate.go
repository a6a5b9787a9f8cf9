package driver

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
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
// into another allocation's hands meanwhile. A kept lease is good until the
// server would have expired it; the plugin forgets it then (and on restart:
// the gate then waits for its lock like any other, see shim.Gate).
type gateLeases struct {
	mu   sync.Mutex
	kept map[string]keptLease
}

type keptLease struct {
	lease shim.AdoptLease
	until time.Time
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
	g.kept[gateKey(h.cfg)] = keptLease{
		lease: shim.AdoptLease{LockID: held.LockID, Fence: held.Fence},
		until: time.Now().Add(2*held.TTL + held.LockDelay),
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
	now := time.Now()
	for key, k := range g.kept {
		if now.After(k.until) {
			delete(g.kept, key)
		}
	}
}
