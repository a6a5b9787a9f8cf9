package shim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Gate makes the supervisor hold the lock for the other tasks of its
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
// The gate releases only when Nomad reports every gated task dead (read with
// the gate's own identity, which needs "read-job"); otherwise it keeps the
// lock and lets the server expire it. If the gate loses the lock (or its
// supervisor dies) it fails, and Nomad kills the gated tasks: they are dead
// within their kill_timeout, which the gate checks at start to fit before
// the server can expire the lock (see checkGateJob).
type Gate struct {
	// AllocID, Task and Namespace name the gate's task (from Nomad, never
	// from the task environment).
	AllocID, Task, Namespace string

	// gated are the tasks the gate holds the lock for, found at start.
	gated []string
	// Adopt is the lease a previous run of this gate, in this allocation,
	// left held (Nomad restarted the gate): the gate renews it instead of
	// acquiring, so its gated tasks, which may run on, never lose cover.
	Adopt *AdoptLease

	// killBound is the longest the gated tasks may take to die once the
	// gate has failed, found at start: the group's shutdown_delay + the
	// task's kill_timeout + shutdown_delay for those Nomad kills, the
	// gate's own kill (gateKillAllTimeout) for the others.
	killBound time.Duration

	// Killer, when set, builds at start the GatedTasks that kill and prove
	// dead, by the gate itself, those of its gated tasks that it can (the
	// driver's docker containers and task cgroups).
	Killer GatedTasksFunc
	// killer and direct are what Killer built: nil and empty without one,
	// or when it kills none of the gated tasks; planned is what it built
	// in any case, which says why a task is left to Nomad.
	killer, planned GatedTasks
	direct          []string
	// tasks are the gated tasks with their drivers; killerErr why Killer
	// failed, if it did.
	tasks     []GatedTask
	killerErr error
	// lease: the gate's lock is in lease mode (docs/lease.md): every gated
	// task must be one it kills itself, dead by lease_fence +
	// lease_kill_grace after its last acknowledged heartbeat.
	lease bool
	// killedAt is when the gate began its first kill of its gated tasks
	// (zero: none): Nomad's restarts scheduled from then on are that
	// kill's (see GatedPending).
	killedAt time.Time
}

// AdoptLease names a lease to take over: its lock ID and fencing token,
// and the lock it holds (for a semaphore, its slot's path; "" is the
// gate's lock path).
type AdoptLease struct {
	LockID string
	Fence  uint64
	Path   string `json:",omitempty"`
	// FenceBoot and StopBoot, when set, are the previous run's fence and
	// stop deadlines (CLOCK_BOOTTIME ns, lockclient.BootNanos). The lease
	// may be taken over only before FenceBoot (lease mode: D after its last
	// acknowledged heartbeat): past it the gated tasks, which ran on under
	// it, have no one to stop them should the lock be lost, and the plugin
	// kills them, gracefully where StopBoot leaves the time.
	FenceBoot int64 `json:",omitempty"`
	StopBoot  int64 `json:",omitempty"`
}

// Timings of a gate.
const (
	// gateNomadServiceWait is added to the wait for a previous holder's
	// gated tasks when they register Nomad services: on a client cut off
	// from the servers, Nomad's kill of a task waits for the RPC that
	// deregisters its services to fail (about 30 s, measured: the old app
	// was gone 41.6 s after the cut, 22 s after the lock expired).
	gateNomadServiceWait = 60 * time.Second
	// gateCheckWithin bounds the retries of the gate's first read of its
	// allocation.
	gateCheckWithin = 10 * time.Second
	// gateIdentityGone is how long the Task API must keep rejecting a
	// waiting gate's identity before the gate takes its allocation for
	// gone (a purged job) rather than the servers for busy.
	gateIdentityGone = 5 * time.Second
	// gateKillSlack is what the bound on the gated tasks' kill_timeout
	// leaves for Nomad to notice the gate's failure and start killing them.
	gateKillSlack = 2 * time.Second
	// gateKillAllTimeout bounds one GatedTasks.KillAll.
	gateKillAllTimeout = 5 * time.Second
	// gateRestartSlack is what may pass between the gate's own kill of a
	// gated task and the start of Nomad's kill, besides the group's
	// shutdown_delay: the rest of the kill, and Nomad noticing that the
	// gate failed (see checkDirectRestart).
	gateRestartSlack = gateKillAllTimeout + gateKillSlack
)

