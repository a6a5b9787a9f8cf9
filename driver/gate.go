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

	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
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
		if !h.gate {
			return nil
		}
		d.publishGateLock(h)
		err := d.armWarden(h, root)
		if err == nil {
			return nil
		}
		h.logger.Error("gate: its gated tasks could not be put under the warden; not letting them start", "error", err)
		_ = h.kill("the gated tasks' warden could not be armed")
		d.tasks.delete(h.cfg.ID)
		if rerr := removeTaskState(root, h.cfg); rerr != nil {
			h.logger.Warn("remove the task's state dir", "error", rerr)
		}
		h.dir.Close()
		return fmt.Errorf("gate %q held its lock, but %w", h.cfg.Name, err)
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
// restarted, or whose template re-rendered (whatever its restart policy),
// while its gated tasks run on: the new run must take the lease over, not
// wait for a lock that could expire into another allocation's hands
// meanwhile. A run leaves its lease for this when it exits 0 holding it
// (its stop came while the allocation runs on), or when the plugin killed
// it to stop, destroy or supersede it. The kept lease may be taken over
// until its fence deadline (lock mode: the last renew + TTL - margin; lease
// mode: the last acknowledged heartbeat + lease_fence, also before the
// release cutoff): until then the gated tasks run under it, and past it
// the plugin's warden kills them (warden.go), gracefully until its stop
// deadline. It is kept in the allocation's root-only state dir (keptFile),
// so that a restart of the plugin or the agent between the two runs does
// not lose it. The new run renews it before it reports itself running
// (lease mode: its heartbeat by check-and-set, so a standby's seal and the
// take-over exclude each other), so a lease that was lost meanwhile fails
// the gate, never two holders.
type gateLeases struct {
	// mu orders keep, take and the warden's reading of who holds.
	mu sync.Mutex
}

// keptLease is a kept gate lease on disk.
type keptLease struct {
	// Lease carries its fence and stop deadlines (FenceBoot, StopBoot).
	Lease shim.AdoptLease
}

// keptFile names a gate's kept lease in its allocation's state dir (beside
// the tasks' dirs, which DestroyTask removes).
func keptFile(cfg *drivers.TaskConfig) string { return keptName(cfg.Name) }

func keptName(task string) string { return "kept-" + url.PathEscape(task) + ".json" }

