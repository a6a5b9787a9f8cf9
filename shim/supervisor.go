package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// State is where the supervisor is in its life:
// waiting → holding → stopping → released, with lost as the fault exit.
type State string

const (
	StateWaiting State = "waiting"
	StateHolding State = "holding"
	// StateHealthy and StateRegistered refine holding when a load balancer
	// is configured: the health check passed, then the LB added us.
	StateHealthy    State = "healthy"
	StateRegistered State = "registered"
	StateStopping   State = "stopping"
	StateReleased   State = "released"
	StateLost       State = "lost"
)

// Holds reports whether the supervisor holds the lock and runs the workload.
func (s State) Holds() bool {
	return s == StateHolding || s == StateHealthy || s == StateRegistered
}

// Event is one state change, or a renewal heartbeat (same State and Message,
// later deadlines), for logs, a status file or task events.
type Event struct {
	State   State
	Time    time.Time
	Path    string
	Fence   uint64            // holding and after
	Holder  lockclient.Holder // waiting: who holds the lock now
	Message string
	// Notice marks an event that is no change of state (an LB API that
	// does not answer, a re-add): State and the deadlines are the current
	// ones and Message is the notice. Show each notice once; the state's
	// own message still stands.
	Notice bool

	// Set while the lease is held: the watchdog kills the workload's group
	// if the supervisor has not acted on them.
	FenceDeadline time.Time
	StopDeadline  time.Time
	// LastRenew is when the last renew the server acknowledged (or the
	// acquire) was sent: the plugin, releasing for a crashed supervisor,
	// leaves the lock to expire from its release cutoff on. Like the
	// deadlines it is on CLOCK_BOOTTIME (lockclient.BootNanos).
	LastRenew    time.Time
	WorkloadPID  int
	WorkloadPGID int
}

// StopRequest asks the supervisor to stop the workload with Signal and give
// it Timeout before SIGKILL. The driver sends one for Nomad's StopTask, with
// the task's kill_signal and kill_timeout.
type StopRequest struct {
	Signal  syscall.Signal
	Timeout time.Duration
}

// Exit codes of the supervisor. A workload's own exit code passes through
// unchanged; death by signal N becomes 128+N, as in a shell.
const (
	ExitConfig      = 64  // bad flag, config file, TTL, path or command
	ExitInfra       = 69  // Nomad unreachable or failing, too many API errors (no socket or token is ExitConfig)
	ExitWaitTimeout = 75  // the lock was not acquired within -wait
	ExitLost        = 76  // the lock was lost while held; the workload was stopped
	ExitPermission  = 77  // HTTP 403: the token lacks write on the lock path
	ExitCannotExec  = 126 // the command exists but cannot be executed
	ExitNotFound    = 127 // the command was not found
)

// confirmTimeout bounds the wait for SIGKILLed processes to disappear.
const confirmTimeout = 5 * time.Second

// Supervisor runs one workload under one lock.
type Supervisor struct {
	Config  Config
	Locker  *lockclient.Locker
	Logger  hclog.Logger
	Observe func(Event) // optional
	// Metrics, if set, counts the run's metrics (metricshook.go).
	Metrics *Metrics

	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Env is the workload's base environment; nil means os.Environ().
	Env []string
	// Dir is the workload's working directory; "" keeps ours.
	Dir string
	// Credential runs the workload as another user; nil keeps ours.
	Credential *syscall.Credential
	// Stop delivers stop requests; nil means only SIGTERM/SIGINT stop.
	Stop <-chan StopRequest
	// OnAcquire, if set, runs after the lock is acquired and before the
	// workload starts: the driver records the lease for a crash release.
	OnAcquire func(*lockclient.Lease)
	// OnReleaseTried, if set, runs once the supervisor has tried to release
	// the lock it held, with the release's error: nil when released or
	// already gone. The driver then drops the lease record, so the plugin's
	// crash release is left for supervisors that died holding, unless err
	// wraps lockclient.ErrIdentityRejected: the workload is proven dead but
	// the task's identity no longer authenticates (a purged job), and the
	// plugin may release with the operator's token (release_token_file). A
	// gate that is being stopped but cannot read its allocation for that
	// reason calls it with that error instead of releasing (gateMayRelease):
	// the plugin then asks Nomad with its own token.
	OnReleaseTried func(err error)
	// PluginReleases says that a plugin stands behind the supervisor and
	// releases with its own token what the task's identity no longer can.
	PluginReleases bool
	// OnLBPosted runs before the ADD is sent, OnLBRemoved after our REMOVE
	// succeeded: the driver records the registration for a crash REMOVE.
	OnLBPosted  func(*LoadBalancer, *lbhook.Hook, lbhook.UpstreamInfo)
	OnLBRemoved func()
	// Getenv reads the task environment (LB auth key); nil means os.Getenv.
	Getenv func(string) string
	// Tree, if set, sees the workload's whole process tree, where the
	// process group does not reach (a daemon that called setsid): stops
	// signal it too, wait for it, and the lock is released only once it is
	// proven empty.
	Tree Tree
	// StartIn, if set, runs start (the fork and exec of the workload) with
	// the supervisor placed where the workload must begin: the driver joins
	// the task cgroup around it and leaves again, so the workload is born
	// in the cgroup and the supervisor is not in it.
	StartIn func(start func() error) error
	// Subreaper makes the supervisor a child subreaper whose descendants
	// are all the workload's (the `lock` binary, which has no cgroup): they
	// become its Tree.
	Subreaper bool
	// RequireGuard refuses to start the workload without its process-group
	// guard (the driver: nothing else kills a workload whose supervisor was
	// SIGKILLed before the watchdog's margin runs out).
	RequireGuard bool
	// WaitForPolicy makes an HTTP 403 on acquire a wait instead of exit 77
	// (the driver): the supervisor says in a task event which ACL policy
	// to apply, retries with backoff, and takes the lock as soon as the
	// policy is applied, without a restart of the task. Only a stop ends
	// the wait.
	WaitForPolicy bool

	spawner *spawner
	// hooks is the optional behaviour attached to the run (hooks.go).
	hooks []runHook
	// state and message are the last emitted, repeated by renew heartbeats.
	state   State
	message string
}

