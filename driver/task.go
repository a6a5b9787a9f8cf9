package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
	"golang.org/x/sys/unix"
)

// Timings of the plugin side.
const (
	// watchInterval is how often the plugin reads the supervisor's status
	// and events.
	watchInterval = 100 * time.Millisecond
	// watchdogGrace is how long past a deadline the watchdog waits for the
	// supervisor to act before it kills the workload itself. A healthy
	// supervisor acts at the deadline; the server expires the lock a full
	// TTL later, so this grace costs no safety.
	watchdogGrace = time.Second
	// stopReserve is added to kill_timeout for the supervisor to SIGKILL
	// stragglers and release the lock before StopTask kills it.
	stopReserve = 10 * time.Second
	// killWait bounds the wait for a SIGKILLed supervisor to disappear.
	killWait = 5 * time.Second
)

// driverState is persisted by Nomad in the task handle, to recover the task
// after a plugin restart.
type driverState struct {
	PID        int
	StartTicks uint64
	StartedAt  time.Time
	StateDir   string
}

// taskHandle is the plugin's view of one task's supervisor.
type taskHandle struct {
	cfg       *drivers.TaskConfig
	dir       *securefs.Dir
	proc      *supervisorProc
	cgroup    *taskCgroup
	startedAt time.Time
	logger    hclog.Logger

	done chan struct{}
	// holding, for a gate, is closed once its supervisor holds the lock
	// (StartTask returns only then); nil for other tasks.
	holding     chan struct{}
	holdingOnce sync.Once

	mu          sync.Mutex
	exit        *drivers.ExitResult
	completedAt time.Time
	status      supervisorStatus
	watchdogHit bool
}

func (h *taskHandle) exited() bool { return chans.Closed(h.done) }

func (h *taskHandle) lastStatus() supervisorStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status
}

// StartTask starts the task's supervisor, detached in its own session.
func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	if _, ok := d.tasks.get(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task %q already started", cfg.ID)
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, nil, fmt.Errorf("decode task config: %w", err)
	}
	d.mu.RLock()
	ttl, delay, root, users, denied := d.ttl, d.delay, d.stateRoot, d.users, d.config.DeniedEnvvars
	d.mu.RUnlock()
	if root == nil {
		return nil, nil, errors.New("the plugin has no state dir: see the agent log for the plugin config error")
	}

	lbSpec, err := resolveLBFiles(cfg, tc.LoadBalancer)
	if err != nil {
		return nil, nil, err
	}
	tc.LoadBalancer = lbSpec
	sc, err := tc.shimConfig(cfg, ttl, delay)
	if err != nil {
		return nil, nil, err
	}
	if err := checkIdentity(cfg); err != nil {
		return nil, nil, err
	}
	spec, err := buildSpec(cfg, tc, sc, users)
	if err != nil {
		return nil, nil, err
	}
	spec.DeniedEnvvars = slices.Concat(denied, tc.DeniedEnvvars)
	cg, err := newTaskCgroup(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := cg.applyLimits(cfg.Resources); err != nil {
		return nil, nil, fmt.Errorf("task cgroup: %w", err)
	}
	spec.CgroupProcs = cg.procsFiles()
	if cg != nil {
		spec.CgroupMode, spec.CgroupPath = int(cg.mode), cg.path
		if n, err := cg.oomKills(); err == nil {
			spec.OOMKillsAtStart = &n
		} else {
			d.logger.Warn("cannot read the task cgroup's OOM kill count: an OOM kill will not be reported", "error", err)
		}
	}

	if spec.Gate != nil {
		spec.Gate.Adopt = d.gateLeases.take(cfg)
		if a := d.supersedeGate(cfg, root); a != nil {
			spec.Gate.Adopt = a
		}
	}
	dir, err := openTaskState(root, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("task state dir: %w", err)
	}
	if err := prepareStateDir(dir, spec); err != nil {
		dir.Close()
		return nil, nil, err
	}
	proc, err := d.launch(cfg, dir.Path())
	if err != nil {
		dir.Close()
		return nil, nil, err
	}
	ticks, _ := startTicks(proc.pid)

	h := &taskHandle{
		cfg: cfg, dir: dir, proc: proc, cgroup: cg, startedAt: time.Now(),
		logger: d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		done:   make(chan struct{}),
	}
	if tc.Gate {
		h.holding = make(chan struct{})
	}
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg
	if err := handle.SetDriverState(&driverState{PID: proc.pid, StartTicks: ticks, StartedAt: h.startedAt, StateDir: dir.Path()}); err != nil {
		_ = proc.signal(syscall.SIGKILL)
		return nil, nil, fmt.Errorf("set driver state: %w", err)
	}
	d.tasks.set(cfg.ID, h)
	go d.run(h, &eventTail{dir: dir})
	h.logger.Info("started supervisor", "pid", proc.pid, "lock", sc.Path)
	if h.holding != nil {
		if err := d.waitGateHolding(h, root, sc.Path); err != nil {
			return nil, nil, err
		}
	}
	return handle, nil, nil
}