// GateConfigError is a job that cannot be gated safely. Its message names
// the jobspec field to change.
type GateConfigError struct{ Msg string }

func (e *GateConfigError) Error() string { return e.Msg }

// gateGroup finds the gate's task group in its allocation's job.
func gateGroup(alloc *api.Allocation) (*api.TaskGroup, error) {
	if alloc.Job == nil {
		return nil, fmt.Errorf("allocation %s has no job", alloc.ID)
	}
	for _, g := range alloc.Job.TaskGroups {
		if g.Name != nil && *g.Name == alloc.TaskGroup {
			return g, nil
		}
	}
	return nil, fmt.Errorf("allocation %s: group %q is not in its job", alloc.ID, alloc.TaskGroup)
}

// isGated reports whether task, beside the gate, is one the gate holds the
// lock for: a main task or a poststart task that is no sidecar (a
// poststop task runs once every other task is dead; prestart tasks and
// poststart sidecars are refused by checkGateJob).
func isGated(task *api.Task, gate string) bool {
	lc := task.Lifecycle
	return task.Name != gate && (lc == nil || lc.Hook == api.TaskLifecycleHookPoststart && !lc.Sidecar)
}

// GatedTasksOf lists the tasks the gate task gate holds the lock for in
// alloc, with their drivers, in the job's order.
func GatedTasksOf(alloc *api.Allocation, gate string) []GatedTask {
	tg, err := gateGroup(alloc)
	if err != nil {
		return nil
	}
	var out []GatedTask
	for _, t := range tg.Tasks {
		if isGated(t, gate) {
			out = append(out, GatedTask{Name: t.Name, Driver: t.Driver})
		}
	}
	return out
}

// Nomad's defaults where a job leaves them unset.
const (
	nomadKillTimeout  = 5 * time.Second  // kill_timeout
	nomadRestartDelay = 15 * time.Second // restart.delay, service and batch jobs
)

