package driver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/chans"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
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
	// watchdogLeaseGrace is watchdogGrace for a lease-mode task, measured
	// from its stop deadline in every state (lease_fence +
	// lease_kill_grace after the last heartbeat): a standby may release
	// the lock lockclient.TakeoverMargin (1 s) after it, so the grace, the
	// watchdog's tick and the kill itself (a v1 freezer on a loaded host:
	// a few hundred ms) must all fit inside that second.
	watchdogLeaseGrace = 100 * time.Millisecond
	// watchdogLeaseGateGrace is watchdogGrace for a lease-mode gate, whose
	// kill of its gated tasks must fit in lease_kill_grace.
	watchdogLeaseGateGrace = 300 * time.Millisecond
	// stopReserve is added to kill_timeout for the supervisor to SIGKILL
	// stragglers and release the lock before StopTask kills it.
	stopReserve = 10 * time.Second
	// killWait bounds the wait for a SIGKILLed supervisor to disappear.
	killWait = 5 * time.Second
)

// taskHandle is the plugin's view of one task's supervisor.
type taskHandle struct {
	cfg       *drivers.TaskConfig
	dir       *securefs.Dir
	proc      *supervisorProc
	cgroup    *taskCgroup
	startedAt time.Time
	logger    hclog.Logger

	done chan struct{}
	// gate: the task is a gate (config.gate); lease: its lock is in lease
	// mode (config.lock.mode = "lease").
	gate, lease bool
	// holding, for a task that starts on lock (a gate, or start =
	// "on_lock"), is closed once its supervisor holds the lock (StartTask
	// returns only then); nil for other tasks.
	holding     chan struct{}
	holdingOnce sync.Once

	mu          sync.Mutex
	exit        *drivers.ExitResult
	completedAt time.Time
	status      supervisorStatus
	watchdogHit bool
	// killedByPlugin: the plugin killed the supervisor to stop, destroy or
	// supersede the task (kill), not because it failed. A gate's gated
	// tasks are then Nomad's to stop, and a new start may take its lease
	// over.
	killedByPlugin bool
	// cgroupKilling is set while a kill of the task cgroup runs (killTask).
	cgroupKilling atomic.Bool
}

func (h *taskHandle) exited() bool { return chans.Closed(h.done) }

func (h *taskHandle) lastStatus() supervisorStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status
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
// is SIGSTOPped or starved); a gate's, its gated tasks and the supervisor
// (gateWatchdog). No second holder can then overlap a stuck one.
func (d *Driver) watchdog(h *taskHandle) {
	st := h.lastStatus()
	gate := h.gate
	if st.WorkloadPGID == 0 && !gate && h.cgroup == nil {
		return
	}
	now, grace := bootNow(), int64(watchdogGrace)
	if gate && h.lease {
		// A lease-mode gate's gated tasks must be dead by lease_kill_grace
		// after its fence deadline (at least a gate's least lease_kill_grace): the
		// watchdog leaves the supervisor less time to act.
		grace = int64(watchdogLeaseGateGrace)
	}
	// stopGrace is the grace past the stop deadline. A lease-mode task's
	// workload must be dead by it whatever the supervisor last said (frozen
	// holding, or in a graceful stop), and a standby may release 1 s later.
	stopGrace := grace
	if h.lease && !gate {
		stopGrace = int64(watchdogLeaseGrace)
	}
	stopPassed := st.StopDeadlineBoot > 0 && now > st.StopDeadlineBoot+stopGrace
	var why string
	switch state := shim.State(st.State); {
	case state.Holds() && st.FenceDeadlineBoot > 0 && now > st.FenceDeadlineBoot+grace:
		why = watchdogUnresponsive(time.Duration(now - st.FenceDeadlineBoot).Round(time.Millisecond))
	case (state.Holds() && h.lease && !gate || state == shim.StateLost || state == shim.StateStopping) && stopPassed:
		why = watchdogStillRunning(time.Duration(now - st.StopDeadlineBoot).Round(time.Millisecond))
	}
	if why == "" || (!gate && !h.workloadAlive(st.WorkloadPGID)) {
		return
	}
	h.mu.Lock()
	first := !h.watchdogHit
	h.watchdogHit = true
	h.mu.Unlock()
	if gate {
		// A gate's supervisor guards its gated tasks: stuck, it must not
		// let them outlive the lock.
		if first {
			go d.gateWatchdog(h, why)
		}
		return
	}
	h.logger.Error("watchdog: killing the task", "why", why)
	h.killTask()
	if first {
		d.emitEvent(h.cfg, watchdogMessage(why), map[string]string{"lock_state": string(shim.StateLost)})
	}
}

// workloadAlive reports whether anything of the workload runs: its process
// group, or any process of the task cgroup (a daemon that called setsid is
// in no group of the workload's).
func (h *taskHandle) workloadAlive(pgid int) bool {
	if pgid != 0 && groupAlive(pgid) {
		return true
	}
	alive, err := h.cgroup.Alive()
	return alive || err != nil
}

// exitResult is the task's exit: the supervisor's exit code (the workload's
// own, or a documented lock code) from exit.json, else from the wait status.
// errOOMKilled is the exit message of a task whose memory cgroup OOM-killed a
// workload process (oomKilledMessage).
var errOOMKilled = errors.New(oomKilledMessage())

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
	oom := readSpec(h.dir, &spec) == nil && h.cgroup.oomKilledSince(spec.OOMKillsAtStart)
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

// lbRemoveReserve is what the supervisor may spend on its LB REMOVE before
// it signals the workload: remove_deadline and one state read
// (request_timeout). StopTask waits that much longer.
func (h *taskHandle) lbRemoveReserve() time.Duration {
	var spec supervisorSpec
	switch err := readSpec(h.dir, &spec); {
	case err != nil:
		return 0
	case spec.Run.LB == nil:
		return spec.legacyLBReserve
	}
	lb := spec.Run.LB.WithDefaults()
	return lb.RemoveDeadline + lb.RequestTimeout
}

// killTask SIGKILLs the supervisor, through the handle that proves it is
// ours, and everything in the task cgroup. The supervisor's group guard
// kills the workload's process group when the supervisor dies, also where
// there is no cgroup. No PID or group read from a file is ever signalled.
func (h *taskHandle) killTask() {
	if h.proc != nil {
		_ = h.proc.signal(syscall.SIGKILL)
	}
	// One cgroup kill at a time: the watchdog asks for one every tick
	// while the workload lives, and each may take killWait (a process
	// stuck in the kernel keeps a v1 freezer cgroup from freezing).
	if h.cgroup != nil && h.cgroupKilling.CompareAndSwap(false, true) {
		go func() {
			defer h.cgroupKilling.Store(false)
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
	h.mu.Lock()
	h.killedByPlugin = true
	h.mu.Unlock()
	h.killTask()
	select {
	case <-h.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("supervisor pid %d did not exit %s after SIGKILL", h.proc.pid, killWait)
	}
}

// taskStore maps task IDs to handles.
type taskStore struct {
	mu    sync.RWMutex
	store map[string]*taskHandle
}

func newTaskStore() *taskStore { return &taskStore{store: map[string]*taskHandle{}} }

func (s *taskStore) set(id string, h *taskHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store[id] = h
}

func (s *taskStore) get(id string) (*taskHandle, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.store[id]
	return h, ok
}

// all returns every handle.
func (s *taskStore) all() []*taskHandle {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*taskHandle, 0, len(s.store))
	for _, h := range s.store {
		out = append(out, h)
	}
	return out
}

func (s *taskStore) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.store, id)
}
