package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
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

	// stopRequested is set when Nomad asked the gate to stop (StopTask).
	stopRequested bool
	// killBound is the longest kill_timeout + shutdown_delay of the gated
	// tasks, found at start: what Nomad may take to kill them once the gate
	// has failed.
	killBound time.Duration
}

// AdoptLease names a lease to take over: its lock ID and fencing token.
type AdoptLease struct {
	LockID string
	Fence  uint64
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
)

// GateConfigError is a job that cannot be gated safely. Its message names
// the jobspec field to change.
type GateConfigError struct{ Msg string }

func (e *GateConfigError) Error() string { return e.Msg }

// checkGateJob reads the gate's allocation and checks that its job keeps
// "never two at once": see Gate. It returns the gated tasks.
func checkGateJob(alloc *api.Allocation, gate *Gate, t lockclient.Timing) ([]string, error) {
	if alloc.Job == nil {
		return nil, fmt.Errorf("allocation %s has no job", alloc.ID)
	}
	var tg *api.TaskGroup
	for _, g := range alloc.Job.TaskGroups {
		if g.Name != nil && *g.Name == alloc.TaskGroup {
			tg = g
		}
	}
	if tg == nil {
		return nil, fmt.Errorf("allocation %s: group %q is not in its job", alloc.ID, alloc.TaskGroup)
	}
	bad := func(format string, args ...any) error {
		return &GateConfigError{Msg: fmt.Sprintf("gate %q: ", gate.Task) + fmt.Sprintf(format, args...)}
	}
	var self *api.Task
	var gated []string
	var errs []error
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
		default:
			gated = append(gated, task.Name)
			kill := 5 * time.Second // Nomad's default kill_timeout
			if task.KillTimeout != nil {
				kill = *task.KillTimeout
			}
			gate.killBound = max(gate.killBound, kill+task.ShutdownDelay)
			if need, have := kill+task.ShutdownDelay+gateKillSlack, t.TTL+t.LockDelay; need > have {
				errs = append(errs, bad("task %q: kill_timeout (%s) + shutdown_delay (%s) is too long for lock ttl %s and delay %s. "+
					"If the gate loses the lock, Nomad kills the gated tasks only then, and they must be dead before the server "+
					"can expire the lock: ttl + delay (%s) must exceed kill_timeout + shutdown_delay + %s. Lower the task's "+
					"kill_timeout or raise the gate's lock ttl", task.Name, kill, task.ShutdownDelay, t.TTL, t.LockDelay, have, gateKillSlack))
			}
		}
	}
	if self == nil {
		return nil, fmt.Errorf("allocation %s: task %q is not in group %q", alloc.ID, gate.Task, alloc.TaskGroup)
	}
	if lc := self.Lifecycle; lc == nil || lc.Hook != api.TaskLifecycleHookPrestart || !lc.Sidecar {
		errs = append(errs, bad(`add lifecycle { hook = "prestart"  sidecar = true } to the gate: Nomad then starts the group's `+
			`other tasks only once the gate runs (holds the lock), and stops them before the gate`))
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
		errs = append(errs, bad(`add restart { attempts = 0  mode = "fail" } to the gate: a gate that stops (its lock lost, `+
			`its supervisor killed) must fail for good, so that Nomad kills its gated tasks; a gate that Nomad restarted `+
			`would wait for the lock again while its gated tasks ran on beside the next holder`))
	}
	if len(gated) == 0 && len(errs) == 0 {
		errs = append(errs, bad("group %q has no other task to gate: put the tasks that must run once in the gate's group", alloc.TaskGroup))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return gated, nil
}