// removeBudget is how long the LB REMOVE may delay the kill signal: the
// remove deadline, and after a loss at most half the time left to the stop
// deadline. A REMOVE that does not succeed within it may take one more
// call (RequestTimeout) to read whether it was applied anyway.
func (s *Supervisor) removeBudget(lease *lockclient.Lease) time.Duration {
	if s.Config.LB == nil {
		return 0
	}
	budget := s.Config.LB.WithDefaults().RemoveDeadline
	if chans.Closed(lease.Lost()) {
		budget = min(budget, lockclient.BootUntil(lease.StopDeadline())/2)
	}
	for _, h := range hooksOf[budgetHook](s) {
		budget = h.capRemoveBudget(lease, budget)
	}
	return max(budget, 0)
}

// lbCheckTime is the one state read a failed REMOVE may add to its budget.
func (s *Supervisor) lbCheckTime() time.Duration {
	if s.Config.LB == nil {
		return 0
	}
	return s.Config.LB.WithDefaults().RequestTimeout
}

func (s *Supervisor) getenv(k string) string {
	if s.Getenv != nil {
		return s.Getenv(k)
	}
	return os.Getenv(k)
}

func (s *Supervisor) emit(ev Event) {
	ev.Time = time.Now()
	ev.Path = s.Config.Path
	s.state, s.message = ev.State, ev.Message
	s.observe(ev)
}

// observe passes ev to Observe and to the hooks that see events.
func (s *Supervisor) observe(ev Event) {
	if s.Observe != nil {
		s.Observe(ev)
	}
	for _, h := range hooksOf[eventHook](s) {
		h.observe(ev)
	}
}

// notify publishes a notice (see Event.Notice) without changing the
// state or the message that renew heartbeats repeat.
func (s *Supervisor) notify(ev Event) {
	ev.Time, ev.Path, ev.Notice = time.Now(), s.Config.Path, true
	s.observe(ev)
}

// Run supervises until the workload is gone and the lock released, and
// returns the exit code. sigs delivers the signals the supervisor received.
//
// Its steps, in order: set up (the hooks the config asks for, hooks.go);
// the hooks' checks before the lock is taken (refused); take the lease
// (acquireOrAdopt); the hooks' work once it is held (acquired: a gate waits
// for the previous holder's gated tasks); start the workload, if there is
// one, under its armed guard (startHeld), register it with the load
// balancer (registerLB) and hold the lease (hold) until the workload exits,
// the lease is lost or a stop comes, each of which ends in shutdown: LB
// REMOVE, stop, proof of death, release as the hooks allow.
func (s *Supervisor) Run(ctx context.Context, sigs <-chan os.Signal) int {
	s.setUp()
	if code, refused := s.refused(ctx); refused {
		return code
	}
	lease, code, done := s.acquireOrAdopt(ctx, sigs)
	if done {
		return code
	}
	if s.OnAcquire != nil {
		s.OnAcquire(lease)
	}
	for _, h := range hooksOf[acquiredHook](s) {
		if !h.acquired(lease) {
			s.emit(Event{State: StateLost, Fence: lease.Fence, Message: lockLostMessage(lease.Err())})
			return ExitLost
		}
	}
	r, code, started := s.startHeld(lease)
	if !started {
		return code
	}
	if code, failed := r.registerLB(); failed {
		return s.exitCode(r.end, code)
	}
	return s.exitCode(r.end, r.hold(ctx, sigs))
}