// keep records the lease a destroyed gate left held for its next run, if
// it may (see gateLeases).
func (g *gateLeases) keep(h *taskHandle, root *securefs.Dir) {
	var spec supervisorSpec
	if root == nil || readSpec(h.dir, &spec) != nil || spec.Run.Gate == nil {
		return
	}
	var held heldLease
	if readJSON(h.dir, leaseFile, &held) != nil || held.LockID == "" {
		return
	}
	h.mu.Lock()
	planned := h.killedByPlugin
	h.mu.Unlock()
	var es exitStatus
	if !planned && (readJSON(h.dir, exitFile, &es) != nil || es.ExitCode != 0) {
		// It failed (a loss, a signal...): Nomad does not restart it, and
		// its gated tasks are the warden's until Nomad's kill.
		return
	}
	var st supervisorStatus
	_ = readJSON(h.dir, statusFile, &st)
	a, ok := keptDeadlines(held, st, spec.Run.LeaseMode())
	if !ok {
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
	if err := writeJSON(alloc, keptFile(h.cfg), keptLease{Lease: a}); err != nil {
		h.logger.Error("gate ended holding its lock, which cannot be kept for a restart", "error", err)
		return
	}
	h.logger.Info("gate ended holding its lock: kept for a restart in this allocation", "fence", held.Fence,
		"until", time.Duration(a.FenceBoot-bootNow()).Round(time.Millisecond))
	// Forgotten once past its fence deadline (if not taken first).
	cfg := h.cfg
	time.AfterFunc(time.Duration(a.FenceBoot-bootNow())+time.Second, func() { _ = g.take(cfg, root) })
}

// keptDeadlines is the lease held, with its fence and stop deadlines, as a
// restarted gate may take it over. The fence deadline is the one the
// supervisor last published (lease mode: its heartbeat's), never past the
// release cutoff; without one, lock mode takes it from the last renew and
// lease mode keeps nothing (when its last heartbeat was is unknown).
func keptDeadlines(held heldLease, st supervisorStatus, leaseMode bool) (shim.AdoptLease, bool) {
	renewed := lastRenew(held, st)
	if renewed.IsZero() {
		return shim.AdoptLease{}, false
	}
	cutoff := lockclient.BootNanos(lockclient.Timing{TTL: held.TTL, LockDelay: held.LockDelay}.ReleaseCutoff(renewed))
	a := shim.AdoptLease{LockID: held.LockID, Fence: held.Fence, Path: held.Path}
	switch {
	case st.Fence == held.Fence && st.FenceDeadlineBoot > 0:
		a.FenceBoot, a.StopBoot = min(st.FenceDeadlineBoot, cutoff), min(st.StopDeadlineBoot, cutoff)
	case leaseMode:
		return a, false
	default:
		a.FenceBoot, a.StopBoot = cutoff-int64(held.TTL), cutoff
	}
	return a, a.FenceBoot > bootNow()
}

// take returns (and forgets) the lease kept for the task's gate, or nil.
// The caller holds g.mu: it writes the new run's spec, which names the
// lease, before the warden may look again (see runHolds).
func (g *gateLeases) takeLocked(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	if root == nil || !allocIDPattern.MatchString(cfg.AllocID) {
		return nil
	}
	alloc, err := root.Sub(cfg.AllocID, false)
	if err != nil {
		return nil
	}
	var k keptLease
	err = readJSON(alloc, keptFile(cfg), &k)
	_ = alloc.Remove(keptFile(cfg))
	alloc.Close()
	_ = root.RemoveEmptySub(cfg.AllocID)
	if err != nil || k.Lease.LockID == "" || bootNow() >= k.Lease.FenceBoot {
		return nil
	}
	return &k.Lease
}

// take is takeLocked for a caller that does not hold g.mu.
func (g *gateLeases) take(cfg *drivers.TaskConfig, root *securefs.Dir) *shim.AdoptLease {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.takeLocked(cfg, root)
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
// task Nomad could not recover the new gate takes the lease over (in lease
// mode too: its heartbeat by check-and-set, so a standby's seal and the
// take-over exclude each other), so they are never left without it. A
// start = "on_lock" task's workload dies with its supervisor (its group
// guard, and the plugin's kill of its cgroup), and the new start waits for
// the lock like any other.
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
		_ = readSpec(old.dir, &spec)
		var st supervisorStatus
		_ = readJSON(old.dir, statusFile, &st)
		d.tasks.delete(old.cfg.ID)
		if err := removeTaskState(root, old.cfg); err != nil {
			old.logger.Warn("remove the superseded task's state dir", "error", err)
		}
		if a, ok := keptDeadlines(held, st, spec.Run.LeaseMode()); held.LockID != "" && old.gate && ok {
			old.logger.Info("a new start of this gate takes its lease over", "fence", held.Fence)
			adopt = &a
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
	_ = readSpec(dir, &spec)
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
	if err := alloc.RemoveSub(name); err != nil {
		log.Warn("remove the earlier start's state dir", "error", err)
	}
	d.emitEvent(cfg, supersededStartMessage(), map[string]string{"lock_state": string(shim.StateWaiting)})
	if a, ok := keptDeadlines(held, st, spec.Run.LeaseMode()); held.LockID != "" && spec.Run.Gate != nil && ok {
		return &a
	}
	return nil
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
	_ = readSpec(h.dir, &spec)
	body := gateLockEnv(held, spec.Run.Path, spec.Run.Holders)
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

// restartedWhole reports whether the servers show that Nomad restarted the
// gate's whole allocation since it last started (shim.RestartedWhole), as
// read with the gate's identity. The previous run, if it stepped down,
// waited to see it there before it marked its release clean.
func (d *Driver) restartedWhole(cfg *drivers.TaskConfig, run shim.Spec) bool {
	ep, err := lockclient.DiscoverRootEndpoint(cfg.TaskDir().SecretsDir, func(k string) string { return cfg.Env[k] })
	if err != nil {
		return false
	}
	reader, err := allocs.New(allocs.Config{Endpoint: ep, Timing: run.Timing()})
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), reader.Config().Timing.RequestTimeout)
	defer cancel()
	alloc, _, err := reader.Allocation(ctx, cfg.AllocID, cfg.Namespace, 0)
	if err != nil {
		d.logger.Warn("gate restart: cannot read whether Nomad restarted the whole allocation", "alloc_id", cfg.AllocID, "error", err)
		return false
	}
	whole := shim.RestartedWhole(alloc, cfg.Name, time.Time{})
	d.logger.Info("gate restarted with no lease to take over", "alloc_id", cfg.AllocID, "whole_allocation_restarted", whole)
	return whole
}
