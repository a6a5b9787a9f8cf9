package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// A supervisor that dies holding the lock (SIGKILL, OOM kill, a crash, or
// the watchdog) would keep it until the server expires it: 2*TTL + lock
// delay. When the node and the plugin are alive nothing needs to wait: the
// plugin proves that every process of the task is gone and then releases the
// lock with the lock ID the supervisor recorded, so a standby takes over at
// once. If any step cannot be confirmed the lock is left to expire: safety
// before speed.
const (
	// confirmDeadWithin bounds the wait for SIGKILLed task processes to disappear.
	confirmDeadWithin = 5 * time.Second
	// crashReleaseTimeout bounds the release request, retries included.
	crashReleaseTimeout = 10 * time.Second
)

// cleanUpAfterExit runs once a supervisor has exited, before Nomad hears of
// the exit. A supervisor that wrote its exit status ran its own stop path:
// it sent its REMOVE (and reported how that went) and tried to release, so
// the plugin sends nothing to the load balancer for it. A REMOVE of ours
// after the lock is free could take out a standby that came up on the same
// host:port; an upstream a failed REMOVE left behind is replaced by the next
// holder's ADD, which removes the previous holder's upstream recorded in the
// lock. Only a supervisor that died without an exit status (SIGKILL, OOM
// kill, the watchdog) gets the crash clean-up: REMOVE, then release.
func (d *Driver) cleanUpAfterExit(h *taskHandle) {
	crashed := !wroteExitStatus(h.dir)
	removed := func(time.Duration) bool { return true }
	if crashed {
		removed = d.removeAfterCrash(h)
	}
	d.releaseAfterCrash(h, crashed, removed)
}

// releaseAfterCrash runs when a supervisor has exited. It does nothing if
// the supervisor released (or tried to release, or never held) the lock:
// after a normal exit the record is left only when the supervisor could not
// prove its workload dead, and the plugin's cgroup may still prove it.
//
// lbRemoved waits for a crashed gate's LB REMOVE (removeAfterCrash): the
// plugin kills the gated tasks once their upstream is out of the load
// balancer (or its REMOVE has failed), and releases only if the REMOVE is
// over, so that no REMOVE of it can reach the LB after the lock is free.
// The wait leaves time for the kill before the server may expire the lock.
func (d *Driver) releaseAfterCrash(h *taskHandle, crashed bool, lbRemoved func(within time.Duration) bool) {
	var held heldLease
	if err := readJSON(h.dir, leaseFile, &held); err != nil {
		return
	}
	log := h.logger.With("lock", held.Path, "fence", held.Fence)
	ann := map[string]string{"lock_state": string(shim.StateReleased), "fence": strconv.FormatUint(held.Fence, 10)}
	whose := whoseCrashed
	switch {
	case held.IdentityRejected:
		whose = whoseIdentityRejected
	case !crashed:
		whose = whoseNotProven
	}

	var spec supervisorSpec
	err := readSpec(h.dir, &spec)
	// gatedKilledAt is when the plugin began the kill of gated tasks it
	// then proved dead (zero: it did not): restarts Nomad schedules after
	// it are its own kill's, which Nomad's kill of the failing allocation
	// cancels first (the static restart rule) and the warden covers.
	var gatedKilledAt time.Time
	h.mu.Lock()
	planned := h.killedByPlugin
	h.mu.Unlock()
	if err == nil && spec.Run.Gate != nil && crashed && !planned && !held.IdentityRejected {
		// A crashed gate's lock covers its gated tasks: the plugin kills
		// them and proves them dead itself, if it can (see gatedtasks.go),
		// and then releases at once.
		st := h.lastStatus()
		removed := lbRemoved(time.Duration(st.StopDeadlineBoot-bootNow()) - 2*confirmDeadWithin)
		killedAt := time.Now()
		all, kerr := d.killGated(h, spec, confirmDeadWithin)
		switch {
		case kerr != nil:
			log.Error("crashed gate's gated tasks not proven dead", "error", kerr)
			whose += fmt.Sprintf(" (its gated tasks are not proven dead: %v)", kerr)
		case !removed:
			whose += " (its load balancer REMOVE is still under way)"
		case !all:
			whose += " (some gated tasks are left to Nomad's kill)"
		default:
			gatedKilledAt = killedAt
		}
	}
	// The release that follows is sent only before the lease's release
	// cutoff (see releaseWith): past it the server may be expiring the lock.
	if err != nil || (spec.Run.Gate != nil && !held.IdentityRejected && gatedKilledAt.IsZero()) {
		// A gate's lock covers its gated tasks, which run in other task
		// cgroups, under other drivers: unless the plugin proved them dead
		// above, the gate now fails and Nomad kills them; the server's
		// expiry (checked at start to outlast their kill_timeout) lets the
		// next holder in.
		log.Warn("gate ended holding the lock: not releasing it while its gated tasks may run")
		if crashed {
			d.emitEvent(h.cfg, crashGateLockKeptMessage(whose, 2*held.TTL+held.LockDelay), ann)
		}
		return // the lease record stays: a restarted gate takes it over (gateLeases)
	}
	if !gatedKilledAt.IsZero() {
		// The warden (armed when the gate first held) kills whatever of
		// them Nomad starts again until its kill of the allocation.
		whose += ", whose gated tasks the plugin killed and proved dead"
	}
	if err := h.killRemains(confirmDeadWithin); err != nil {
		log.Error("supervisor died holding the lock, but its processes are not confirmed dead: not releasing", "error", err)
		d.emitEvent(h.cfg, crashNotReleasedMessage(whose, err, 0), ann)
		return
	}
	via, err := d.releaseHeld(h, held, spec.Run.Gate, gatedKilledAt, log)
	switch {
	case err == nil:
		log.Info("released the lock on behalf of the supervisor", "via", via)
		d.emitEvent(h.cfg, crashReleasedMessage(whose, held.Fence, via), ann)
	case errors.Is(err, lockclient.ErrLost):
		log.Info("the supervisor's lock was already gone", "reason", err)
	case errors.Is(err, lockclient.ErrLeftToExpire):
		log.Warn("not releasing the supervisor's lock: left to expire", "reason", err)
		ann["lock_state"] = string(shim.StateStopping)
		d.emitEvent(h.cfg, crashLeftToExpireMessage(whose, held.Fence, err), ann)
	default:
		log.Error("could not release the supervisor's lock; it expires on the server", "error", err)
		d.emitEvent(h.cfg, crashNotReleasedMessage(whose, err, 2*held.TTL+held.LockDelay), ann)
		return
	}
	_ = h.dir.Remove(leaseFile)
}