// exitCode is the run's exit code once the hold ended with end, as the
// hooks may change it.
func (s *Supervisor) exitCode(end ending, code int) int {
	for _, h := range hooksOf[exitHook](s) {
		code = h.exitCode(end, code)
	}
	return code
}

// setUp readies the supervisor for Run: a logger, the spawner, the hooks,
// and the child subreaper role when asked for (dropped, with a warning,
// when the kernel refuses it).
func (s *Supervisor) setUp() {
	if s.Logger == nil {
		s.Logger = hclog.NewNullLogger()
	}
	s.spawner = newSpawner()
	s.buildHooks()
	if s.Subreaper {
		if err := becomeSubreaper(); err != nil {
			s.Logger.Warn("cannot become a child subreaper: processes that leave the workload's process group are not tracked", "error", err)
			s.Subreaper = false
		}
	}
}

// refused runs the hooks' checks before the lock is taken. refused is
// true, with the exit code, when the lock must not be taken.
func (s *Supervisor) refused(ctx context.Context) (code int, refused bool) {
	for _, h := range hooksOf[checkHook](s) {
		if code, err := h.check(ctx); err != nil {
			return code, true
		}
	}
	return 0, false
}

// acquireOrAdopt takes the lease: a hook may take it over (a restarted gate
// adopts the lease its previous run left held), otherwise we wait for the
// lock (acquire). done is true when Run must return code without a lease.
func (s *Supervisor) acquireOrAdopt(ctx context.Context, sigs <-chan os.Signal) (lease *lockclient.Lease, code int, done bool) {
	for _, h := range hooksOf[leaseHook](s) {
		if l, code, handled, done := h.takeLease(ctx); handled {
			return l, code, done
		}
	}
	return s.acquire(ctx, sigs)
}

// heldRun is the workload running under a held lease: what the hold loop
// and shutdown act on. A run with no command (a gate's) has no workload:
// cmd, g and exited are nil.
type heldRun struct {
	s      *Supervisor
	lease  *lockclient.Lease
	g      *group
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	lb     *lbSession    // nil without a load balancer
	log    hclog.Logger
	end    ending // why the hold ended, once shutdown ran
}

// startHeld starts the workload under the lease: its process-group guard
// (which the driver requires), the workload in the guard's group, the
// subreaper's view of its tree, the guard armed, and the holding event.
// started is false, with the exit code, when the workload could not start;
// the lease is then released as finish allows. With no command there is
// no workload to start: only the holding event.
func (s *Supervisor) startHeld(lease *lockclient.Lease) (r *heldRun, code int, started bool) {
	log := s.Logger.With("fence", lease.Fence)
	if len(s.Config.Command) == 0 {
		r = &heldRun{s: s, lease: lease, log: log}
		s.emit(r.held(StateHolding, s.holdingMessage(lease)))
		return r, 0, true
	}
	if chans.Closed(lease.Lost()) {
		// Lost already (lease mode's first heartbeat, the hooks' work or
		// OnAcquire can outlast the fence): the workload would only be
		// killed again within the stop deadline.
		log.Error("the lease was lost before the workload could start; not starting it", "why", lease.Err())
		s.emit(Event{State: StateLost, Fence: lease.Fence, Message: lockLostMessage(lease.Err())})
		s.finish(lease, nil, nil, endLost)
		return nil, ExitLost, false
	}
	g, err := startGuard(s.spawner, s.Tree)
	if err != nil && s.RequireGuard {
		log.Error("cannot start the process-group guard; not starting the workload", "error", err)
		s.finish(lease, nil, nil, endStartFailed)
		return nil, ExitInfra, false
	}
	if err != nil {
		log.Warn("running without a process-group guard: descendants that outlive a killed supervisor are not cleaned up", "error", err)
	}
	cmd, g, err := s.startWorkload(lease, g)
	if err != nil {
		log.Error("cannot start the workload", "error", err)
		s.finish(lease, g, nil, endStartFailed)
		return nil, startErrorCode(err), false
	}
	log.Info("workload started", "pid", cmd.Process.Pid, "pgid", g.pgid)
	if s.Subreaper && s.Tree == nil {
		guard := 0
		if g.guard != nil {
			guard = g.guard.Process.Pid
		}
		s.Tree = guardedTree{newSubreaperTree(cmd.Process.Pid, guard), guard}
	}
	g.arm(s.guardDeadline(lease))
	r = &heldRun{s: s, lease: lease, g: g, cmd: cmd, log: log}
	r.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.exited) }()
	s.emit(r.held(StateHolding, s.holdingMessage(lease)))
	return r, 0, true
}

// holdingMessage is the holding event's message, as a hook words it.
func (s *Supervisor) holdingMessage(lease *lockclient.Lease) string {
	msg := acquiredMessage(lease.Fence)
	if lease.Holders > 0 {
		msg = acquiredSlotMessage(lease.Slot, lease.Holders, lease.Path(), lease.Fence)
	}
	for _, h := range hooksOf[holdHook](s) {
		if m := h.holdingMessage(lease); m != "" {
			msg = m
		}
	}
	return msg
}