// checkIdentity fails fast when the task cannot reach the Task API.
func checkIdentity(cfg *drivers.TaskConfig) error {
	if cfg.Env["NOMAD_TOKEN"] != "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(cfg.TaskDir().SecretsDir, "nomad_token")); err == nil {
		return nil
	}
	return fmt.Errorf("task %q has no workload identity token, so it cannot take the lock: "+
		"add `identity { env = true }` (or `identity { file = true }`) to the task", cfg.Name)
}

// buildSpec turns the validated config into the supervisor's spec, with the
// task's user resolved and checked against the plugin's user policy.
func buildSpec(cfg *drivers.TaskConfig, tc TaskConfig, sc shim.Config, users userPolicy) (supervisorSpec, error) {
	spec := supervisorSpec{
		LB: tc.LoadBalancer, Health: tc.HealthCheck,
		TaskID: cfg.ID, Path: sc.Path, Namespace: sc.Namespace, Command: sc.Command,
		TTL: sc.TTL, LockDelay: sc.LockDelay, Renew: sc.Renew, Wait: sc.Wait,
		KillSignal: int(sc.KillSignal), KillSigSet: sc.KillSignalSet, KillTimeout: sc.KillTimeout,
		WorkDir: cmp.Or(tc.WorkDir, cfg.TaskDir().Dir), SecretsDir: cfg.TaskDir().SecretsDir, ShareNomadToken: tc.ShareNomadToken,
		OOMScoreAdj: tc.OOMScoreAdj,
	}
	if g := sc.Gate; g != nil {
		spec.Gate = &gateSpec{AllocID: g.AllocID, Task: g.Task, Namespace: g.Namespace}
	}
	id, err := users.resolve(cfg.User)
	if err != nil {
		return spec, err
	}
	// A work_dir of the job's choosing is not checked here (that would tell
	// the job about paths its user cannot see): the workload changes into it
	// as the task user, so the kernel's permission checks decide.
	if err := checkReach(cfg.TaskDir().Dir, id); err != nil {
		return spec, err
	}
	if id.uid != 0 {
		uid := id.uid
		spec.UID, spec.GID, spec.Groups = &uid, id.gid, id.groups
	}
	return spec, nil
}

// prepareStateDir empties the task's state dir (a restarted task may reuse
// it) and writes the spec.
func prepareStateDir(dir *securefs.Dir, spec supervisorSpec) error {
	for _, f := range []string{statusFile, eventsFile, offsetFile, exitFile, stopFile, leaseFile, lbFile} {
		if err := dir.Remove(f); err != nil {
			return err
		}
	}
	return writeJSON(dir, specFile, spec)
}

// launch re-execs this binary as the supervisor in a new session, with the
// task's log FIFOs as stdout and stderr and the task environment (token
// included: environment, never argv).
func (d *Driver) launch(cfg *drivers.TaskConfig, dir string) (*supervisorProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary: %w", err)
	}
	stdout, err := openLogFIFO(cfg.StdoutPath)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := openLogFIFO(cfg.StderrPath)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()

	env := make([]string, 0, len(cfg.Env)+1)
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	if _, ok := cfg.Env["NOMAD_NODE_NAME"]; !ok && cfg.NodeName != "" {
		env = append(env, "NOMAD_NODE_NAME="+cfg.NodeName)
	}
	sort.Strings(env)

	cmd := exec.Command(self, SuperviseCommand, dir)
	cmd.Dir = cfg.TaskDir().Dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	return &supervisorProc{pid: cmd.Process.Pid, cmd: cmd, pidfd: -1}, nil
}

// openLogFIFO opens the write end of a logmon FIFO (or /dev/null). Opening
// blocks until logmon has the read end open, so it is bounded.
func openLogFIFO(path string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The log dir is in the shared alloc dir, which the task user can
		// write: never follow a symlink there, and write only to a FIFO (or
		// /dev/null), never to a file that root would then fill.
		f, err := os.OpenFile(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			if fi, serr := f.Stat(); serr != nil || !(fi.Mode()&os.ModeNamedPipe != 0 || path == os.DevNull && fi.Mode()&os.ModeCharDevice != 0) {
				f.Close()
				f, err = nil, fmt.Errorf("not a FIFO: refusing to write the task's log into it")
			}
		}
		ch <- result{f, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("open task log %s: %w", path, r.err)
		}
		return r.f, nil
	case <-time.After(30 * time.Second):
		go func() {
			if r := <-ch; r.f != nil {
				r.f.Close()
			}
		}()
		return nil, fmt.Errorf("open task log %s: no reader after 30s (is logmon running?)", path)
	}
}

