package shim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// The jobspec rules of a gate: what makes a job safe to gate (checkGateJob,
// checkDirectRestart), and how to read a gate's allocation (its gated
// tasks, the previous holder's that are still alive or pending). Pure
// functions of the allocation; the gate's hook (hook_gate.go) applies them.

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

// checkGateJob checks that the job of gate task gate's allocation keeps
// "never two at once" (see gateHook), and sets w's kill bound. It returns
// the gated tasks. direct names
// the gated tasks the gate kills and proves dead itself (GatedTasks): their
// kill is the gate's, but Nomad must not restart them before its own kill
// begins; the others are Nomad's to kill, within the lock's expiry.
func checkGateJob(alloc *api.Allocation, gate string, w *gatedWorkload, t lockclient.Timing, direct map[string]bool) ([]string, error) {
	tg, err := gateGroup(alloc)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return &GateConfigError{Msg: fmt.Sprintf("gate %q: ", gate) + fmt.Sprintf(format, args...)}
	}
	var groupDelay time.Duration
	if tg.ShutdownDelay != nil {
		groupDelay = *tg.ShutdownDelay
	}
	var self *api.Task
	var gated []string
	var errs []error
	w.killBound = 0
	for _, task := range tg.Tasks {
		switch {
		case task.Name == gate:
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
			w.killBound = max(w.killBound, gateKillAllTimeout)
			if err := checkDirectRestart(task, tg, groupDelay); err != nil {
				errs = append(errs, bad("%s", err))
			}
			// Whenever the gate's own kill fails (the engine hung, a
			// process stuck in the kernel), Nomad's kill is what ends it.
			if err := checkNomadKill(task, groupDelay, t, "the gate kills it itself, but whenever that kill fails "+
				"Nomad's kill, after the gate has failed, is what ends it"); err != nil {
				errs = append(errs, bad("%s", err))
			}
		case w.lease:
			gated = append(gated, task.Name)
			errs = append(errs, bad(`task %q (driver %q): the gate cannot kill it and prove it dead itself (%s), and Nomad kills it `+
				`only after the group's shutdown_delay (and, on a client cut off from the servers, its services' deregistration): `+
				`lease mode cannot bound its death by lease_fence + lease_kill_grace. Run it with docker (and the plugin config's `+
				`docker_endpoint), exec or raw_exec without a cgroup override, or use config.lock.mode = "lock" for this gate`,
				task.Name, w.driverOf(task), w.notDirectWhy(task.Name)))
		default:
			gated = append(gated, task.Name)
			w.killBound = max(w.killBound, groupDelay+taskKillTimeout(task)+task.ShutdownDelay)
			if err := checkNomadKill(task, groupDelay, t, "the gate leaves it to Nomad"); err != nil {
				errs = append(errs, bad("%s", err))
			}
		}
	}
	if self == nil {
		return nil, fmt.Errorf("allocation %s: task %q is not in group %q", alloc.ID, gate, alloc.TaskGroup)
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

// restartReasonAll is the restart reason Nomad's client gives each task of
// a restart of the whole allocation (`nomad alloc restart -all-tasks`, the
// API's RestartAllTasks: client/client.go, RestartAllocation).
const restartReasonAll = "User requested all tasks to restart"

// RestartedWhole reports whether the servers show that Nomad restarted the
// whole of alloc since its gate's run that began at since (zero: since the
// gate last started), and not the gate alone after it: the gate's latest
// "Restart Signaled" event has Nomad's reason for a restart of every task.
// Nomad then resets the allocation's lifecycle coordinator before it
// restarts the tasks (allocRunner.RestartAll, tasklifecycle
// Coordinator.Restart), so every gated task, restarted or restarting,
// waits for the gate to run again, which the driver reports only once it
// holds the lock: none can start beside the next holder. (lock step-down
// restarts a gate's allocation so.) The event's time is the client's
// clock, on this host.
func RestartedWhole(alloc *api.Allocation, gate string, since time.Time) bool {
	st := alloc.TaskStates[gate]
	if st == nil {
		return false
	}
	var last *api.TaskEvent
	for _, ev := range st.Events {
		switch {
		case ev.Type == api.TaskStarted && since.IsZero():
			last = nil // a restart before the last start is not this one
		case ev.Type == api.TaskRestartSignal && time.Unix(0, ev.Time).After(since):
			last = ev
		}
	}
	return last != nil && last.RestartReason == restartReasonAll
}