// checkGateJob reads the gate's allocation and checks that its job keeps
// "never two at once": see Gate. It returns the gated tasks. direct names
// the gated tasks the gate kills and proves dead itself (GatedTasks): their
// kill is the gate's, but Nomad must not restart them before its own kill
// begins; the others are Nomad's to kill, within the lock's expiry.
func checkGateJob(alloc *api.Allocation, gate *Gate, t lockclient.Timing, direct map[string]bool) ([]string, error) {
	tg, err := gateGroup(alloc)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return &GateConfigError{Msg: fmt.Sprintf("gate %q: ", gate.Task) + fmt.Sprintf(format, args...)}
	}
	var groupDelay time.Duration
	if tg.ShutdownDelay != nil {
		groupDelay = *tg.ShutdownDelay
	}
	var self *api.Task
	var gated []string
	var errs []error
	gate.killBound = 0
	for _, task := range tg.Tasks {
		switch {
		case task.Name == gate.Task:
			self = task
		case task.Lifecycle != nil && task.Lifecycle.Hook == api.TaskLifecycleHookPoststop:
			// Runs once every other task is dead: nothing to gate.
		case task.Lifecycle != nil && task.Lifecycle.Hook == api.TaskLifecycleHookPrestart:
			errs = append(errs, bad("task %q is a prestart task, so Nomad starts it beside the gate, before the lock is held: "+
				"make it a main task (no lifecycle block) or a poststart task", task.Name))
		case task.Lifecycle != nil && task.Lifecycle.Sidecar:
			errs = append(errs, bad("task %q is a poststart sidecar, so Nomad stops it beside the gate, not before it: "+
				"make it a main task (no lifecycle block)", task.Name))
		case direct[task.Name]:
			gated = append(gated, task.Name)
			gate.killBound = max(gate.killBound, gateKillAllTimeout)
			if err := checkDirectRestart(task, tg, groupDelay); err != nil {
				errs = append(errs, bad("%s", err))
			}
			// Whenever the gate's own kill fails (the engine hung, a
			// process stuck in the kernel), Nomad's kill is what ends it.
			if err := checkNomadKill(task, groupDelay, t, "the gate kills it itself, but whenever that kill fails "+
				"Nomad's kill, after the gate has failed, is what ends it"); err != nil {
				errs = append(errs, bad("%s", err))
			}
		case gate.lease:
			gated = append(gated, task.Name)
			errs = append(errs, bad(`task %q (driver %q): the gate cannot kill it and prove it dead itself (%s), and Nomad kills it `+
				`only after the group's shutdown_delay (and, on a client cut off from the servers, its services' deregistration): `+
				`lease mode cannot bound its death by lease_fence + lease_kill_grace. Run it with docker (and the plugin config's `+
				`docker_endpoint), exec or raw_exec without a cgroup override, or use config.lock.mode = "lock" for this gate`,
				task.Name, gatedDriver(gate, task), gate.notDirectWhy(task.Name)))
		default:
			gated = append(gated, task.Name)
			gate.killBound = max(gate.killBound, groupDelay+taskKillTimeout(task)+task.ShutdownDelay)
			if err := checkNomadKill(task, groupDelay, t, "the gate leaves it to Nomad"); err != nil {
				errs = append(errs, bad("%s", err))
			}
		}
	}
	if self == nil {
		return nil, fmt.Errorf("allocation %s: task %q is not in group %q", alloc.ID, gate.Task, alloc.TaskGroup)
	}
	if lc := self.Lifecycle; lc == nil || lc.Hook != api.TaskLifecycleHookPrestart || !lc.Sidecar {
		errs = append(errs, bad("add to the gate\n\n%s\n\n"+
			"Nomad then starts the group's other tasks only once the gate runs (holds the lock), and stops them before the gate", gateLifecycleHCL))
	}
	if self.Leader {
		errs = append(errs, bad("remove leader = true from the gate: Nomad stops a leader before the other tasks, "+
			"and a gate must stop after them"))
	}
	rp := self.RestartPolicy
	if rp == nil {
		rp = tg.RestartPolicy
	}
	if rp == nil || rp.Attempts == nil || *rp.Attempts != 0 || rp.Mode == nil || *rp.Mode != api.RestartPolicyModeFail {
		errs = append(errs, bad("add to the gate\n\n%s\n\n"+
			"a gate that stops (its lock lost, its supervisor killed) must fail for good, so that Nomad kills its gated tasks; "+
			"a gate that Nomad restarted would wait for the lock again while its gated tasks ran on beside the next holder", gateRestartHCL))
	}
	if len(gated) == 0 && len(errs) == 0 {
		errs = append(errs, bad("group %q has no other task to gate: put the tasks that must run once in the gate's group", alloc.TaskGroup))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return gated, nil
}

// taskKillTimeout is the task's kill_timeout, or Nomad's default.
func taskKillTimeout(task *api.Task) time.Duration {
	if task.KillTimeout != nil {
		return *task.KillTimeout
	}
	return nomadKillTimeout
}