// RecoverTask reattaches to a supervisor after a plugin restart. The task
// keeps running and keeps its lock: the supervisor never noticed.
func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return errors.New("recover task: nil handle")
	}
	if _, ok := d.tasks.get(handle.Config.ID); ok {
		return nil
	}
	var st driverState
	if err := handle.GetDriverState(&st); err != nil {
		return fmt.Errorf("recover task: decode driver state: %w", err)
	}
	cfg := handle.Config
	cg, _ := newTaskCgroup(cfg)
	dir, err := securefs.OpenPrivate(st.StateDir, false)
	if err != nil {
		// A task started by an older plugin keeps its state in the task dir,
		// which the task user can write: nothing in it can be trusted. Kill
		// its supervisor (proven by PID and start time; its group guard then
		// kills the workload) and let the lock expire on the server.
		if proc, ferr := findSupervisor(st.PID, st.StartTicks); ferr == nil {
			_ = proc.signal(syscall.SIGKILL)
			unix.Close(proc.pidfd)
		}
		return fmt.Errorf("recover task: its state dir cannot be trusted (%w); its supervisor was killed and "+
			"its lock expires on the server within 2×TTL + delay", err)
	}
	h := &taskHandle{
		cfg: cfg, dir: dir, cgroup: cg, startedAt: st.StartedAt,
		logger: d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		done:   make(chan struct{}),
	}
	tail := &eventTail{dir: dir}
	tail.restore()

	proc, err := findSupervisor(st.PID, st.StartTicks)
	if err != nil && !errors.Is(err, errSupervisorGone) {
		// No pidfd (say EMFILE), but the supervisor may live: Nomad would
		// otherwise start a second one beside it. Watch it by PID and start
		// time instead.
		h.logger.Warn("recover task: no pidfd on the supervisor; watching it by PID and start time", "pid", st.PID, "error", err)
		proc, err = &supervisorProc{pid: st.PID, pidfd: -1, ticks: st.StartTicks}, nil
	}
	switch {
	case errors.Is(err, errSupervisorGone):
		h.logger.Warn("supervisor exited while the plugin was down", "pid", st.PID)
		d.tasks.set(cfg.ID, h)
		go func() {
			d.drainEvents(h, tail)
			d.cleanUpAfterExit(h)
			h.finish(d.exitResult(h, nil, nil))
		}()
		return nil
	case err != nil:
		return fmt.Errorf("recover task: %w", err)
	}
	h.proc = proc
	d.tasks.set(cfg.ID, h)
	go d.run(h, tail)
	h.logger.Info("recovered supervisor", "pid", st.PID)
	return nil
}

// run watches one supervisor until it exits: it relays its events, runs the
// watchdog, and records the exit.
func (d *Driver) run(h *taskHandle, tail *eventTail) {
	type waited struct {
		state *os.ProcessState
		err   error
	}
	exited := make(chan waited, 1)
	go func() {
		ps, err := h.proc.wait()
		exited <- waited{ps, err}
	}()
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	for {
		select {
		case w := <-exited:
			d.drainEvents(h, tail)
			d.cleanUpAfterExit(h)
			h.finish(d.exitResult(h, w.state, w.err))
			return
		case <-tick.C:
			d.drainEvents(h, tail)
			d.watchdog(h)
		}
	}
}

// drainEvents turns new supervisor events into task events and refreshes
// the cached status.
func (d *Driver) drainEvents(h *taskHandle, tail *eventTail) {
	var st supervisorStatus
	if err := readJSON(h.dir, statusFile, &st); err == nil {
		h.mu.Lock()
		h.status = st
		h.mu.Unlock()
		if h.holding != nil && shim.State(st.State).Holds() {
			h.holdingOnce.Do(func() { close(h.holding) })
		}
	}
	evs, err := tail.read()
	if err != nil {
		h.logger.Debug("read supervisor events", "error", err)
	}
	for _, ev := range evs {
		ann := map[string]string{"lock_state": ev.State}
		if ev.Fence != 0 {
			ann["fence"] = strconv.FormatUint(ev.Fence, 10)
		}
		if ev.Holder != "" {
			ann["holder_alloc_id"] = ev.Holder
		}
		d.emitEvent(h.cfg, ev.Message, ann)
	}
	if len(evs) > 0 {
		tail.save()
	}
}