// held is an event of the holding states, with the lease's deadlines and
// the workload's PID and group, which the driver's watchdog reads.
func (r *heldRun) held(state State, msg string) Event {
	ev := Event{State: state, Fence: r.lease.Fence, Message: msg,
		FenceDeadline: r.lease.FenceDeadline(), StopDeadline: r.lease.StopDeadline(), LastRenew: r.lease.LastRenew()}
	if r.cmd != nil {
		ev.WorkloadPID, ev.WorkloadPGID = r.cmd.Process.Pid, r.g.pgid
	}
	return ev
}

// code is the run's exit code once the workload is stopped: its own, or 0
// for a run with no workload.
func (r *heldRun) code() int {
	if r.cmd == nil {
		return 0
	}
	return exitCode(r.cmd.ProcessState)
}

// shutdown takes the instance out of the LB first, then stops the
// workload and releases as the hooks allow.
func (r *heldRun) shutdown(sig syscall.Signal, timeout time.Duration, end ending) {
	s, lease, g := r.s, r.lease, r.g
	r.end = end
	// The loop no longer re-arms the guard: give it the whole stop
	// (LB remove, then the grace), still capped by the stop deadline.
	until := lockclient.BootNow().Add(s.removeBudget(lease) + s.lbCheckTime() + timeout + 2*time.Second)
	g.arm(earliest(until, lease.StopDeadline()))
	s.deregister(r.lb, s.removeBudget(lease), r.held, lease.Renewed(), func() {
		g.arm(earliest(until, lease.StopDeadline()))
		s.emit(r.held(s.state, s.message))
	})
	if r.cmd == nil {
		for _, h := range hooksOf[messageHook](s) {
			if msg := h.stoppingMessage(end); msg != "" {
				s.emit(r.held(StateStopping, msg))
			}
		}
	} else {
		r.stop(sig, timeout)
	}
	s.finish(r.lease, g, r.exited, end)
}

// registerLB starts the load balancer session, when one is configured.
// failed is true, with the exit code, when it could not: the workload has
// then been shut down.
func (r *heldRun) registerLB() (code int, failed bool) {
	s := r.s
	if s.Config.LB == nil {
		return 0, false
	}
	var err error
	if r.lb, err = s.startLB(r.lease); err != nil {
		r.log.Error("cannot register with the load balancer", "error", err)
		msg := lbStartFailedMessage(err)
		for _, h := range hooksOf[messageHook](s) {
			msg = h.lbFailedMessage(err, s.Config.LB.Config, true)
		}
		s.emit(r.held(StateStopping, msg))
		r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, endLBFailed)
		return ExitLBFailed, true
	}
	return 0, false
}

// hold is the holding state. Each renewal re-arms the guard and republishes
// the deadlines; LB events are relayed and other signals forwarded to the
// workload. The workload's exit, the lease's loss, a failed LB ADD, a stop
// request or a terminating signal shuts down and ends the run with its
// exit code. A hook may word the holding event and ask for the instance
// to leave the load balancer while the hold goes on (a gate whose
// allocation is being stopped, before Nomad kills the gated task).
func (r *heldRun) hold(ctx context.Context, sigs <-chan os.Signal) int {
	s, lease, lb := r.s, r.lease, r.lb
	hctx, cancelHold := context.WithCancel(ctx)
	defer cancelHold()
	var deregisterC []<-chan struct{}
	for _, h := range hooksOf[holdHook](s) {
		if c := h.holding(hctx, lease); c != nil {
			deregisterC = append(deregisterC, c)
		}
	}
	deregister := anyClosed(hctx, deregisterC...)
	// A stop request a hook delays (delayHook): the request, when it
	// came, and the hook's channel.
	var delayed *StopRequest
	var delayedAt time.Time
	var delayC <-chan string

	for {
		select {
		case <-lease.Renewed():
			r.g.arm(s.guardDeadline(lease))
			s.emit(r.held(s.state, s.message))

		case ev := <-lb.eventsC():
			if err := s.handleLB(lb, ev, r.held); err != nil {
				return r.lbAddFailed(err)
			}

		case <-deregister:
			deregister = nil
			r.log.Info("leaving the load balancer before the workload is stopped", "hooks", len(deregisterC))
			s.deregister(lb, s.removeBudget(lease), r.held, lease.Renewed(), func() {
				r.g.arm(s.guardDeadline(lease))
				s.emit(r.held(s.state, s.message))
			})

		case <-lb.recheckC():
			if lb.registered && !lb.busy && !lb.deregistered {
				lb.check()
			}

		case <-r.exited:
			code := exitCode(r.cmd.ProcessState)
			r.log.Info("workload exited", "code", code)
			r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, endExited)
			return code

		case <-lease.Lost():
			return r.lost()

		case req := <-s.Stop:
			if delayed != nil {
				r.log.Info("second stop request: stopping at once", "kill_timeout", req.Timeout)
				r.shutdown(req.Signal, r.delayedLeft(*delayed, delayedAt), endStopRequest)
				return r.code()
			}
			r.log.Info("stop requested", "kill_signal", signalName(req.Signal), "kill_timeout", req.Timeout)
			s.stopArrived(endStopRequest)
			if c := r.delayStop(hctx, req); c != nil {
				delayed, delayedAt, delayC = &req, lockclient.BootNow(), c
				continue
			}
			r.shutdown(req.Signal, req.Timeout, endStopRequest)
			return r.code()

		case msg, ok := <-delayC:
			if ok {
				s.notify(r.held(s.state, msg))
				continue
			}
			r.log.Info("stopping after the stop's delay", "waited", lockclient.BootNow().Sub(delayedAt).Round(time.Millisecond))
			r.shutdown(delayed.Signal, r.delayedLeft(*delayed, delayedAt), endStopRequest)
			return r.code()

		case sig := <-sigs:
			if code, stopped := r.signal(sig); stopped {
				return code
			}
		}
	}
}