// checkNomadKill refuses a gated task that Nomad's kill, once the gate has
// failed, would not have dead before the server can expire the lock: Nomad
// first waits the group's shutdown_delay, then the task's shutdown_delay,
// then gives it its kill_timeout. whose says why Nomad's kill counts.
func checkNomadKill(task *api.Task, groupDelay time.Duration, t lockclient.Timing, whose string) error {
	kill := taskKillTimeout(task)
	need, have := groupDelay+kill+task.ShutdownDelay+gateKillSlack, t.TTL+t.LockDelay
	if need <= have {
		return nil
	}
	return fmt.Errorf("task %q: the group's shutdown_delay (%s) + the task's kill_timeout (%s) + its shutdown_delay (%s) "+
		"is too long for lock ttl %s and delay %s. %s; if the gate loses the lock, Nomad kills the gated tasks only then, "+
		"first waiting the group's shutdown_delay, and they must be dead before the server can expire the lock: "+
		"ttl + delay (%s) must exceed the three + %s. Lower them, or raise the gate's config.lock.ttl to \"%s\" or more",
		task.Name, groupDelay, kill, task.ShutdownDelay, t.TTL, t.LockDelay, whose, have, gateKillSlack,
		(need - t.LockDelay + time.Second).Round(time.Second))
}

// gatedDriver is the driver of a task of the gate's group.
func gatedDriver(g *Gate, task *api.Task) string {
	for _, t := range g.tasks {
		if t.Name == task.Name {
			return t.Driver
		}
	}
	return task.Driver
}

// notDirectWhy says why the gate does not kill gated task task itself.
func (g *Gate) notDirectWhy(task string) string {
	switch {
	case g.killerErr != nil:
		return g.killerErr.Error()
	case g.Killer == nil:
		return "no direct kill on this client"
	case g.whyLeft(task) != "":
		return g.whyLeft(task)
	}
	return "see the gate's start event for why"
}

// checkDirectRestart refuses a gated task that the gate kills itself but
// that Nomad could restart in place before its own kill of the allocation
// begins. Once the gate has killed its gated tasks it fails, and Nomad
// kills the allocation's other tasks, which cancels their pending
// restarts; but that kill begins only after the group's shutdown_delay
// (the pre-kill hooks), and until then a task that died is restarted after
// its restart policy's delay (plus up to 25% jitter, never less). So the
// delay must exceed the group's shutdown_delay + gateRestartSlack (the
// kill itself, and Nomad noticing that the gate failed), or the task must
// not restart at all (attempts = 0, mode = "fail"). Mode "delay" restarts,
// once the attempts are spent, at the end of the interval, however near. A
// group-level service of Nomad's own provider is deregistered in the same
// pre-kill hook, before the delay, by an RPC to the servers, which on a
// client cut off from them blocks until it is given up
// (gateNomadServiceWait): that much more.
func checkDirectRestart(task *api.Task, tg *api.TaskGroup, groupDelay time.Duration) error {
	rp := task.RestartPolicy
	if rp == nil {
		rp = tg.RestartPolicy
	}
	attempts, delay, mode := 1, nomadRestartDelay, api.RestartPolicyModeFail
	if rp != nil {
		if rp.Attempts != nil {
			attempts = *rp.Attempts
		}
		if rp.Delay != nil {
			delay = *rp.Delay
		}
		if rp.Mode != nil {
			mode = *rp.Mode
		}
	}
	need := groupDelay + gateRestartSlack
	what := fmt.Sprintf("the group's shutdown_delay (%s)", groupDelay)
	if slices.ContainsFunc(tg.Services, func(s *api.Service) bool { return s != nil && s.Provider == "nomad" }) {
		need += gateNomadServiceWait
		what = fmt.Sprintf("the deregistration of the group's Nomad services (up to %s on a client cut off from the servers) "+
			"and the group's shutdown_delay (%s)", gateNomadServiceWait, groupDelay)
	}
	switch {
	case mode != api.RestartPolicyModeFail:
		return fmt.Errorf(`task %q: restart mode %q can restart it at any moment once its attempts are spent, and the gate kills it `+
			`itself when it loses the lock, before Nomad's kill (which cancels a pending restart) begins after %s: `+
			`set restart { mode = "fail" } with attempts = 0, or a delay above %s`, task.Name, mode, what, need)
	case attempts > 0 && delay <= need:
		return fmt.Errorf(`task %q: restart delay %s is too short: when the gate loses the lock it kills the task itself, and Nomad `+
			`would restart it in place after its restart delay, before Nomad's own kill (which cancels a pending restart) begins `+
			`after %s + %s. Set restart { delay = "%s" } or more, or restart { attempts = 0 }`,
			task.Name, delay, what, gateRestartSlack, (need + time.Second).Round(time.Second))
	}
	return nil
}