// watchdog kills the workload's process group, and the supervisor, when the
// supervisor has let a deadline pass while the workload still runs (e.g. it
// is SIGSTOPped or starved). No second holder can then overlap a stuck one.
func (d *Driver) watchdog(h *taskHandle) {
	st := h.lastStatus()
	if st.WorkloadPGID == 0 {
		return
	}
	now, grace := monoNow(), int64(watchdogGrace)
	var why string
	switch state := shim.State(st.State); {
	case state.Holds():
		if st.FenceDeadlineMono > 0 && now > st.FenceDeadlineMono+grace {
			why = fmt.Sprintf("supervisor unresponsive %s past its fence deadline", time.Duration(now-st.FenceDeadlineMono).Round(time.Millisecond))
		}
	case state == shim.StateLost || state == shim.StateStopping:
		if st.StopDeadlineMono > 0 && now > st.StopDeadlineMono+grace {
			why = fmt.Sprintf("workload still running %s past its stop deadline", time.Duration(now-st.StopDeadlineMono).Round(time.Millisecond))
		}
	}
	if why == "" || !groupAlive(st.WorkloadPGID) {
		return
	}
	h.mu.Lock()
	first := !h.watchdogHit
	h.watchdogHit = true
	h.mu.Unlock()
	h.logger.Error("watchdog: killing the task", "why", why)
	h.killTask()
	if first {
		d.emitEvent(h.cfg, "Lock lost: watchdog killed the workload: "+why, map[string]string{"lock_state": string(shim.StateLost)})
	}
}

// exitResult is the task's exit: the supervisor's exit code (the workload's
// own, or a documented lock code) from exit.json, else from the wait status.
// errOOMKilled is the exit message of a task whose memory cgroup OOM-killed a
// workload process (the docker driver says "OOM Killed" too).
var errOOMKilled = errors.New("OOM Killed: a workload process went over the task's memory limit; raise resources.memory (or memory_max)")

func (d *Driver) exitResult(h *taskHandle, ps *os.ProcessState, waitErr error) *drivers.ExitResult {
	var es exitStatus
	if err := readJSON(h.dir, exitFile, &es); err == nil {
		res := &drivers.ExitResult{ExitCode: es.ExitCode, Signal: es.Signal, OOMKilled: es.OOMKilled}
		if es.OOMKilled {
			res.Err = errOOMKilled
		}
		return res
	}
	// The supervisor died without its exit status: the plugin compares the
	// OOM kill count itself.
	var spec supervisorSpec
	oom := readJSON(h.dir, specFile, &spec) == nil && h.cgroup.oomKilledSince(spec.OOMKillsAtStart)
	if ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &drivers.ExitResult{ExitCode: 128 + int(ws.Signal()), Signal: int(ws.Signal()), OOMKilled: oom,
				Err: fmt.Errorf("the supervisor was killed by %s", unix.SignalName(ws.Signal()))}
		}
		return &drivers.ExitResult{ExitCode: ps.ExitCode(), OOMKilled: oom}
	}
	err := errors.New("supervisor exited without an exit status (killed)")
	if waitErr != nil {
		err = fmt.Errorf("wait for supervisor: %w", waitErr)
	}
	return &drivers.ExitResult{ExitCode: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL), OOMKilled: oom, Err: err}
}

func (h *taskHandle) finish(res *drivers.ExitResult) {
	h.mu.Lock()
	h.exit, h.completedAt = res, time.Now()
	h.mu.Unlock()
	close(h.done)
	h.logger.Info("supervisor exited", "code", res.ExitCode, "signal", res.Signal, "error", res.Err)
}

func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *drivers.ExitResult, 1)
	go func() {
		defer close(ch)
		select {
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		case <-h.done:
		}
		h.mu.Lock()
		res := h.exit.Copy()
		h.mu.Unlock()
		ch <- res
	}()
	return ch, nil
}

// StopTask asks the supervisor to stop the workload with the task's
// kill_signal and kill_timeout and release the lock. If it has not exited by
// kill_timeout + stopReserve it is SIGKILLed; its group guard then kills the
// workload, and the lock expires on the server.
func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.exited() {
		return nil
	}
	sig := syscall.SIGINT // Nomad's default kill_signal
	if signal != "" {
		s, err := shim.ParseSignal(signal)
		if err != nil {
			return fmt.Errorf("stop task: kill_signal: %w", err)
		}
		sig = s
	}
	if err := writeJSON(h.dir, stopFile, stopRequest{Signal: int(sig), Timeout: timeout}); err != nil {
		h.logger.Error("write stop request; killing the supervisor instead", "error", err)
		return h.kill("stop request could not be written")
	}
	if err := h.proc.signal(stopSignal); err != nil {
		return fmt.Errorf("stop task: signal supervisor: %w", err)
	}
	wait := timeout + stopReserve + h.lbRemoveReserve()
	select {
	case <-h.done:
		return nil
	case <-time.After(wait):
		return h.kill(fmt.Sprintf("supervisor still running %s after the stop request", wait))
	}
}

