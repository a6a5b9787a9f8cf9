package shim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
)

// A gate makes the supervisor hold the lock for the other tasks of its
// allocation (its gated tasks), of any driver. It builds on three facts of
// Nomad's task lifecycle (client/allocrunner, v1.11):
//
//   - main tasks start only once every prestart sidecar is running, and the
//     driver reports the gate running only once the lock is held, so a
//     standby never starts a gated task;
//   - when an allocation stops, Nomad kills its main tasks first, waits for
//     them, and only then kills its sidecars, so the gate is asked to stop
//     after its gated tasks are dead;
//   - when a task fails for good (restart attempts = 0), Nomad kills every
//     other task of the allocation ("sibling failed"), locally, without the
//     servers.
//
// The gate releases only when its gated tasks are proven dead and cannot
// run again beside the next holder (mayRelease); otherwise it keeps the
// lock and lets the server expire it. If the gate loses the lock (or its
// supervisor dies) it fails, and Nomad kills the gated tasks: they are dead
// within their kill_timeout, which the gate checks at start to fit before
// the server can expire the lock (see checkGateJob). The rule, argued
// against every path, is docs/gate.md's.
//
// gateHook is a gate's part in the run's life cycle. PreAcquire: it checks
// the job before the lock is taken, records in the holder's record whether
// it kills every gated task itself, adopts a restarted gate's lease, and
// ends the wait for the lock when the allocation is being stopped. Held:
// it waits for the previous holder's gated tasks. Holding: it drains the
// run (the gated task's LB REMOVE) once the allocation is being stopped,
// before Nomad kills the gated tasks. Stopping: it notes what it knew of
// its allocation when the stop came. Release: it decides, by the gate's
// rule, whether the lock may be released and marked clean, killing the
// gated tasks itself where the ending asks for it; and a gate exits
// non-zero unless Nomad stopped it, so that Nomad kills its gated tasks.
type gateHook struct {
	spec   GateSpec
	path   string // the lock's, for events
	locker *lockclient.Locker
	allocs *allocs.Reader
	emit   Emitter
	log    hclog.Logger
	// w is the gated tasks, the run's workload (or part of it).
	w *gatedWorkload
	// pluginReleases: a plugin stands behind the gate and releases with its
	// own token what the gate's identity no longer can (Config).
	pluginReleases bool

	// watch closes once the allocation is seen being stopped (or gone)
	// while the gate holds; at is what was known when a stop arrived.
	watch <-chan struct{}
	at    stopArrival
	// began is when this run began (PreAcquire): a restart of the whole
	// allocation after it is what stops this run (restartedAll), which a
	// step-down's Stopping asks the servers about (wholeRestart).
	began        time.Time
	wholeRestart <-chan bool
}

// itemGatedDirect is the holder's record of a gate that kills every gated
// task itself (gatedWorkload.kill) on every ending but Nomad's own stop of
// its allocation: they are dead by its fence deadline, so the lock's
// expiry is safe to trust and the next gate need not wait for Nomad's
// report of them. Part of our on-Nomad format: keep it stable.
const itemGatedDirect = "gated_direct"

// gateWho says, in a permission error, what reads the allocation.
const gateWho = "A gate reads allocations (its own job and desired status, the previous holder's tasks)"

func (h *gateHook) Name() string { return "gate" }

// PreAcquire refuses a job that cannot be gated safely (check), then takes
// the previous run's lease over if there is one; else the acquire records
// whether the gate kills every gated task itself, and the wait ends when
// the allocation is being stopped: Nomad cannot kill a task that it has
// not seen start.
func (h *gateHook) PreAcquire(ctx context.Context, resp *PreAcquireResponse) error {
	h.began = time.Now()
	if err := h.check(ctx); err != nil {
		h.log.Error("gate: not taking the lock", "error", err)
		h.emit.Emit(Event{State: StateStopping, Message: gateNotStartedMessage(err)})
		var ge *GateConfigError
		var pe *allocs.PermissionError
		switch {
		case errors.As(err, &ge):
			return &Failure{Code: ExitConfig, Err: err}
		case errors.As(err, &pe):
			return &Failure{Code: ExitPermission, Err: err}
		}
		return &Failure{Code: ExitInfra, Err: err}
	}
	if h.spec.Adopt != nil {
		l, err := h.adopt(ctx)
		if err != nil {
			h.log.Error("gate: cannot take over the previous run's lease", "error", err)
			h.emit.Emit(Event{State: StateLost, Fence: h.spec.Adopt.Fence, Message: gateAdoptFailedMessage(err)})
			return &Failure{Code: ExitLost, Err: err}
		}
		resp.Lease = l
		return nil
	}
	if h.w.allDirect() {
		resp.AddItems(map[string]string{itemGatedDirect: "true"})
	}
	resp.AbortWait = append(resp.AbortWait, allocStopping(ctx, h.allocs, h.log, h.spec.AllocID, h.spec.Namespace))
	return nil
}

