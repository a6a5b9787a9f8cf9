package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// waitHolding returns once a task that starts on lock holds its lock. A
// gate: Nomad starts the group's other tasks only when StartTask has
// returned (a prestart sidecar is then running), so a standby never starts
// them. A start = "on_lock" task: Nomad registers its services and runs its
// poststart tasks only then, so only on the holder. A task whose supervisor
// ends first (its allocation stopped while it waited, a job it cannot gate
// safely, no permission) fails to start, with its reason.
func (d *Driver) waitHolding(h *taskHandle, root *securefs.Dir, path string) error {
	msg := onLockWaitingMessage(path)
	if h.gate {
		msg = gateWaitingMessage(path)
	}
	d.emitEvent(h.cfg, msg, map[string]string{"lock_state": string(shim.StateWaiting)})
	select {
	case <-h.holding:
		if h.gate {
			d.publishGateLock(h)
			go d.recordGated(h)
		}
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
	if !h.gate {
		return fmt.Errorf("task %q did not take its lock: %s", h.cfg.Name, why)
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
	k := keptLease{Lease: shim.AdoptLease{LockID: held.LockID, Fence: held.Fence, Path: held.Path}, UntilBoot: lockclient.BootNanos(until)}
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

// supersedeStart ends the supervisor of an earlier start of the same task
// that starts on lock (same allocation and task: a gate, or start =
// "on_lock") that still runs, and returns its lease for a new gate to take
// over. Nomad starts such a task again while one runs only when it lost
// the first: the agent restarted while StartTask waited for the lock
// (Nomad keeps no handle for a start that has not returned, and reattaches
// to this plugin), or it could not recover the task. Left alone, the first
// would hold (or win) the lock for nobody, and the new one would wait for it
// for ever. The gated tasks never started for a start Nomad lost, and for a
// task Nomad could not recover the new gate takes the lease over, so they
// are never left without it. A start = "on_lock" task's workload dies with
// its supervisor (its group guard, and the plugin's kill of its cgroup),
// and the new start waits for the lock like any other.
func (d *Driver) supersedeStart(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	var adopt *shim.AdoptLease
	for _, old := range d.tasks.all() {
		if old.holding == nil || old.cfg.ID == cfg.ID || old.cfg.AllocID != cfg.AllocID || old.cfg.Name != cfg.Name || old.exited() {
			continue
		}
		var held heldLease
		_ = readJSON(old.dir, leaseFile, &held)
		if err := old.kill("superseded by a new start of the same task"); err != nil {
			old.logger.Error("end the superseded supervisor", "error", err)
		}
		var spec supervisorSpec
		_ = readJSON(old.dir, specFile, &spec)
		leaseKilled := held.LockID != "" && old.gate && killLeaseGated(old.dir, spec, old.logger)
		d.tasks.delete(old.cfg.ID)
		if err := removeTaskState(root, old.cfg); err != nil {
			old.logger.Warn("remove the superseded task's state dir", "error", err)
		}
		if held.LockID != "" && old.gate && !leaseKilled {
			old.logger.Info("a new start of this gate takes its lease over", "fence", held.Fence)
			adopt = &shim.AdoptLease{LockID: held.LockID, Fence: held.Fence, Path: held.Path}
		}
	}
	if a := d.supersedeUnknown(cfg, root); a != nil {
		adopt = a
	}
	return adopt
}

// supersedeUnknown ends the supervisors of earlier starts of the same task
// (same allocation and task name) that this plugin process does not know:
// the agent restarted, and restarted its plugins, while StartTask waited
// for the lock, so Nomad, which keeps no handle for a start that has not
// returned, starts the task again, and no handle reaches the first start's
// supervisor, which runs on in its own session. It is found by its state
// dir (root-only) and proven by the PID and start time its status records
// (findSupervisor), then SIGKILLed; if it ran a workload, the task cgroup
// is emptied too. Its lock, if it held one, is not released (it may have
// had a workload): a gate's is returned for the new start to take over,
// any other expires on the server.
func (d *Driver) supersedeUnknown(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	if root == nil || !allocIDPattern.MatchString(cfg.AllocID) {
		return nil
	}
	alloc, err := root.Sub(cfg.AllocID, false)
	if err != nil {
		return nil
	}
	defer alloc.Close()
	names, err := alloc.Names()
	if err != nil {
		d.logger.Warn("list the allocation's state dirs", "alloc_id", cfg.AllocID, "error", err)
		return nil
	}
	known := map[string]bool{}
	for _, h := range d.tasks.all() {
		known[url.PathEscape(strings.TrimPrefix(h.cfg.ID, h.cfg.AllocID+"/"))] = true
	}
	prefix := url.PathEscape(cfg.Name + "/")
	var adopt *shim.AdoptLease
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) || known[name] || name == url.PathEscape(strings.TrimPrefix(cfg.ID, cfg.AllocID+"/")) {
			continue
		}
		if a := d.endUnknownStart(cfg, alloc, name); a != nil {
			adopt = a
		}
	}
	return adopt
}

// endUnknownStart ends the supervisor whose state dir is name below alloc
// (see supersedeUnknown) and removes the dir once it is dead.
func (d *Driver) endUnknownStart(cfg *drivers.TaskConfig, alloc *securefs.Dir, name string) *shim.AdoptLease {
	log := d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name, "state_dir", name)
	dir, err := alloc.Sub(name, false)
	if err != nil {
		return nil
	}
	defer dir.Close()
	var st supervisorStatus
	var spec supervisorSpec
	var held heldLease
	_ = readJSON(dir, statusFile, &st)
	_ = readJSON(dir, specFile, &spec)
	_ = readJSON(dir, leaseFile, &held)
	if st.SupervisorPID > 0 && st.SupervisorTicks > 0 {
		proc, err := findSupervisor(st.SupervisorPID, st.SupervisorTicks)
		switch {
		case errors.Is(err, errSupervisorGone):
		case err != nil:
			log.Error("an earlier start of this task may still run; not removing its state", "pid", st.SupervisorPID, "error", err)
			return nil
		default:
			log.Warn("ending the supervisor of an earlier start of this task that the plugin no longer knows "+
				"(the agent restarted while it waited for the lock)", "pid", st.SupervisorPID, "lock_state", st.State)
			_ = proc.signal(syscall.SIGKILL)
			gone := make(chan struct{})
			go func() { _, _ = proc.wait(); close(gone) }()
			select {
			case <-gone:
			case <-time.After(killWait):
				log.Error("the earlier start's supervisor did not exit after SIGKILL; not removing its state", "pid", st.SupervisorPID)
				return nil
			}
		}
	} else if st.SupervisorPID > 0 {
		log.Warn("an earlier start of this task records no supervisor start time; leaving it alone", "pid", st.SupervisorPID)
		return nil
	}
	if st.WorkloadPID != 0 {
		if cg, err := newTaskCgroup(cfg); err == nil && cg != nil {
			if err := cg.KillAll(killWait); err != nil {
				log.Error("empty the task cgroup of the earlier start", "error", err)
			}
		}
	}
	leaseKilled := held.LockID != "" && spec.Gate != nil && killLeaseGated(dir, spec, log)
	if err := alloc.RemoveSub(name); err != nil {
		log.Warn("remove the earlier start's state dir", "error", err)
	}
	d.emitEvent(cfg, supersededStartMessage(), map[string]string{"lock_state": string(shim.StateWaiting)})
	if held.LockID != "" && spec.Gate != nil && !leaseKilled {
		return &shim.AdoptLease{LockID: held.LockID, Fence: held.Fence, Path: held.Path}
	}
	return nil
}