// delayStop asks the hooks whether the workload keeps serving a while
// after the stop request req: budget is the request's kill_timeout less the
// workload's own grace (lock.kill_timeout), so that the stop after the
// delay still has that grace. nil: stop at once.
func (r *heldRun) delayStop(ctx context.Context, req StopRequest) <-chan string {
	budget := req.Timeout - r.s.Config.KillTimeout
	if budget <= 0 || r.cmd == nil {
		return nil
	}
	for _, h := range hooksOf[delayHook](r.s) {
		if c := h.delayStop(ctx, budget); c != nil {
			return c
		}
	}
	return nil
}

// delayedLeft is the grace left of a delayed stop request that came at
// at: its kill_timeout less the delay, and never less than the workload's
// own grace (the delay's budget leaves that much).
func (r *heldRun) delayedLeft(req StopRequest, at time.Time) time.Duration {
	return max(req.Timeout-lockclient.BootNow().Sub(at), r.s.Config.KillTimeout)
}

// stopArrived tells the hooks that a stop arrived, at once.
func (s *Supervisor) stopArrived(end ending) {
	for _, h := range hooksOf[stopHook](s) {
		h.stopArrived(end)
	}
}

// lbAddFailed shuts down after the load balancer refused our ADD for good.
func (r *heldRun) lbAddFailed(err error) int {
	s := r.s
	r.log.Error("stopping: the load balancer ADD failed", "error", err)
	msg := lbAddFailedMessage(err, r.lb.client.Config())
	for _, h := range hooksOf[messageHook](s) {
		msg = h.lbFailedMessage(err, r.lb.client.Config(), false)
	}
	s.emit(r.held(StateStopping, msg))
	r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, endLBFailed)
	return ExitLBFailed
}

// lost stops the workload after the lease was lost, within its stop deadline.
func (r *heldRun) lost() int {
	s, lease := r.s, r.lease
	why := lease.Err()
	r.log.Error("lock lost, stopping the workload", "why", why, "stop_deadline", lockclient.BootUntil(lease.StopDeadline()).Round(time.Millisecond))
	s.emit(r.held(StateLost, lockLostMessage(why)))
	r.shutdown(s.Config.KillSignal, s.Config.KillTimeout, endLost)
	return ExitLost
}

// signal stops the workload on SIGTERM or SIGINT (with kill_signal instead,
// when one is set) and forwards any other signal to it. stopped is true,
// with the exit code, once the workload was stopped.
func (r *heldRun) signal(sig os.Signal) (code int, stopped bool) {
	s := r.s
	sys, _ := sig.(syscall.Signal)
	if sys == syscall.SIGTERM || sys == syscall.SIGINT {
		stopSig := sys
		if s.Config.KillSignalSet {
			stopSig = s.Config.KillSignal
		}
		r.log.Info("stopping on signal", "signal", sig, "kill_signal", stopSig)
		s.stopArrived(endSignal)
		r.shutdown(stopSig, s.Config.KillTimeout, endSignal)
		return r.code(), true
	}
	if r.cmd == nil {
		r.log.Debug("signal while holding, no workload to forward it to", "signal", sig)
		return 0, false
	}
	r.log.Debug("forwarding signal", "signal", sig, "pid", r.cmd.Process.Pid)
	if err := r.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		r.log.Warn("forward signal", "signal", sig, "error", err)
	}
	return 0, false
}