// Held waits for the previous holder's gated tasks (awaitPrevious).
func (h *gateHook) Held(_ context.Context, lease *lockclient.Lease) error {
	if !h.awaitPrevious(lease) {
		return errLeaseEnded
	}
	return nil
}

// errLeaseEnded: the lease ended while a hook waited.
var errLeaseEnded = errors.New("the lease ended while the gate waited for the previous holder's gated tasks")

// Holding watches the allocation: once it is being stopped, the run is
// drained (its upstream REMOVEd) before Nomad kills the gated tasks.
func (h *gateHook) Holding(ctx context.Context, _ *lockclient.Lease) (<-chan HookEvent, error) {
	h.watch = allocStopping(ctx, h.allocs, h.log, h.spec.AllocID, h.spec.Namespace)
	out := make(chan HookEvent)
	go func() {
		select {
		case <-h.watch:
			select {
			case out <- HookEvent{Drain: true}:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	return out, nil
}

// Stopping records, the moment Nomad's stop arrives, whether the
// allocation was already seen being stopped, and else reads it at once:
// the release is decided from that, not from what is true once the gated
// task's LB REMOVE is done (see mayRelease).
func (h *gateHook) Stopping(_ context.Context, req StoppingRequest, _ *StoppingResponse) {
	if req.End == EndStepDown && req.Lease != nil {
		// The servers' word on the restart, read while the gated tasks die.
		whole := make(chan bool, 1)
		go func() { whole <- h.restartedAll(req.Lease) }()
		h.wholeRestart = whole
		return
	}
	if req.End != EndStopRequest {
		return
	}
	if chans.Closed(h.watch) {
		h.at = stopArrival{seen: true}
		return
	}
	h.at = h.readAtStop()
}

// Release decides by the gate's rule (mayRelease) once the workload (a
// gate's command) is proven dead. A gate exits 0 only when Nomad stopped
// it. On any other ending it must fail, so that Nomad kills the tasks it
// gates (a prestart sidecar that exits 0 is done, and its siblings run
// on).
func (h *gateHook) Release(_ context.Context, req ReleaseRequest, resp *ReleaseResponse) {
	if req.End != EndStopRequest && req.End != EndStepDown {
		resp.Fail = true
	}
	if !req.Proven {
		return
	}
	release, clean, leftTo := h.mayRelease(req.Lease, req.End, h.at)
	switch {
	case !release:
		resp.Keep = true
		if leftTo != nil {
			resp.Why = leftTo
		}
	case clean:
		resp.MarkClean = true
	default:
		resp.NotClean = true
	}
}

func (h *gateHook) Released(error) {}

// killHeld is the gated workload's kill for a lease that is still ours:
// if the gated tasks cannot be proven dead, the holder's record no longer
// claims that the gate kills them all (so the next holder waits for
// Nomad's report of them instead of trusting the lock's expiry), and the
// lease is left to expire.
func (h *gateHook) killHeld(lease *lockclient.Lease, why string) bool {
	if h.w.kill(lease, why) {
		return true
	}
	if h.w.allDirect() {
		ctx, cancel := context.WithTimeout(context.Background(), h.locker.Config().RequestTimeout)
		defer cancel()
		if err := lease.SetItem(ctx, itemGatedDirect, ""); err != nil {
			h.log.Error("gate: cannot withdraw the record that it kills its gated tasks itself", "error", err)
		}
	}
	return false
}

// check reads the gate's allocation, plans its gated tasks' kill and
// checks its job (checkGateJob).
func (h *gateHook) check(ctx context.Context) error {
	alloc, err := readOwnAlloc(ctx, h.allocs, h.log, h.spec.AllocID, h.spec.Namespace, gateWho)
	if err != nil {
		return err
	}
	direct := h.w.plan(alloc, h.spec.Task)
	gated, err := checkGateJob(alloc, h.spec.Task, h.w, h.locker.Config().Timing, direct)
	if err != nil {
		return err
	}
	h.w.gated = gated
	h.log.Info("gate: holding the lock for the group's other tasks", "gated", strings.Join(gated, ","))
	h.emit.Notice(Event{State: StateWaiting, Message: h.w.killerMessage(h.locker.Config().Timing)})
	return nil
}

// stopArrival is what the gate knew of its allocation when Nomad's stop
// (StopTask) arrived: whether its watch had already seen the allocation
// being stopped, and else one read of it made at once.
type stopArrival struct {
	seen  bool
	alloc *api.Allocation
	err   error
}

// readAtStop reads the gate's allocation as a stop arrives.
func (h *gateHook) readAtStop() stopArrival {
	ctx, cancel := context.WithTimeout(context.Background(), 2*h.locker.Config().RequestTimeout)
	defer cancel()
	alloc, _, err := h.allocs.Allocation(ctx, h.spec.AllocID, h.spec.Namespace, 0)
	return stopArrival{alloc: alloc, err: err}
}

// mayRelease reports whether the gate may release, and whether it may
// mark the release clean; it first kills the gated tasks itself where the
// ending asks for it (gatedWorkload.kill). leftTo, when it keeps the lock,
// says why someone else may release it (the plugin, for an identity that
// no longer authenticates).
//
// The lock passes from the gate's allocation only when its gated tasks are
// proven dead and Nomad cannot run them again beside the next holder: a
// gated task killed from outside is a task exit to Nomad, which restarts
// it in place after its restart delay until its own kill of the
// allocation has begun (docs/gate-nomad.md). Two things keep it dead
// until then: the static rule checked at start (checkDirectRestart: the
// delay outlasts the group's shutdown_delay and the kill, so a task killed
// now is restarted only after Nomad's kill, which follows the gate's
// failure, has begun), and the plugin's warden, which kills whatever gated
// task of the allocation starts while no run of this gate holds. Neither
// covers a restart that was already pending when the gate killed (a task
// that crashed on its own, or is still starting): the release is then not
// marked clean (noneRestartable), and the next gate waits for Nomad's
// report that those tasks are dead for good.
//
// Nomad's own stop of the allocation: the client kills the group's main
// tasks and waits for each to be dead before it stops its sidecars, the
// gate among them (allocrunner.killTasks, Nomad v1.11). The gate knows it
// is such a stop when its watch had seen the allocation's desired status
// turn stop or evict (or the allocation gone) before the stop arrived; it
// still proves what it can kill itself dead (a restart of the gate that
// raced the allocation's stop comes while they run, in the group's
// shutdown_delay), and marks the release clean only if it kills every
// gated task itself. A stop the watch had not yet seen is decided by a
// read made as it arrives.
//
// A restart of the gate (Nomad stopped it while the allocation runs on),
// in lock and lease mode alike: the gate keeps the lease and kills
// nothing, the plugin keeps the lease for the restarted run to take over
// before its fence deadline (driver gateLeases), and past it kills the
// gated tasks itself. Every other Ending (the lock lost, a signal, a
// failed LB ADD, the gate's command ended) kills the gated tasks the gate
// can kill itself; the lock is then released only if the lease is still
// ours and every gated task is proven dead; otherwise it expires on the
// server, after Nomad has killed the rest.
func (h *gateHook) mayRelease(lease *lockclient.Lease, end Ending, at stopArrival) (release, clean bool, leftTo error) {
	cfg := h.locker.Config()
	expiry := 2*cfg.TTL + cfg.LockDelay
	if chans.Closed(lease.Lost()) {
		// Never released while the gated tasks may run, even if the
		// server still holds it for us.
		killed := h.w.kill(lease, "the lock was lost")
		var direct []string
		if h.w.killer != nil && killed {
			direct = h.w.direct
		}
		left := h.w.leftToNomad()
		if !killed {
			left = h.w.gated
		}
		h.emit.Emit(leaseEvent(StateLost, lease, gateLostMessage(direct, left)))
		return false, false, nil
	}
	provenDead := func(why string) bool {
		return h.killHeld(lease, why) && h.w.allDirect() && !chans.Closed(lease.Lost())
	}
	var why string
	switch {
	case end == EndStopRequest && at.seen:
		// Released in any case (the next gate waits for Nomad's report
		// unless it is marked clean): Nomad's kill of the allocation is
		// under way. Not asked whether one is pending: the servers lag
		// (a task Nomad restarted a moment ago shows pending), and Nomad's
		// kill of the main tasks, which comes before it stops the gate,
		// cancels their restarts; should this stop be a restart of the
		// gate racing it (L3), a restart already due in the group's
		// shutdown_delay is the warden's.
		killed := h.killHeld(lease, "")
		if chans.Closed(lease.Lost()) {
			why = "the lock was lost while the allocation was being stopped"
			break
		}
		return true, killed && h.w.allDirect(), nil
	case end == EndStopRequest:
		alloc, err := at.alloc, at.err
		switch {
		case errors.Is(err, allocs.ErrGone):
			return true, true, nil
		case errors.Is(err, lockclient.ErrIdentityRejected) && h.pluginReleases:
			// A purged job's identity no longer authenticates: the
			// plugin asks Nomad with the operator's token whether the
			// allocation is stopped or gone before it releases.
			h.log.Warn("gate: the allocation's identity no longer authenticates; leaving the release to the plugin", "error", err)
			h.emit.Emit(stoppingEvent(lease, gateIdentityRejectedMessage(expiry)))
			return false, false, err
		case err != nil:
			why = fmt.Sprintf("cannot read whether the allocation is being stopped (%v)", err)
		case alloc.DesiredStatus == api.AllocDesiredStatusStop || alloc.DesiredStatus == api.AllocDesiredStatusEvict:
			if len(previousGatedAlive(alloc, h.spec.Task)) == 0 {
				// Reported dead, not pending: Nomad's kill ended them.
				return true, true, nil
			}
			// Being stopped, so Nomad kills them anyway: a kill of our
			// own loses them nothing but their shutdown_delay, and proves
			// them dead.
			if provenDead("the allocation turned stop as the gate was stopped") {
				return true, h.noneRestartable(), nil
			}
			why = "the allocation was seen being stopped only after the gate's stop arrived (a restart of the gate may have raced it), " +
				"and Nomad does not yet report the gated tasks dead"
		default:
			h.log.Info("gate: stopped while its allocation runs on (a restart): keeping the lease for the restarted gate")
			h.emit.Emit(stoppingEvent(lease, gateKeptForRestartMessage(h.w.gated, lockclient.BootUntil(lease.FenceDeadline()))))
			return false, false, nil
		}
	case end == EndStepDown:
		// lock step-down restarted the whole allocation (a Stopping hook
		// made Nomad's stop a step-down): Nomad kills every task, and its
		// lifecycle coordinator, reset, starts the gated tasks again only
		// once this gate's restarted run holds the lock again. The gate
		// proves them dead itself, and marks the release clean once the
		// servers show that restart (restartedAll): a restart of the gate
		// alone would leave their restarts to the warden.
		if provenDead("a step-down: Nomad restarts the allocation") {
			if h.wholeRestart == nil {
				return true, h.restartedAll(lease), nil
			}
			return true, <-h.wholeRestart, nil
		}
		why = "a step-down, but the gate could not prove its gated tasks dead"
	default:
		if provenDead("the gate stopped: " + end.String()) {
			return true, h.noneRestartable(), nil
		}
		why = "the gate stopped by itself (" + end.String() + ")"
	}
	h.log.Warn("gate: not releasing the lock", "why", why)
	h.emit.Emit(stoppingEvent(lease, gateLockKeptMessage(why, h.w.gated, expiry)))
	return false, false, nil
}

// restartEvidenceWait bounds restartedAll's wait for the servers.
const restartEvidenceWait = 10 * time.Second

// restartedAll reports whether the servers show that Nomad restarted the
// gate's whole allocation since this run began (RestartedWhole). The event
// reaches the servers with the client's next update, so it waits for it
// with blocking reads, until the lease's fence deadline or
// restartEvidenceWait. A failed read says nothing, so no.
func (h *gateHook) restartedAll(lease *lockclient.Lease) bool {
	deadline := earliest(time.Now().Add(restartEvidenceWait), time.Now().Add(lockclient.BootUntil(lease.FenceDeadline())))
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var index uint64
	start := time.Now()
	for ctx.Err() == nil {
		alloc, next, err := h.allocs.Allocation(ctx, h.spec.AllocID, h.spec.Namespace, index)
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("gate: cannot read whether Nomad restarts the whole allocation; not marking the release clean", "error", err)
			}
			return false
		}
		if RestartedWhole(alloc, h.spec.Task, h.began) {
			h.log.Info("gate: the servers show Nomad restarting the whole allocation", "took", time.Since(start).Round(time.Millisecond))
			return true
		}
		index = max(next, index+1)
	}
	h.log.Warn("gate: the servers do not show a restart of the whole allocation; not marking the release clean, so the next gate waits for Nomad to report the gated tasks dead")
	return false
}

// noneRestartable reports whether the servers show no gated task of the
// gate's allocation that Nomad may still start: none pending (a restart
// under way, or a first start still to come: image pull, prestart hooks).
// Such a task's start is not held back by the gate's kill, nor by the
// static restart rule, whose delay counts from the kill; the release is
// then not marked clean, and the next gate waits for Nomad to report it
// dead for good. A task that died since the servers last heard (a second
// or so) shows running: its restart comes no sooner than the static rule
// allows. A failed read says nothing, so no.
func (h *gateHook) noneRestartable() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*h.locker.Config().RequestTimeout)
	defer cancel()
	alloc, _, err := h.allocs.Allocation(ctx, h.spec.AllocID, h.spec.Namespace, 0)
	if err != nil {
		h.log.Warn("gate: cannot read whether a gated task is about to start again; not marking the release clean", "error", err)
		return false
	}
	if pending := GatedPending(alloc, h.spec.Task, h.w.killedAt); len(pending) > 0 {
		h.log.Warn("gate: Nomad may start these gated tasks again; not marking the release clean, so the next gate waits for Nomad to report them dead",
			"tasks", strings.Join(pending, ","))
		return false
	}
	return true
}

