package driver

import (
	"cmp"
	"fmt"
	"net/url"
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
	d.emitEvent(h.cfg, gateWaitingMessage(path),
		map[string]string{"lock_state": string(shim.StateWaiting)})
	select {
	case <-h.holding:
		go d.recordGated(h)
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
// forgets it then. It is kept in the allocation's root-only state dir
// (keptFile), so that a restart of the plugin or the agent between the two
// runs does not lose it. The new run renews it before it reports itself
// running, so a lease that the server has expired meanwhile fails the gate,
// never two holders.
type gateLeases struct {
	mu sync.Mutex
}

// keptLease is a kept gate lease on disk.
type keptLease struct {
	Lease shim.AdoptLease
	// UntilBoot is its release cutoff, in CLOCK_BOOTTIME nanoseconds
	// (lockclient.BootNanos), which count suspended time and are the same
	// for every process of the host.
	UntilBoot int64
}

// keptFile names a gate's kept lease in its allocation's state dir (beside
// the tasks' dirs, which DestroyTask removes).
func keptFile(cfg *drivers.TaskConfig) string { return "kept-" + url.PathEscape(cfg.Name) + ".json" }

// keep records the lease a destroyed gate left held, if any.
func (g *gateLeases) keep(h *taskHandle, root *securefs.Dir) {
	var spec supervisorSpec
	if root == nil || readJSON(h.dir, specFile, &spec) != nil || spec.Gate == nil {
		return
	}
	var held heldLease
	if readJSON(h.dir, leaseFile, &held) != nil || held.LockID == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	alloc, err := root.Sub(h.cfg.AllocID, true)
	if err != nil {
		h.logger.Error("gate ended holding its lock, which cannot be kept for a restart", "error", err)
		return
	}
	defer alloc.Close()
	var st supervisorStatus
	_ = readJSON(h.dir, statusFile, &st)
	renewed := lastRenew(held, st)
	if renewed.IsZero() {
		return
	}
	until := lockclient.Timing{TTL: held.TTL, LockDelay: held.LockDelay}.ReleaseCutoff(renewed)
	k := keptLease{Lease: shim.AdoptLease{LockID: held.LockID, Fence: held.Fence}, UntilBoot: lockclient.BootNanos(until)}
	if err := writeJSON(alloc, keptFile(h.cfg), k); err != nil {
		h.logger.Error("gate ended holding its lock, which cannot be kept for a restart", "error", err)
		return
	}
	h.logger.Info("gate ended holding its lock: kept for a restart in this allocation", "fence", held.Fence)
	// Forgotten once the server may have expired it (if not taken first).
	cfg := h.cfg
	time.AfterFunc(lockclient.BootUntil(until)+time.Second, func() { _ = g.take(cfg, root) })
}

// take returns (and forgets) the lease kept for the task's gate, or nil.
func (g *gateLeases) take(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	if root == nil || !allocIDPattern.MatchString(cfg.AllocID) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	alloc, err := root.Sub(cfg.AllocID, false)
	if err != nil {
		return nil
	}
	var k keptLease
	err = readJSON(alloc, keptFile(cfg), &k)
	_ = alloc.Remove(keptFile(cfg))
	alloc.Close()
	_ = root.RemoveEmptySub(cfg.AllocID)
	if err != nil || k.Lease.LockID == "" || lockclient.BootNanos(lockclient.BootNow()) >= k.UntilBoot {
		return nil
	}
	return &k.Lease
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