// releaseHeld releases the lock in held, whose task is proven dead, with
// the task's own identity; when that no longer authenticates (a purged
// job), with the operator's release_token_file. via says which was used.
//
// A gate's lock covers its gated tasks too: the plugin releases it only
// once Nomad, asked with the operator's token, says that the allocation is
// stopped or gone (its client kills the gated tasks before it stops the
// gate), and marks the release clean first so that the next gate need not
// wait (see shim.gateAwaitPrevious).
func (d *Driver) releaseHeld(h *taskHandle, held heldLease, gate *shim.GateSpec, gatedKilledAt time.Time, log hclog.Logger) (via string, err error) {
	st := h.lastStatus()
	if fresh := (supervisorStatus{}); readJSON(h.dir, statusFile, &fresh) == nil && fresh.LastRenewBoot > st.LastRenewBoot {
		st = fresh
	}
	renewed := lastRenew(held, st)
	if !held.IdentityRejected {
		err = d.releaseWith(h.taskEndpoint(), held, renewed, gate, gatedKilledAt, log)
		if !errors.Is(err, lockclient.ErrIdentityRejected) {
			return "", err
		}
	}
	ep, oerr := d.operatorEndpoint(h)
	if oerr != nil {
		return "", fmt.Errorf("the task's workload identity no longer authenticates (`nomad job stop -purge` removes it with the allocation), and %w", oerr)
	}
	return ", with the plugin's release_token_file", d.releaseWith(ep, held, renewed, gate, gatedKilledAt, log)
}