// awaitPrevious runs once the gate holds the lock, before its gated
// tasks may start: unless the previous holder released clean (it marks
// that in the lock only once its gated tasks are proven dead and none can
// start again, see mayRelease), it waits until Nomad reports them dead
// for good, or as long as they may live.
//
// "Dead for good" is the servers' word: each gated task of that
// allocation dead (a task runner reports dead once it will not restart the
// task), or the allocation complete, failed or gone. A pending task counts
// as alive: a restart may be due (a gated task that a gate or the plugin
// killed is restarted by Nomad until its own kill of the allocation has
// begun), or a start still to come (an image pull, prestart hooks), or it
// may have started already (the client reports a start up to a second
// later). A gate that was killed, or whose kill failed, is no proof either.
// So while the servers are in touch with the previous holder's client the
// wait lasts until they say so, however long.
//
// Two records end it sooner:
//
//   - Lease mode: a standby sealed the previous gate's last heartbeat after
//     seeing it unchanged for L (lockclient.PreviousTakenOver), and that
//     gate recorded that it kills every gated task itself (itemGatedDirect):
//     it fenced itself and killed them by D + K before the seal, and its
//     node's plugin warden kills whatever Nomad starts again until its
//     kill of the allocation. The servers have often not noticed a dead
//     node yet (that is what lease mode is for), so the seal is trusted
//     unless they report a gated task pending.
//   - A client out of the servers' reach (lost, unknown): a previous gate
//     with itemGatedDirect fenced itself at its fence deadline, a TTL before
//     the lock could expire, and killed its gated tasks (a frozen one's,
//     the plugin's watchdog killed), and its warden keeps them dead. One
//     that left gated tasks to Nomad: Nomad there kills them once that
//     gate has failed, within the bound the gate checked at start (its
//     fence deadline, then the group's shutdown_delay and their
//     kill_timeout: 2×TTL + delay), and gateNomadServiceWait more when its
//     group registers Nomad services (their deregistration, an RPC the
//     cut-off client cannot make, comes first).
//
// Reads that keep failing end it at that same bound. It returns false if
// the lease ended meanwhile.
func (h *gateHook) awaitPrevious(lease *lockclient.Lease) bool {
	prev := lease.Previous
	if prev.AllocID == "" || prev.AllocID == h.spec.AllocID || prev.ReleasedClean {
		return true
	}
	gatedDirect := lease.PreviousItem(itemGatedDirect) == "true"
	sealed := gatedDirect && lease.PreviousTakenOver()
	t := h.locker.Config().Timing
	until := time.Now().Add(t.TTL + t.TTL + t.LockDelay)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-lease.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	var index uint64
	announced, extended, outOfReach := false, false, false
	for {
		rctx, rcancel := context.WithCancel(ctx)
		if outOfReach {
			// Its allocation may not change on the servers before the
			// bound: read again then at the latest.
			rctx, rcancel = context.WithDeadline(ctx, until)
		}
		alloc, next, err := h.allocs.Allocation(rctx, prev.AllocID, h.spec.Namespace, index)
		rcancel()
		switch {
		case chans.Closed(lease.Lost()):
			return false
		case errors.Is(err, allocs.ErrGone) && !errors.Is(err, allocs.ErrHidden):
			return true
		case err != nil && (sealed || !time.Now().Before(until)):
			h.log.Warn("gate: cannot read the previous holder's allocation; its time is up", "previous_alloc", prev.AllocID, "error", err)
			return true
		case err != nil:
			h.log.Debug("gate: read the previous holder's allocation", "error", err)
			index = 0
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if !extended && !gatedDirect && hasNomadService(alloc) {
			// Nomad deregisters a task's Nomad services before it kills
			// it, by RPC to the servers: on a client cut off from them
			// that blocks until the connection is given up, and the kill
			// waits.
			extended = true
			until = until.Add(gateNomadServiceWait)
		}
		alive := previousGatedAlive(alloc, h.spec.Task)
		switch {
		case len(alive) == 0:
			if announced {
				h.log.Info("gate: the previous holder's gated tasks are dead", "previous_alloc", prev.AllocID)
			}
			return true
		case sealed && len(GatedPending(alloc, h.spec.Task, time.Time{})) == 0:
			h.log.Info("gate: the previous holder's heartbeat was sealed by a standby: its gated tasks are dead", "previous_alloc", prev.AllocID)
			return true
		case clientOutOfReach(alloc) && (gatedDirect || !time.Now().Before(until)):
			h.log.Info("gate: the previous holder's client is out of the servers' reach; it fenced itself, and its gated tasks are dead by now",
				"previous_alloc", prev.AllocID, "client_status", alloc.ClientStatus)
			return true
		}
		if !announced {
			announced = true
			h.log.Warn("gate: the lock was free while the previous holder's gated tasks may still run; waiting for Nomad to report them dead",
				"previous_alloc", prev.AllocID, "tasks", strings.Join(alive, ","))
			h.emit.Emit(Event{State: StateWaiting, Fence: lease.Fence, Holder: prev, Message: gateAwaitPreviousMessage(h.path, prev, alive)})
		}
		index, outOfReach = next, clientOutOfReach(alloc)
	}
}

// adopt takes over the lease of the gate's previous run (see
// GateSpec.Adopt). Transport errors are retried for half a TTL, and never past
// the lease's fence deadline; a lease that is gone ends the gate, which
// then fails, so that Nomad kills its gated tasks (and the plugin's warden
// kills them meanwhile).
func (h *gateHook) adopt(ctx context.Context) (*lockclient.Lease, error) {
	a := h.spec.Adopt
	within := h.locker.Config().TTL / 2
	if a.FenceBoot != 0 {
		within = min(within, lockclient.BootUntil(lockclient.BootTime(a.FenceBoot)))
	}
	if within <= 0 {
		return nil, &lockclient.LostError{Reason: fmt.Sprintf("the previous run's lease (fence %d) passed its fence deadline before this run could take it over", a.Fence)}
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		lease, err := h.locker.AdoptPath(ctx, a.Path, a.LockID, a.Fence)
		if err == nil || errors.Is(err, lockclient.ErrLost) || ctx.Err() != nil {
			return lease, err
		}
		h.log.Warn("gate: adopt the previous run's lease, retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