// killLeaseGated, for a superseded gate in lease mode whose supervisor
// is dead, kills and proves dead its gated tasks, from the record in its
// state dir, and reports whether it did: the new start then does not
// adopt the lease (no heartbeat was written since the supervisor died, and
// a standby may seal it before the new start writes one), and waits for
// the lock. Not in lease mode, or when the kill fails, it reports false,
// and the new start adopts the lease as in lock mode.
func killLeaseGated(dir *securefs.Dir, spec supervisorSpec, log hclog.Logger) bool {
	if spec.Mode != shim.ModeLease || spec.Gate == nil {
		return false
	}
	var rec gatedRecord
	if err := readJSON(dir, gatedFile, &rec); err != nil || rec.AllocID != spec.Gate.AllocID {
		log.Warn("lease mode: no record of the superseded gate's gated tasks; the new start adopts its lease", "error", err)
		return false
	}
	k, err := newGatedKiller(rec, gatedEnvOf(spec))
	if err != nil {
		log.Warn("lease mode: cannot kill the superseded gate's gated tasks; the new start adopts its lease", "error", err)
		return false
	}
	defer k.close()
	ctx, cancel := context.WithTimeout(context.Background(), confirmDeadWithin)
	defer cancel()
	if err := k.KillAll(ctx); err != nil || len(k.LeftToNomad()) > 0 {
		log.Warn("lease mode: the superseded gate's gated tasks are not all proven dead; the new start adopts its lease",
			"error", err, "left_to_nomad", k.LeftToNomad())
		return false
	}
	log.Info("lease mode: the superseded gate's gated tasks are proven dead; the new start waits for the lock")
	return true
}

// gateLockFile is the file, in the allocation's shared dir
// (${NOMAD_ALLOC_DIR}), where a gate tells its gated tasks the lock it
// holds for them: NOMAD_LOCK_PATH, NOMAD_LOCK_FENCE and, for a
// semaphore's slot, NOMAD_LOCK_SLOT, one NAME=value a line. Nomad gives
// the other tasks of the group no variable of the gate's, so the file is
// how they learn their slot.
const gateLockFile = "nomad-lock.env"

// publishGateLock writes gateLockFile once the gate holds, before
// StartTask returns: Nomad starts the gated tasks only then, so each reads
// the lease its gate holds. The shared dir is writable by the tasks: the
// file is created afresh and renamed over whatever is there, never
// through a symlink (securefs.ReplaceBeneath).
func (d *Driver) publishGateLock(h *taskHandle) {
	var held heldLease
	if err := readJSON(h.dir, leaseFile, &held); err != nil || held.LockID == "" {
		h.logger.Warn("gate: no lease recorded; the gated tasks get no "+gateLockFile, "error", err)
		return
	}
	var spec supervisorSpec
	_ = readJSON(h.dir, specFile, &spec)
	body := gateLockEnv(held, spec.Path, spec.Holders)
	if err := securefs.ReplaceBeneath(h.cfg.AllocDir, allocdir.SharedAllocName, gateLockFile, []byte(body), 0o644); err != nil {
		h.logger.Warn("gate: write the lock for the gated tasks", "file", gateLockFile, "error", err)
	}
}

// gateLockEnv is gateLockFile's text for the lease held: its slot is the
// one of the semaphore of holders slots at prefix whose path it holds.
func gateLockEnv(held heldLease, prefix string, holders int) string {
	body := "NOMAD_LOCK_PATH=" + held.Path + "\nNOMAD_LOCK_FENCE=" + strconv.FormatUint(held.Fence, 10) + "\n"
	for i := range holders {
		if lockclient.SlotPath(prefix, i) == held.Path {
			body += "NOMAD_LOCK_SLOT=" + strconv.Itoa(i) + "\n"
		}
	}
	return body
}