// gateCheck reads the gate's allocation and checks its job (checkGateJob).
func (s *Supervisor) gateCheck(ctx context.Context) error {
	g := s.Config.Gate
	alloc, err := s.readOwnAlloc(ctx, g.AllocID, g.Namespace, "")
	if err != nil {
		return err
	}
	direct := g.buildKiller(s, alloc)
	g.lease = s.Config.Mode == ModeLease
	gated, err := checkGateJob(alloc, g, s.Locker.Config().Timing, direct)
	if err != nil {
		return err
	}
	g.gated = gated
	s.Logger.Info("gate: holding the lock for the group's other tasks", "gated", strings.Join(gated, ","))
	s.notify(Event{State: StateWaiting, Message: g.killerMessage(s.Locker.Config().Timing)})
	return nil
}

// gateStopping returns a channel closed when the servers want the gate's
// allocation stopped (or it is gone): see allocStopping. Nomad cannot kill
// a task whose driver has not yet started it, so a gate waiting for the
// lock must notice by itself; nil without a gate.
func (s *Supervisor) gateStopping(ctx context.Context) <-chan struct{} {
	g := s.Config.Gate
	if g == nil {
		return nil
	}
	return s.allocStopping(ctx, g.AllocID, g.Namespace)
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
func (s *Supervisor) readAtStop() stopArrival {
	g := s.Config.Gate
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.Locker.Config().RequestTimeout)
	defer cancel()
	alloc, _, err := s.Locker.Allocation(ctx, g.AllocID, g.Namespace, 0)
	return stopArrival{alloc: alloc, err: err}
}