// gateCheck reads the gate's allocation and checks its job (checkGateJob).
// A read that fails for want of an answer (the agent restarting) is retried
// for gateCheckWithin.
func (s *Supervisor) gateCheck(ctx context.Context) error {
	g := s.Config.Gate
	var alloc *api.Allocation
	var err error
	for until := time.Now().Add(gateCheckWithin); ; {
		alloc, _, err = s.Locker.Allocation(ctx, g.AllocID, g.Namespace, 0)
		var pe *lockclient.AllocPermissionError
		if err == nil || errors.Is(err, lockclient.ErrAllocGone) || errors.As(err, &pe) || !time.Now().Before(until) {
			break
		}
		s.Logger.Warn("gate: cannot read the allocation yet, retrying", "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
	if errors.Is(err, lockclient.ErrAllocGone) {
		// The gate's own allocation runs: the servers hide it from a
		// token without read-job.
		return s.Locker.NewAllocPermissionError(g.AllocID, g.Namespace, err)
	}
	if err != nil {
		return err
	}
	gated, err := checkGateJob(alloc, g, s.Locker.Config().Timing)
	if err != nil {
		return err
	}
	g.gated = gated
	s.Logger.Info("gate: holding the lock for the group's other tasks", "gated", strings.Join(gated, ","))
	return nil
}

// gateStopping returns a channel closed when the servers want the gate's
// allocation stopped (or it is gone). Nomad cannot kill a task whose
// driver has not yet started it, so a gate waiting for the lock must notice
// by itself. Reads that fail are retried; nil without a gate.
func (s *Supervisor) gateStopping(ctx context.Context) <-chan struct{} {
	g := s.Config.Gate
	if g == nil {
		return nil
	}
	ch := make(chan struct{})
	go func() {
		var index uint64
		var rejectedSince time.Time
		for ctx.Err() == nil {
			alloc, next, err := s.Locker.Allocation(ctx, g.AllocID, g.Namespace, index)
			var pe *lockclient.AllocPermissionError
			if !errors.Is(err, lockclient.ErrIdentityRejected) {
				rejectedSince = time.Time{}
			} else if rejectedSince.IsZero() {
				rejectedSince = time.Now()
			}
			switch {
			case errors.Is(err, lockclient.ErrIdentityRejected) && time.Since(rejectedSince) >= gateIdentityGone:
				// Not a blip of the servers: the allocation is gone.
				s.Logger.Info("gate: the allocation's identity no longer authenticates (a purged job?)", "error", err)
				close(ch)
				return
			case errors.Is(err, lockclient.ErrAllocGone), errors.As(err, &pe):
				// The read worked at start (gateCheck): an allocation
				// the servers no longer show, or an identity that no
				// longer authenticates (a purged job), is going away.
				s.Logger.Info("gate: the allocation is gone, or its identity no longer reads it", "error", err)
				close(ch)
				return
			case err != nil:
				if ctx.Err() == nil {
					s.Logger.Debug("gate: read allocation", "error", err)
				}
				index = 0
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			case alloc.DesiredStatus != api.AllocDesiredStatusRun:
				s.Logger.Info("gate: the allocation is being stopped", "desired_status", alloc.DesiredStatus)
				close(ch)
				return
			}
			index = next
		}
	}()
	return ch
}

// gateMayRelease reports whether the gate may release. Only one stop
// proves the gated tasks dead: Nomad's own, when the allocation is being
// stopped (desired status stop or evict on the servers, or the allocation
// already gone). The client then kills the group's main tasks and waits for
// each to be dead before it stops its sidecars, the gate among them
// (allocrunner.killTasks, Nomad v1.11). The servers cannot confirm it
// meanwhile: the client sends no task state while it kills. Every other
// ending keeps the lock: a restart of the gate or of its allocation (the
// gated tasks may run on; the restarted gate adopts the lease), a gated
// task that failed for good, a lost lock, a killed supervisor. The lock
// then expires on the server, after the gated tasks' kill_timeout.
func (s *Supervisor) gateMayRelease(lease *lockclient.Lease) bool {
	g := s.Config.Gate
	cfg := s.Locker.Config()
	expiry := 2*cfg.TTL + cfg.LockDelay
	if chans.Closed(lease.Lost()) {
		// Never released while the gated tasks may run, even if the
		// server still holds it for us: Nomad kills them once the gate
		// has failed, within the kill_timeout checked at start.
		s.emit(Event{State: StateLost, Fence: lease.Fence, Message: fmt.Sprintf(
			"Gate lost the lock: it fails now, and Nomad kills the gated tasks (%s) before the server can expire the lock",
			strings.Join(g.gated, ", "))})
		return false
	}
	var why string
	if g.stopRequested {
		ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.RequestTimeout)
		defer cancel()
		alloc, _, err := s.Locker.Allocation(ctx, g.AllocID, g.Namespace, 0)
		switch {
		case errors.Is(err, lockclient.ErrAllocGone):
			return true
		case errors.Is(err, lockclient.ErrIdentityRejected) && s.PluginReleases && s.OnReleaseTried != nil:
			// A purged job's identity no longer authenticates: the
			// plugin asks Nomad with the operator's token whether the
			// allocation is stopped or gone before it releases.
			s.Logger.Warn("gate: the allocation's identity no longer authenticates; leaving the release to the plugin", "error", err)
			s.emit(Event{State: StateStopping, Fence: lease.Fence, Message: "Gate's workload identity no longer authenticates " +
				"(`nomad job stop -purge` removes it with the allocation): the plugin releases the lock with its release_token_file " +
				"once Nomad confirms the allocation stopped; without one the lock expires on the server within 2×TTL + delay (" + expiry.String() + ")"})
			s.OnReleaseTried(err)
			return false
		case err != nil:
			why = fmt.Sprintf("cannot read whether the allocation is being stopped (%v)", err)
		case alloc.DesiredStatus == api.AllocDesiredStatusStop || alloc.DesiredStatus == api.AllocDesiredStatusEvict:
			return true
		default:
			why = "Nomad stopped the gate while its allocation keeps running (a restart, or a gated task that failed for good)"
		}
	} else {
		why = "the gate stopped by itself"
	}
	msg := fmt.Sprintf("Lock kept: %s, so the gated tasks (%s) may still run. A restarted gate takes the lease over; "+
		"otherwise Nomad kills them, and the lock expires on the server within 2×TTL + delay (%s)", why, strings.Join(g.gated, ", "), expiry)
	s.Logger.Warn("gate: not releasing the lock", "why", why)
	s.emit(Event{State: StateStopping, Fence: lease.Fence, Message: msg})
	return false
}

// holdGate is a gate's life with no workload of its own: it holds the lock
// until Nomad stops it (after its gated tasks) or the lock is lost, and
// releases only as gateMayRelease allows. With a load balancer it carries
// the gated task's registration (see gateLB).
func (s *Supervisor) holdGate(lease *lockclient.Lease, sigs <-chan os.Signal) int {
	held := func(state State, msg string) Event {
		return Event{State: state, Fence: lease.Fence, Message: msg,
			FenceDeadline: lease.FenceDeadline(), StopDeadline: lease.StopDeadline(), LastRenew: lease.LastRenew()}
	}
	msg := fmt.Sprintf("Acquired lock (fence %d): the group's other tasks may start", lease.Fence)
	if s.Config.Gate.Adopt != nil {
		msg = fmt.Sprintf("Took over lock (fence %d) from the gate's previous run: the group's other tasks keep running", lease.Fence)
	}
	s.emit(held(StateHolding, msg))
	lb, stopping, err := s.gateLB(lease)
	if err != nil {
		s.Logger.Error("gate: cannot register with the load balancer", "error", err)
		s.emit(held(StateStopping, "LB add failed: "+err.Error()+"; "+gateFailNote))
		s.gateMayRelease(lease) // says why it is not released
		return ExitLBFailed
	}
	defer lb.close()
	deregister := func() {
		s.deregister(lb, s.removeBudget(lease), held, lease.Renewed(), func() { s.emit(held(s.state, s.message)) })
	}
	for {
		select {
		case <-lease.Renewed():
			s.emit(held(s.state, s.message))
		case ev := <-lb.eventsC():
			if err := s.handleLB(lb, ev, held); err != nil {
				s.Logger.Error("gate: the load balancer ADD failed", "error", err)
				s.emit(held(StateStopping, gateLBAddFailedMessage(err, lb.client.Config())))
				deregister()
				s.gateMayRelease(lease) // says why it is not released
				return ExitLBFailed
			}
		case <-lb.recheckC():
			if lb.registered && !lb.busy && !lb.deregistered {
				lb.check()
			}
		case <-stopping:
			stopping = nil
			s.Logger.Info("gate: the allocation is being stopped: removing the gated task's upstream before Nomad kills it")
			deregister()
		case <-lease.Lost():
			why := strings.TrimPrefix(lease.Err().Error(), "lock lost: ")
			s.Logger.Error("gate: lock lost", "why", why)
			s.emit(held(StateLost, "Lock lost: "+why))
			deregister()
			s.gateMayRelease(lease) // says why it is not released
			return ExitLost
		case req := <-s.Stop:
			s.Logger.Info("gate: stop requested", "kill_timeout", req.Timeout)
			s.Config.Gate.stopRequested = true
			s.emit(held(StateStopping, "Stopping gate"))
			deregister()
			s.releaseGate(lease)
			return 0
		case sig := <-sigs:
			sys, _ := sig.(syscall.Signal)
			if sys == syscall.SIGTERM || sys == syscall.SIGINT {
				s.Logger.Info("gate: stopping on signal", "signal", sig)
				s.emit(held(StateStopping, "Stopping gate on "+signalName(sys)))
				deregister()
				s.releaseGate(lease)
				return 0
			}
		}
	}
}

// releaseGate releases a gate with no workload once gateMayRelease allows.
func (s *Supervisor) releaseGate(lease *lockclient.Lease) {
	if s.gateMayRelease(lease) {
		s.markReleasedClean(lease)
		s.release(lease)
	}
}

// markReleasedClean tells the next holder that the gated tasks are dead, so
// it need not wait for them (see gateAwaitPrevious).
func (s *Supervisor) markReleasedClean(lease *lockclient.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), s.Locker.Config().RequestTimeout)
	defer cancel()
	if err := lease.MarkReleasedClean(ctx); err != nil {
		s.Logger.Warn("gate: cannot mark the release clean; the next holder waits for Nomad to report our gated tasks dead", "error", err)
	}
}