// lbRemoveReserve is what the supervisor may spend on its LB REMOVE before
// it signals the workload: remove_deadline and one state read
// (request_timeout). StopTask waits that much longer.
func (h *taskHandle) lbRemoveReserve() time.Duration {
	var spec supervisorSpec
	if err := readJSON(h.dir, specFile, &spec); err != nil || spec.LB.IsZero() {
		return 0
	}
	parse := func(v string, def time.Duration) time.Duration {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
		return def
	}
	return parse(spec.LB.RemoveDeadline, lbhook.DefaultRemoveDeadline) + parse(spec.LB.RequestTimeout, lbhook.DefaultRequestTimeout)
}

// killTask SIGKILLs the supervisor, through the handle that proves it is
// ours, and everything in the task cgroup. The supervisor's group guard
// kills the workload's process group when the supervisor dies, also where
// there is no cgroup. No PID or group read from a file is ever signalled.
func (h *taskHandle) killTask() {
	if h.proc != nil {
		_ = h.proc.signal(syscall.SIGKILL)
	}
	if h.cgroup != nil {
		go func() {
			if err := h.cgroup.KillAll(killWait); err != nil {
				h.logger.Error("kill the task cgroup", "error", err)
			}
		}()
	}
}

// kill SIGKILLs the task (see killTask) and waits for the supervisor to be
// gone.
func (h *taskHandle) kill(why string) error {
	h.logger.Warn("killing supervisor", "why", why)
	h.killTask()
	select {
	case <-h.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("supervisor pid %d did not exit %s after SIGKILL", h.proc.pid, killWait)
	}
}

func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if !h.exited() {
		if !force {
			return errors.New("cannot destroy a running task without force")
		}
		if err := h.kill("task destroyed"); err != nil {
			return err
		}
	}
	d.tasks.delete(taskID)
	d.gateLeases.keep(h)
	d.mu.RLock()
	root := d.stateRoot
	d.mu.RUnlock()
	if root != nil {
		if err := removeTaskState(root, h.cfg); err != nil {
			h.logger.Warn("remove the task's state dir", "error", err)
		}
	}
	h.dir.Close()
	return nil
}

func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := &drivers.TaskStatus{
		ID: h.cfg.ID, Name: h.cfg.Name, State: drivers.TaskStateRunning, StartedAt: h.startedAt,
		DriverAttributes: map[string]string{
			"lock_state": h.status.State,
			"lock_path":  h.status.Path,
			"fence":      strconv.FormatUint(h.status.Fence, 10),
		},
	}
	if h.exit != nil {
		ts.State, ts.CompletedAt, ts.ExitResult = drivers.TaskStateExited, h.completedAt, h.exit.Copy()
	}
	return ts, nil
}

// SignalTask delivers `nomad alloc signal` to the workload itself.
func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig, err := shim.ParseSignal(signal)
	if err != nil {
		return err
	}
	st := h.lastStatus()
	if h.holding != nil && st.WorkloadPID == 0 && shim.State(st.State).Holds() {
		return fmt.Errorf("task %q is a gate with no command: there is no workload to signal; signal the gated tasks", h.cfg.Name)
	}
	if st.WorkloadPID <= 1 || h.proc == nil || !(shim.State(st.State).Holds() || st.State == string(shim.StateStopping)) {
		return fmt.Errorf("task %q is waiting for lock %s: there is no workload to signal yet", h.cfg.Name, st.Path)
	}
	return signalChild(h.proc.pid, st.WorkloadPID, sig)
}

func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.cgroup == nil {
		return nil, errors.New("task stats: no task cgroup (cgroups are disabled on this client)")
	}
	ch := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(ch)
		var prev cpuSample
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.done:
				return
			case <-timer.C:
			}
			usage, cur, err := h.cgroup.usage(&prev)
			prev = cur
			if err != nil {
				h.logger.Debug("task stats", "error", err)
			} else {
				select {
				case ch <- usage:
				case <-ctx.Done():
					return
				}
			}
			timer.Reset(interval)
		}
	}()
	return ch, nil
}