// gateMayRelease reports whether the gate may release, and whether it may
// mark the release clean; it first kills the gated tasks itself where the
// ending asks for it (gatekill.go).
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
// gated tasks itself. Every other ending (the lock lost, a signal, a
// failed LB ADD, the gate's command ended) kills the gated tasks the gate
// can kill itself; the lock is then released only if the lease is still
// ours and every gated task is proven dead; otherwise it expires on the
// server, after Nomad has killed the rest.
func (s *Supervisor) gateMayRelease(lease *lockclient.Lease, end ending, at stopArrival) (release, clean bool) {
	g := s.Config.Gate
	cfg := s.Locker.Config()
	expiry := 2*cfg.TTL + cfg.LockDelay
	if chans.Closed(lease.Lost()) {
		// Never released while the gated tasks may run, even if the
		// server still holds it for us.
		killed := s.killDirect(lease, "the lock was lost")
		var direct []string
		if g.killer != nil && killed {
			direct = g.direct
		}
		left := g.leftToNomad()
		if !killed {
			left = g.gated
		}
		s.emit(leaseEvent(StateLost, lease, gateLostMessage(direct, left)))
		return false, false
	}
	provenDead := func(why string) bool {
		return s.killDirectHeld(lease, why) && g.allDirect() && !chans.Closed(lease.Lost())
	}
	var why string
	switch {
	case end == endStopRequest && at.seen:
		// Released in any case (the next gate waits for Nomad's report
		// unless it is marked clean): Nomad's kill of the allocation is
		// under way. Not asked whether one is pending: the servers lag
		// (a task Nomad restarted a moment ago shows pending), and Nomad's
		// kill of the main tasks, which comes before it stops the gate,
		// cancels their restarts; should this stop be a restart of the
		// gate racing it (L3), a restart already due in the group's
		// shutdown_delay is the warden's.
		killed := s.killDirectHeld(lease, "")
		if chans.Closed(lease.Lost()) {
			why = "the lock was lost while the allocation was being stopped"
			break
		}
		return true, killed && g.allDirect()
	case end == endStopRequest:
		alloc, err := at.alloc, at.err
		switch {
		case errors.Is(err, lockclient.ErrAllocGone):
			return true, true
		case errors.Is(err, lockclient.ErrIdentityRejected) && s.PluginReleases && s.OnReleaseTried != nil:
			// A purged job's identity no longer authenticates: the
			// plugin asks Nomad with the operator's token whether the
			// allocation is stopped or gone before it releases.
			s.Logger.Warn("gate: the allocation's identity no longer authenticates; leaving the release to the plugin", "error", err)
			s.emit(stoppingEvent(lease, gateIdentityRejectedMessage(expiry)))
			s.OnReleaseTried(err)
			return false, false
		case err != nil:
			why = fmt.Sprintf("cannot read whether the allocation is being stopped (%v)", err)
		case alloc.DesiredStatus == api.AllocDesiredStatusStop || alloc.DesiredStatus == api.AllocDesiredStatusEvict:
			if len(previousGatedAlive(alloc, g.Task)) == 0 {
				// Reported dead, not pending: Nomad's kill ended them.
				return true, true
			}
			// Being stopped, so Nomad kills them anyway: a kill of our
			// own loses them nothing but their shutdown_delay, and proves
			// them dead.
			if provenDead("the allocation turned stop as the gate was stopped") {
				return true, s.noneRestartable()
			}
			why = "the allocation was seen being stopped only after the gate's stop arrived (a restart of the gate may have raced it), " +
				"and Nomad does not yet report the gated tasks dead"
		default:
			s.Logger.Info("gate: stopped while its allocation runs on (a restart): keeping the lease for the restarted gate")
			s.emit(stoppingEvent(lease, gateKeptForRestartMessage(g.gated, lockclient.BootUntil(lease.FenceDeadline()))))
			return false, false
		}
	default:
		if provenDead("the gate stopped: " + end.String()) {
			return true, s.noneRestartable()
		}
		why = "the gate stopped by itself (" + end.String() + ")"
	}
	s.Logger.Warn("gate: not releasing the lock", "why", why)
	s.emit(stoppingEvent(lease, gateLockKeptMessage(why, g.gated, expiry)))
	return false, false
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
func (s *Supervisor) noneRestartable() bool {
	g := s.Config.Gate
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.Locker.Config().RequestTimeout)
	defer cancel()
	alloc, _, err := s.Locker.Allocation(ctx, g.AllocID, g.Namespace, 0)
	if err != nil {
		s.Logger.Warn("gate: cannot read whether a gated task is about to start again; not marking the release clean", "error", err)
		return false
	}
	if pending := GatedPending(alloc, g.Task, g.killedAt); len(pending) > 0 {
		s.Logger.Warn("gate: Nomad may start these gated tasks again; not marking the release clean, so the next gate waits for Nomad to report them dead",
			"tasks", strings.Join(pending, ","))
		return false
	}
	return true
}

// GatedPending lists the tasks of alloc, other than its gate and its
// poststop tasks, that Nomad reports pending: waiting to start, or to be
// restarted. An allocation its client reported complete or failed has
// none. A release after which one of them may start is not marked clean.
//
// killedAt, when set, is when the caller began its own kill of the gated
// tasks: a restart that Nomad scheduled after it (its Restarting event is
// no older) is that kill's, which comes no sooner than the static restart
// rule allows (checkDirectRestart: Nomad's kill of the failing allocation
// cancels it first) and which the plugin's warden kills should it start;
// it is not listed. The event's time is the client's clock, on this host.
func GatedPending(alloc *api.Allocation, gate string, killedAt time.Time) []string {
	if alloc.ClientStatus == api.AllocClientStatusComplete || alloc.ClientStatus == api.AllocClientStatusFailed {
		return nil
	}
	var out []string
	for name, st := range alloc.TaskStates {
		if name != gate && st != nil && st.State == "pending" && !isPoststop(alloc, name) && !restartedSince(st, killedAt) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// restartedSince reports whether st is pending for a restart that Nomad
// scheduled at or after since (never, for a zero since or a task that is
// pending its first start).
func restartedSince(st *api.TaskState, since time.Time) bool {
	if since.IsZero() {
		return false
	}
	for i := len(st.Events) - 1; i >= 0; i-- {
		if ev := st.Events[i]; ev != nil && ev.Type == api.TaskRestarting {
			return ev.Time >= since.UnixNano()
		}
	}
	return false
}

// markReleasedClean tells the next holder that the gated tasks are dead, so
// it need not wait for them (see gateAwaitPrevious).
func (s *Supervisor) markReleasedClean(lease *lockclient.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), s.Locker.Config().RequestTimeout)
	defer cancel()
	if err := lease.MarkReleasedClean(ctx); err != nil {
		s.Logger.Warn("cannot mark the release clean: a next gate waits for Nomad to report our gated tasks dead, and under ACLs an old-version standby does not give way to a new version", "error", err)
	}
}