// releaseWith releases held's lock through ep; a gate's only once its
// gated tasks are dead (gatedKilledAt: the plugin proved it, after a kill it
// began then) or its allocation
// is stopped or gone, and marked clean. Neither is sent from the lease's
// release cutoff on (lockclient.Timing.ReleaseCutoff of lastRenew, the send
// time of its last acknowledged renew, which the supervisor recorded): the
// server may then be expiring the lock, and its expiry would clear the
// next holder's.
func (d *Driver) releaseWith(ep lockclient.Endpoint, held heldLease, lastRenew time.Time, gate *shim.GateSpec, gatedKilledAt time.Time, log hclog.Logger) error {
	locker, err := lockclient.New(lockclient.Config{
		Endpoint:  ep,
		Namespace: held.Namespace,
		Path:      held.Path,
		Timing:    lockclient.Timing{TTL: held.TTL, LockDelay: held.LockDelay},
		Logger:    log,
	})
	if err != nil {
		return err
	}
	if err := locker.Config().MayRelease(lastRenew, lockclient.BootNow()); err != nil {
		return err
	}
	ctx, cancel := lockclient.WithBootTimeout(d.ctx, crashReleaseTimeout)
	defer cancel()
	if gate != nil {
		reader, err := allocs.New(allocs.ConfigOf(locker))
		if err != nil {
			return err
		}
		if gatedKilledAt.IsZero() {
			if err := gateAllocStopped(ctx, reader, gate); err != nil {
				return err
			}
		}
		if why := gatedMayStart(ctx, reader, gate, gatedKilledAt); why != "" {
			log.Warn("not marking the gate's release clean: the next gate waits for Nomad's report", "why", why)
		} else if err := locker.MarkReleasedCleanID(ctx, held.LockID, held.Fence, lastRenew); err != nil {
			log.Warn("cannot mark the gate's release clean; the next gate waits for Nomad's report", "error", err)
		}
	}
	return locker.ReleaseID(ctx, held.LockID, lastRenew)
}

// gatedMayStart says why Nomad may still start one of the gate's gated
// tasks, which neither the kill nor the static restart rule holds back (a
// restart or a first start pending, see shim.GatedPending), or "": a
// release after which one may is not marked clean.
func gatedMayStart(ctx context.Context, reader *allocs.Reader, gate *shim.GateSpec, killedAt time.Time) string {
	alloc, _, err := reader.Allocation(ctx, gate.AllocID, gate.Namespace, 0)
	switch {
	case errors.Is(err, allocs.ErrGone) && !errors.Is(err, allocs.ErrHidden):
		return ""
	case err != nil:
		return fmt.Sprintf("cannot read the allocation (%v)", err)
	}
	if pending := shim.GatedPending(alloc, gate.Task, killedAt); len(pending) > 0 {
		return fmt.Sprintf("Nomad reports %v pending (a restart or a start to come)", pending)
	}
	return ""
}

// gateAllocStopped returns nil once Nomad says the gate's allocation is
// stopped or gone: its client then kills the gated tasks before the gate.
func gateAllocStopped(ctx context.Context, reader *allocs.Reader, gate *shim.GateSpec) error {
	alloc, _, err := reader.Allocation(ctx, gate.AllocID, gate.Namespace, 0)
	switch {
	case errors.Is(err, allocs.ErrHidden):
		return fmt.Errorf("cannot confirm that the gate's allocation is stopped, so its gated tasks may run: "+
			"the release token needs read-job (examples/acl/singleton-release.policy.hcl): %w", err)
	case errors.Is(err, allocs.ErrGone):
		return nil
	case err != nil:
		return fmt.Errorf("cannot confirm that the gate's allocation is stopped, so its gated tasks may run: %w", err)
	case alloc.DesiredStatus == api.AllocDesiredStatusStop || alloc.DesiredStatus == api.AllocDesiredStatusEvict:
		return nil
	}
	return fmt.Errorf("the gate's allocation is not being stopped (desired status %q), so its gated tasks may run", alloc.DesiredStatus)
}

// taskEndpoint is the task's own Task API socket and token: the workload
// identity stays valid while the allocation is not terminal. The socket must
// be served by root (the task user can replace api.sock with its own).
func (h *taskHandle) taskEndpoint() lockclient.Endpoint {
	ep, err := lockclient.DiscoverRootEndpoint(h.cfg.TaskDir().SecretsDir, func(k string) string { return h.cfg.Env[k] })
	if err != nil {
		h.logger.Debug("task endpoint", "error", err)
	}
	return ep
}