// gateAwaitPrevious runs once the gate holds the lock, before its gated
// tasks may start: unless the previous holder released cleanly (it marks
// that in the lock), it waits until Nomad's client has reported that
// holder's gated tasks dead (or its allocation complete or failed). A lock
// released behind the previous holder's back (by hand, with its lock ID) is
// free while that holder's gated tasks still run: Nomad kills them only once
// the previous gate has noticed its loss and failed. A lock that expired
// because the previous holder's node was cut off may be free while Nomad
// there still kills them: before it kills a task Nomad deregisters the
// task's Nomad services, by an RPC to the servers it cannot reach.
//
// The wait is bounded by what the previous gate's rule allows them (its
// fence deadline, at most a TTL away, then their kill_timeout, checked at
// its start to fit TTL + delay): 2×TTL + delay, and gateNomadServiceWait more
// when its group registers Nomad services. The servers' "lost" or "unknown"
// is no proof: they cannot reach the node. It returns false if the lease
// ended meanwhile.
func (s *Supervisor) gateAwaitPrevious(lease *lockclient.Lease) bool {
	g := s.Config.Gate
	prev := lease.Previous
	if prev.AllocID == "" || prev.AllocID == g.AllocID || prev.ReleasedClean {
		return true
	}
	t := s.Locker.Config().Timing
	until := time.Now().Add(t.TTL + t.TTL + t.LockDelay)
	extended := false
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
	announced := false
	for {
		rctx, rcancel := context.WithDeadline(ctx, until)
		alloc, next, err := s.Locker.Allocation(rctx, prev.AllocID, g.Namespace, index)
		expired := rctx.Err() != nil
		rcancel()
		switch {
		case chans.Closed(lease.Lost()):
			return false
		case errors.Is(err, lockclient.ErrAllocGone):
			return true
		case err != nil && expired:
			s.Logger.Warn("gate: the previous holder's gated tasks are not reported dead; their time is up", "previous_alloc", prev.AllocID)
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
		if !extended && hasNomadService(alloc) {
			// Nomad deregisters a task's Nomad services before it kills
			// it, by RPC to the servers: on a client cut off from them
			// that blocks until the connection is given up, and the kill
			// waits.
			extended = true
			until = until.Add(gateNomadServiceWait)
		}
		alive := previousGatedAlive(alloc, g.Task)
		if len(alive) == 0 {
			if announced {
				s.Logger.Info("gate: the previous holder's gated tasks are dead", "previous_alloc", prev.AllocID)
			}
			return true
		}
		if !announced {
			announced = true
			s.Logger.Warn("gate: the lock was free while the previous holder's gated tasks may still run; waiting for them",
				"previous_alloc", prev.AllocID, "tasks", strings.Join(alive, ","))
			s.emit(Event{State: StateWaiting, Fence: lease.Fence, Holder: prev, Message: fmt.Sprintf(
				"Holding lock %s, but the previous holder %s still runs %s as far as Nomad knows (its lock was released "+
					"behind its back, or it expired while its node was cut off): waiting until Nomad reports them dead, at most %s",
				s.Config.Path, prev, strings.Join(alive, ", "), time.Until(until).Round(time.Second))})
		}
		if !time.Now().Before(until) {
			s.Logger.Warn("gate: the previous holder's gated tasks are not reported dead; their time is up", "previous_alloc", prev.AllocID)
			return true
		}
		index = next
	}
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
// Gate.Adopt). Transport errors are retried for half a TTL; a lease that is
// gone ends the gate, which then fails, so that Nomad kills its gated tasks.
func (s *Supervisor) gateAdopt(ctx context.Context) (*lockclient.Lease, error) {
	a := s.Config.Gate.Adopt
	ttl := s.Locker.Config().TTL
	ctx, cancel := context.WithTimeout(ctx, ttl/2)
	defer cancel()
	for {
		lease, err := s.Locker.Adopt(ctx, a.LockID, a.Fence)
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