// gateAwaitPrevious runs once the gate holds the lock, before its gated
// tasks may start: unless the previous holder released clean (it marks
// that in the lock only once its gated tasks are proven dead and none can
// start again, see gateMayRelease), it waits until Nomad reports them dead
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
//     gate recorded that it kills every gated task itself (GatedDirect):
//     it fenced itself and killed them by D + K before the seal, and its
//     node's plugin warden kills whatever Nomad starts again until its
//     kill of the allocation. The servers have often not noticed a dead
//     node yet (that is what lease mode is for), so the seal is trusted
//     unless they report a gated task pending.
//   - A client out of the servers' reach (lost, unknown): a previous gate
//     with GatedDirect fenced itself at its fence deadline, a TTL before
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
func (s *Supervisor) gateAwaitPrevious(lease *lockclient.Lease) bool {
	g := s.Config.Gate
	prev := lease.Previous
	if prev.AllocID == "" || prev.AllocID == g.AllocID || prev.ReleasedClean {
		return true
	}
	sealed := prev.GatedDirect && lease.PreviousTakenOver()
	t := s.Locker.Config().Timing
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
		alloc, next, err := s.Locker.Allocation(rctx, prev.AllocID, g.Namespace, index)
		rcancel()
		switch {
		case chans.Closed(lease.Lost()):
			return false
		case errors.Is(err, lockclient.ErrAllocGone) && !errors.Is(err, lockclient.ErrAllocHidden):
			return true
		case err != nil && (sealed || !time.Now().Before(until)):
			s.Logger.Warn("gate: cannot read the previous holder's allocation; its time is up", "previous_alloc", prev.AllocID, "error", err)
			return true
		case err != nil:
			s.Logger.Debug("gate: read the previous holder's allocation", "error", err)
			index = 0
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if !extended && !prev.GatedDirect && hasNomadService(alloc) {
			// Nomad deregisters a task's Nomad services before it kills
			// it, by RPC to the servers: on a client cut off from them
			// that blocks until the connection is given up, and the kill
			// waits.
			extended = true
			until = until.Add(gateNomadServiceWait)
		}
		alive := previousGatedAlive(alloc, g.Task)
		switch {
		case len(alive) == 0:
			if announced {
				s.Logger.Info("gate: the previous holder's gated tasks are dead", "previous_alloc", prev.AllocID)
			}
			return true
		case sealed && len(GatedPending(alloc, g.Task, time.Time{})) == 0:
			s.Logger.Info("gate: the previous holder's heartbeat was sealed by a standby: its gated tasks are dead", "previous_alloc", prev.AllocID)
			return true
		case clientOutOfReach(alloc) && (prev.GatedDirect || !time.Now().Before(until)):
			s.Logger.Info("gate: the previous holder's client is out of the servers' reach; it fenced itself, and its gated tasks are dead by now",
				"previous_alloc", prev.AllocID, "client_status", alloc.ClientStatus)
			return true
		}
		if !announced {
			announced = true
			s.Logger.Warn("gate: the lock was free while the previous holder's gated tasks may still run; waiting for Nomad to report them dead",
				"previous_alloc", prev.AllocID, "tasks", strings.Join(alive, ","))
			s.emit(Event{State: StateWaiting, Fence: lease.Fence, Holder: prev, Message: gateAwaitPreviousMessage(s.Config.Path, prev, alive)})
		}
		index, outOfReach = next, clientOutOfReach(alloc)
	}
}