// killRemains SIGKILLs whatever is left of the task, the supervisor
// included, and waits until nothing is left. Only the task cgroup can prove
// that: a process group misses whatever called setsid, and a PID read from a
// file may by now belong to someone else. Without a task cgroup nothing is
// proven, and the caller must let the lock expire.
func (h *taskHandle) killRemains(within time.Duration) error {
	if h.cgroup == nil {
		return errors.New("no task cgroup (cgroups are disabled on this client), so the task's processes cannot be proven dead")
	}
	return h.cgroup.KillAll(within)
}

// removeAfterCrash takes a dead supervisor's upstream out of the load
// balancer when it registered and never deregistered. It runs before the
// crash release, so a standby that reuses the same host:port can never be
// removed by it.
//
// A gate's upstream is its gated task's, and the gate's failure is what
// makes Nomad kill that task: the plugin reports it at once and sends the
// REMOVE beside it, so that Nomad's kill is not held up (the gated tasks
// must be dead before the server can expire the lock, see
// shim.checkGateJob). The REMOVE must be over by the gate's stop deadline,
// which comes before the lock can expire: no next holder can have
// registered the same host:port. The returned func waits for it, at most
// within, and says whether it is over: the plugin's own kill of the gated
// tasks comes after, and its release only once the REMOVE is over.
func (d *Driver) removeAfterCrash(h *taskHandle) (wait func(within time.Duration) bool) {
	wait = func(time.Duration) bool { return true }
	var reg lbRegistration
	if err := readJSON(h.dir, lbFile, &reg); err != nil {
		return wait
	}
	var spec supervisorSpec
	if readSpec(h.dir, &spec) != nil || spec.Run.Gate == nil {
		d.removeCrashedUpstream(h, reg, reg.Config.WithDefaults().RemoveDeadline+crashReleaseTimeout, true)
		return wait
	}
	st := h.lastStatus()
	left := time.Duration(st.StopDeadlineBoot - bootNow())
	if st.StopDeadlineBoot == 0 || left <= 0 {
		h.logger.Warn("crashed gate's upstream not removed from the load balancer: its stop deadline has passed", "upstream", reg.Upstream.Upstream)
		d.emitEvent(h.cfg, crashLBRemoveSkippedMessage(reg.Upstream.Upstream, reg.Config.ServiceID),
			map[string]string{"upstream": reg.Upstream.Upstream})
		return wait
	}
	// The state dir may be gone by the time the REMOVE is over.
	_ = h.dir.Remove(lbFile)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.removeCrashedUpstream(h, reg, left, false)
	}()
	return func(within time.Duration) bool {
		t := time.NewTimer(max(within, 0))
		defer t.Stop()
		select {
		case <-done:
			return true
		case <-t.C:
			return false
		}
	}
}

// removeCrashedUpstream sends the REMOVE of a crashed supervisor's
// upstream within budget; dropRecord removes the record once it succeeded.
func (d *Driver) removeCrashedUpstream(h *taskHandle, reg lbRegistration, budget time.Duration, dropRecord bool) {
	log := h.logger.With("upstream", reg.Upstream.Upstream, "service_id", reg.Config.ServiceID)
	client, err := lbhook.NewClient(reg.Config, lbhook.ClientOptions{Logger: log, Getenv: func(k string) string { return h.cfg.Env[k] }})
	if err != nil {
		log.Error("cannot reach the load balancer to remove the crashed supervisor's upstream", "error", err)
		return
	}
	defer client.Close()
	hook, err := client.ForAlloc(reg.AllocID, reg.Fence)
	var resp lbhook.BaragonResponse
	if err == nil {
		ctx, cancel := context.WithTimeout(d.ctx, budget)
		resp, err = hook.Remove(ctx, reg.Upstream)
		cancel()
	}
	if err != nil {
		log.Error("could not remove the crashed supervisor's upstream from the load balancer", "error", err)
		d.emitEvent(h.cfg, crashLBRemoveFailedMessage(err, reg.Config, reg.Upstream.Upstream), map[string]string{"upstream": reg.Upstream.Upstream})
		return
	}
	if dropRecord {
		_ = h.dir.Remove(lbFile)
	}
	log.Info("removed the crashed supervisor's upstream from the load balancer")
	d.emitEvent(h.cfg, crashLBRemovedMessage(reg.Upstream.Upstream, resp),
		map[string]string{"upstream": reg.Upstream.Upstream})
}