// acquire waits for the lock. Terminating signals abort the wait. done is
// true when Run must return code without running the workload.
func (s *Supervisor) acquire(ctx context.Context, sigs <-chan os.Signal) (lease *lockclient.Lease, code int, done bool) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		lease *lockclient.Lease
		err   error
	}
	results := make(chan result, 1)
	s.emit(Event{State: StateWaiting}) // no message: "held by ..." follows if it is held
	opts := lockclient.AcquireOptions{
		Wait:    s.Config.Wait,
		TryOnce: s.Config.EarlyReturn,
		OnBlocked: func(h lockclient.Holder) {
			s.emit(Event{State: StateWaiting, Holder: h,
				Message: waitingHeldMessage(s.Config.Path, h)})
		},
	}
	for _, h := range hooksOf[acquireHook](s) {
		h.acquireOptions(&opts)
	}
	go func() {
		l, err := s.acquireWaitingForPolicy(actx, opts)
		results <- result{l, err}
	}()

	var interrupted os.Signal
	var aborts []<-chan struct{}
	for _, h := range hooksOf[waitHook](s) {
		aborts = append(aborts, h.abortWait(actx))
	}
	stopping := anyClosed(actx, aborts...)
	for {
		select {
		case <-stopping:
			s.Logger.Info("the allocation is being stopped, no longer waiting for the lock")
			s.emit(Event{State: StateWaiting, Message: stoppedWhileWaitingMessage()})
			interrupted, stopping = syscall.SIGTERM, nil
			cancel()
		case r := <-results:
			switch {
			case r.err == nil && interrupted != nil:
				s.release(r.lease)
				return nil, signalCode(interrupted), true
			case r.err == nil:
				return r.lease, 0, false
			case interrupted != nil:
				return nil, signalCode(interrupted), true
			}
			return nil, s.acquireErrorCode(r.err), true
		case req := <-s.Stop:
			s.Logger.Info("stop requested while waiting for the lock, giving up")
			interrupted = req.Signal
			cancel()
		case sig := <-sigs:
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
				s.Logger.Info("signal while waiting for the lock, giving up", "signal", sig)
				interrupted = sig
				cancel()
			default:
				s.Logger.Debug("signal while waiting for the lock, no workload to forward it to", "signal", sig)
			}
		}
	}
}

// Bounds of the backoff between acquire attempts while the lock is denied
// (WaitForPolicy).
const (
	deniedRetryMin = 2 * time.Second
	deniedRetryMax = 30 * time.Second
)

// acquireWaitingForPolicy is Locker.Acquire; with WaitForPolicy, an HTTP 403
// is a wait: an event names the policy to apply (again whenever the reason
// changes), and the acquire is retried with backoff until it is applied or
// ctx ends.
func (s *Supervisor) acquireWaitingForPolicy(ctx context.Context, opts lockclient.AcquireOptions) (*lockclient.Lease, error) {
	wait, said := deniedRetryMin, ""
	for {
		l, err := s.Locker.Acquire(ctx, opts)
		var pe *lockclient.PermissionError
		if err == nil || !s.WaitForPolicy || !errors.As(err, &pe) || ctx.Err() != nil {
			return l, err
		}
		if msg := lockDeniedMessage(pe); msg != said {
			s.Logger.Error(pe.Error())
			s.emit(Event{State: StateWaiting, Message: msg})
			said = msg
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, deniedRetryMax)
	}
}

func (s *Supervisor) acquireErrorCode(err error) int {
	var ce *lockclient.ConfigError
	var pe *lockclient.PermissionError
	switch {
	case errors.Is(err, lockclient.ErrNotAcquired):
		s.Logger.Info("lock not acquired and -early-return is set: exiting without running the command", "reason", err)
		return 0
	case errors.Is(err, lockclient.ErrWaitTimeout):
		s.Logger.Error("lock not acquired in time", "error", err)
		return ExitWaitTimeout
	case errors.As(err, &pe):
		s.Logger.Error(pe.Error())
		return ExitPermission
	case errors.As(err, &ce):
		s.Logger.Error("invalid lock configuration", "error", err)
		return ExitConfig
	}
	s.Logger.Error("cannot acquire the lock", "error", err)
	return ExitInfra
}

// startWorkload execs the command with no shell (unless Shell), in the
// guard's process group, with PDEATHSIG, NOMAD_LOCK_PATH and NOMAD_LOCK_FENCE
// (and NOMAD_LOCK_SLOT for a semaphore's slot).
func (s *Supervisor) startWorkload(lease *lockclient.Lease, g *group) (*exec.Cmd, *group, error) {
	argv := s.Config.Command
	if s.Config.Shell {
		sh := os.Getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		argv = []string{sh, "-c", strings.Join(argv, " ")}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, g, fmt.Errorf("command %q: %w", argv[0], err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: s.workloadEnv(lease), Dir: s.Dir,
		Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr,
		WaitDelay: time.Second} // don't hang on pipes held by processes that left the group
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.Credential}
	if g != nil {
		attr.Pgid = g.pgid
	}
	cmd.SysProcAttr = attr
	start := func() error { return s.spawner.start(cmd) }
	if s.StartIn != nil {
		err = s.StartIn(start)
	} else {
		err = start()
	}
	if err != nil {
		return nil, g, fmt.Errorf("start %q: %w", path, err)
	}
	if g == nil {
		g = &group{pgid: cmd.Process.Pid}
	}
	return cmd, g, nil
}