// clientOutOfReach reports whether the servers have lost touch with the
// allocation's client (lost, or unknown under a disconnect block).
func clientOutOfReach(alloc *api.Allocation) bool {
	return alloc.ClientStatus == api.AllocClientStatusLost || alloc.ClientStatus == api.AllocClientStatusUnknown
}

// hasNomadService reports whether the allocation's group registers a
// service with Nomad's own provider (on the group or a task).
func hasNomadService(alloc *api.Allocation) bool {
	if alloc.Job == nil {
		return false
	}
	nomad := func(svcs []*api.Service) bool {
		return slices.ContainsFunc(svcs, func(s *api.Service) bool { return s != nil && s.Provider == "nomad" })
	}
	for _, tg := range alloc.Job.TaskGroups {
		if tg.Name == nil || *tg.Name != alloc.TaskGroup {
			continue
		}
		if nomad(tg.Services) {
			return true
		}
		for _, t := range tg.Tasks {
			if nomad(t.Services) {
				return true
			}
		}
	}
	return false
}

// previousGatedAlive lists the tasks of a previous holder's allocation, other
// than its gate and its poststop tasks, that Nomad does not report dead. An
// allocation its client reported complete or failed has none. A pending task counts as alive: the client
// reports a start in its next batch (up to a second later), so a task the
// servers still show pending may already run.
func previousGatedAlive(alloc *api.Allocation, gate string) []string {
	// Only the client's own word ends it: "lost" and "unknown" are the
	// servers' guesses about a node they cannot reach, whose tasks may run.
	if alloc.ClientStatus == api.AllocClientStatusComplete || alloc.ClientStatus == api.AllocClientStatusFailed {
		return nil
	}
	var alive []string
	for name, st := range alloc.TaskStates {
		if name == gate || st == nil || st.State == "dead" {
			continue
		}
		if isPoststop(alloc, name) {
			continue
		}
		alive = append(alive, name)
	}
	slices.Sort(alive)
	return alive
}

func isPoststop(alloc *api.Allocation, task string) bool {
	if alloc.Job == nil {
		return false
	}
	for _, tg := range alloc.Job.TaskGroups {
		if tg.Name == nil || *tg.Name != alloc.TaskGroup {
			continue
		}
		for _, t := range tg.Tasks {
			if t.Name == task {
				return t.Lifecycle != nil && t.Lifecycle.Hook == api.TaskLifecycleHookPoststop
			}
		}
	}
	return false
}

// gateAdopt takes over the lease of the gate's previous run (see
// Gate.Adopt). Transport errors are retried for half a TTL, and never past
// the lease's fence deadline; a lease that is gone ends the gate, which
// then fails, so that Nomad kills its gated tasks (and the plugin's warden
// kills them meanwhile).
func (s *Supervisor) gateAdopt(ctx context.Context) (*lockclient.Lease, error) {
	a := s.Config.Gate.Adopt
	within := s.Locker.Config().TTL / 2
	if a.FenceBoot != 0 {
		within = min(within, lockclient.BootUntil(lockclient.BootTime(a.FenceBoot)))
	}
	if within <= 0 {
		return nil, &lockclient.LostError{Reason: fmt.Sprintf("the previous run's lease (fence %d) passed its fence deadline before this run could take it over", a.Fence)}
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		lease, err := s.Locker.AdoptPath(ctx, a.Path, a.LockID, a.Fence)
		if err == nil || errors.Is(err, lockclient.ErrLost) || ctx.Err() != nil {
			return lease, err
		}
		s.Logger.Warn("gate: adopt the previous run's lease, retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