func (s *Supervisor) workloadEnv(lease *lockclient.Lease) []string {
	base := s.Env
	if base == nil {
		base = os.Environ()
	}
	env := make([]string, 0, len(base)+2)
	for _, kv := range base {
		if !strings.HasPrefix(kv, "NOMAD_LOCK_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"NOMAD_LOCK_PATH="+lease.Path(),
		"NOMAD_LOCK_FENCE="+strconv.FormatUint(lease.Fence, 10))
	if lease.Holders > 0 {
		env = append(env, "NOMAD_LOCK_SLOT="+strconv.Itoa(lease.Slot))
	}
	return env
}

// stop ends the workload: sig to the group, grace until every member is gone
// or timeout passes, then SIGKILL to the group (in finish). A workload that
// already exited with no stragglers left is not signalled at all.
//
// A graceful stop of a healthy lock gets its whole timeout: renewals go on
// and push the guard's deadline and the deadlines the driver's watchdog
// reads. Only a lost lease cuts the grace, to the lease's stop deadline
// (before the server can free the lock), and an event says so. A loss that
// the server did not declare (renews late or failing past the fence
// deadline, as on a loaded machine) is tried back (see retake): if the lock
// is still ours, the grace is whole again on the lease retaken, which
// replaces r.lease.
func (r *heldRun) stop(sig syscall.Signal, timeout time.Duration) {
	s, g, exited := r.s, r.g, r.exited
	if chans.Closed(exited) {
		if s.treeEmpty(g) {
			return
		}
		s.Logger.Info("workload exited but left processes behind, stopping them", "signal", sig)
	}
	s.emit(r.held(StateStopping, stoppingMessage(signalName(sig))))
	if err := g.signal(sig); err != nil {
		s.Logger.Warn("signal workload group", "signal", sig, "error", err)
	}
	if s.Tree != nil {
		if err := s.Tree.Signal(sig); err != nil {
			s.Logger.Warn("signal the workload's process tree", "signal", sig, "error", err)
		}
	}
	began := lockclient.BootNow()
	end := began.Add(timeout)
	deadline := graceEnd(end, r.lease)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	grace := lockclient.NewBootTimer(lockclient.BootUntil(deadline))
	defer grace.Stop()
	var lost <-chan struct{}
	if !chans.Closed(r.lease.Lost()) {
		lost = r.lease.Lost() // lost before the stop: lost() said so
	}
	rt := newRetaker(s)
	defer func() {
		if l := rt.stop(); l != nil {
			r.lease = l // retaken as the stop ended: finish releases it
		}
	}()
	for {
		select {
		case <-grace.C():
			if deadline.Before(end) {
				s.emit(r.held(StateStopping, killAfterLossMessage(lockclient.BootNow().Sub(began).Round(time.Second), timeout, r.lease.Err())))
			} else {
				s.Logger.Warn("workload did not stop in time, sending SIGKILL", "grace", timeout)
			}
			return
		case <-lost:
			lost = nil
			deadline = graceEnd(end, r.lease)
			grace.Reset(lockclient.BootUntil(deadline))
			renewing := rt.start(r.lease)
			s.emit(r.held(StateStopping, lostWhileStoppingMessage(r.lease.Err(), deadline.Before(end),
				lockclient.BootUntil(deadline).Round(time.Second), lockclient.BootUntil(end).Round(time.Second), renewing)))
		case l := <-rt.retaken:
			r.lease, lost = l, l.Lost()
			deadline = graceEnd(end, l)
			grace.Reset(lockclient.BootUntil(deadline))
			g.arm(earliest(deadline.Add(2*time.Second), l.StopDeadline()))
			s.emit(r.held(StateStopping, renewedAgainMessage(timeout, lockclient.BootUntil(deadline).Round(time.Second))))
		case <-r.lease.Renewed():
			// Still ours: keep the guard, and the driver's watchdog (which
			// reads the deadlines this event publishes), from cutting a long
			// kill_timeout short.
			g.arm(earliest(deadline.Add(2*time.Second), r.lease.StopDeadline()))
			s.emit(r.held(s.state, s.message))
		case <-poll.C:
			if chans.Closed(exited) && s.treeEmpty(g) {
				return
			}
		}
	}
}

// graceEnd is when a stop's grace ends: end (its kill_timeout after the
// stop began), cut to the lease's stop deadline once the lease is lost.
func graceEnd(end time.Time, lease *lockclient.Lease) time.Time {
	if chans.Closed(lease.Lost()) {
		return earliest(end, lease.StopDeadline())
	}
	return end
}

// treeEmpty reports whether no process of the workload is left: none in its
// group, and none in its tree (when the supervisor has a view of it).
func (s *Supervisor) treeEmpty(g *group) bool {
	if left, err := g.members(); err != nil || len(left) > 0 {
		return false
	}
	if s.Tree == nil {
		return true
	}
	alive, err := s.Tree.Alive()
	return err == nil && !alive
}

// Tree is a view of every process of the workload, wherever it went: the
// driver's task cgroup, or the descendants of a subreaper.
type Tree interface {
	// Signal sends sig to every process of the workload.
	Signal(sig syscall.Signal) error
	// Alive reports whether any process of the workload is left.
	Alive() (bool, error)
	// KillAll SIGKILLs every process of the workload and returns nil only
	// once none is left (within timeout).
	KillAll(timeout time.Duration) error
}

// finish makes sure no process of the group survives, then releases as the
// hooks allow (end is why the run ends). If the group cannot be confirmed
// dead the lock is NOT released: it then expires on the server after
// 2*TTL + lock delay, so no second holder can overlap. A run with no
// command has no workload to prove dead.
func (s *Supervisor) finish(lease *lockclient.Lease, g *group, exited <-chan struct{}, end ending) {
	if len(s.Config.Command) > 0 && !s.workloadDead(g, exited) {
		return
	}
	hooks := hooksOf[releaseHook](s)
	clean := len(hooks) > 0 // marked clean only if every hook says so
	for _, h := range hooks {
		release, c := h.mayRelease(lease, end)
		if !release {
			return
		}
		clean = clean && c
	}
	if clean {
		s.markReleasedClean(lease)
	}
	s.release(lease)
}

// workloadDead SIGKILLs whatever is left of the workload and reports
// whether every process of it is proven dead.
func (s *Supervisor) workloadDead(g *group, exited <-chan struct{}) bool {
	if g != nil {
		if ok, err := g.killAll(confirmTimeout); !ok {
			s.Logger.Error("not releasing the lock: the workload's processes could not be confirmed dead; it expires on its own", "error", err)
			return false
		}
	}
	if s.Tree != nil {
		if err := s.Tree.KillAll(confirmTimeout); err != nil {
			s.Logger.Error("not releasing the lock: the workload's process tree could not be proven dead; it expires on its own", "error", err)
			return false
		}
	}
	if exited != nil {
		<-exited
	}
	return true
}

// guardDeadline is when the process-group guard kills the workload if the
// supervisor is frozen and never re-arms it: the fence deadline plus the
// kill timeout (what an unfrozen supervisor would have allowed the workload
// after a loss), capped by the stop deadline, which comes before the server
// can expire the lock and let a standby in.
func (s *Supervisor) guardDeadline(lease *lockclient.Lease) time.Time {
	return earliest(lease.FenceDeadline().Add(s.Config.KillTimeout+time.Second), lease.StopDeadline())
}

func (s *Supervisor) release(lease *lockclient.Lease) {
	timeout := s.Locker.Config().RequestTimeout + time.Second
	ctx, cancel := lockclient.WithBootTimeout(context.Background(), timeout)
	defer cancel()
	err := lease.Release(ctx)
	if s.OnReleaseTried != nil {
		tried := err
		if errors.Is(err, lockclient.ErrLost) || errors.Is(err, lockclient.ErrLeftToExpire) {
			// Nothing for anyone to release: gone, or left to expire.
			tried = nil
		}
		defer s.OnReleaseTried(tried)
	}
	switch {
	case err == nil:
		s.emit(Event{State: StateReleased, Fence: lease.Fence, Message: releasedMessage()})
	case errors.Is(err, lockclient.ErrLost):
		s.Logger.Info("nothing to release: the lock was already gone", "reason", err)
	case errors.Is(err, lockclient.ErrLeftToExpire):
		s.Logger.Warn("not releasing the lock: left to expire", "reason", err)
		s.emit(Event{State: StateStopping, Fence: lease.Fence, Message: LeftToExpireMessage(err)})
	default:
		s.Logger.Warn("release failed; the lock expires on its own", "error", err)
		s.emit(Event{State: StateStopping, Fence: lease.Fence, Message: releaseFailedMessage(err, s.Locker.Config(), s.PluginReleases)})
	}
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return ExitInfra
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func startErrorCode(err error) int {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return ExitNotFound
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.ENOEXEC):
		return ExitCannotExec
	}
	return ExitCannotExec
}

func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

func signalName(sig syscall.Signal) string {
	for name, s := range signalsByName {
		if s == sig {
			return name
		}
	}
	return "signal " + strconv.Itoa(int(sig))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
