package shim

import (
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
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Process is where and as whom a command runs, and what sees its
// processes: what a front end decides about the process workload beside
// the Spec.
type Process struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Env is the workload's base environment; nil means os.Environ().
	Env []string
	// Dir is the workload's working directory; "" keeps ours.
	Dir string
	// Credential runs the workload as another user; nil keeps ours.
	Credential *syscall.Credential
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

// confirmTimeout bounds the wait for SIGKILLed processes to disappear.
const confirmTimeout = 5 * time.Second

// errLostBeforeStart: the lease was lost before the workload could start.
var errLostBeforeStart = errors.New("the lease was lost before the workload could start")

// processWorkload is a command the supervisor runs: in a fresh process
// group led by its guard, with PDEATHSIG, and, where it has one, a view of
// its whole tree (Process.Tree, or the subreaper's).
type processWorkload struct {
	argv  []string
	shell bool
	p     Process
	log   hclog.Logger

	// spawner is made once: its thread forks every start's processes, and
	// must outlive them (PDEATHSIG).
	spawner *spawner
	// tree is this start's view of the whole tree: Process.Tree, or the
	// subreaper's view of this start's command.
	tree   Tree
	g      *group
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
}

func newProcessWorkload(cfg Config, p Process, log hclog.Logger) *processWorkload {
	return &processWorkload{argv: cfg.Command, shell: cfg.Shell, p: p, log: log}
}

// Start starts the workload under the lease: its process-group guard
// (which the driver requires), the workload in the guard's group, the
// subreaper's view of its tree, the guard armed by the caller.
func (w *processWorkload) Start(lease *lockclient.Lease) (Started, error) {
	log := w.log.With("fence", lease.Fence)
	if chans.Closed(lease.Lost()) {
		// Lost already (lease mode's first heartbeat, the hooks' work can
		// outlast the fence): the workload would only be killed again
		// within the stop deadline.
		log.Error("the lease was lost before the workload could start; not starting it", "why", lease.Err())
		return Started{}, errLostBeforeStart
	}
	if w.p.Subreaper {
		if err := becomeSubreaper(); err != nil {
			log.Warn("cannot become a child subreaper: processes that leave the workload's process group are not tracked", "error", err)
			w.p.Subreaper = false
		}
	}
	if w.spawner == nil {
		w.spawner = newSpawner()
	}
	w.tree = w.p.Tree
	g, err := startGuard(w.spawner, w.tree)
	if err != nil && w.p.RequireGuard {
		log.Error("cannot start the process-group guard; not starting the workload", "error", err)
		return Started{}, &Failure{Code: ExitInfra, End: EndStartFailed, Err: err}
	}
	if err != nil {
		log.Warn("running without a process-group guard: descendants that outlive a killed supervisor are not cleaned up", "error", err)
	}
	w.g = g
	cmd, err := w.start(lease)
	if err != nil {
		log.Error("cannot start the workload", "error", err)
		return Started{}, &Failure{Code: startErrorCode(err), End: EndStartFailed, Err: err}
	}
	if w.g == nil {
		w.g = &group{pgid: cmd.Process.Pid}
	}
	log.Info("workload started", "pid", cmd.Process.Pid, "pgid", w.g.pgid)
	if w.p.Subreaper && w.tree == nil {
		guard := 0
		if w.g.guard != nil {
			guard = w.g.guard.Process.Pid
		}
		w.tree = guardedTree{newSubreaperTree(cmd.Process.Pid, guard), guard}
	}
	w.cmd, w.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(w.exited) }()
	return Started{PID: cmd.Process.Pid, PGID: w.g.pgid}, nil
}

// start execs the command with no shell (unless Shell), in the guard's
// process group, with PDEATHSIG, NOMAD_LOCK_PATH and NOMAD_LOCK_FENCE (and
// NOMAD_LOCK_SLOT for a semaphore's slot).
func (w *processWorkload) start(lease *lockclient.Lease) (*exec.Cmd, error) {
	argv := w.argv
	if w.shell {
		sh := os.Getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		argv = []string{sh, "-c", strings.Join(argv, " ")}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("command %q: %w", argv[0], err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: w.env(lease), Dir: w.p.Dir,
		Stdin: w.p.Stdin, Stdout: w.p.Stdout, Stderr: w.p.Stderr,
		WaitDelay: time.Second} // don't hang on pipes held by processes that left the group
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: w.p.Credential}
	if w.g != nil {
		attr.Pgid = w.g.pgid
	}
	cmd.SysProcAttr = attr
	start := func() error { return w.spawner.start(cmd) }
	if w.p.StartIn != nil {
		err = w.p.StartIn(start)
	} else {
		err = start()
	}
	if err != nil {
		return nil, fmt.Errorf("start %q: %w", path, err)
	}
	return cmd, nil
}

func (w *processWorkload) env(lease *lockclient.Lease) []string {
	base := w.p.Env
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

func (w *processWorkload) Exited() <-chan struct{} { return w.exited }

func (w *processWorkload) ExitCode() int {
	if w.cmd == nil {
		return ExitInfra
	}
	return exitCode(w.cmd.ProcessState)
}

func (w *processWorkload) Forward(sig os.Signal) {
	w.log.Debug("forwarding signal", "signal", sig, "pid", w.cmd.Process.Pid)
	if err := w.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		w.log.Warn("forward signal", "signal", sig, "error", err)
	}
}

// Stop sends sig to the group and the tree. A workload that already exited
// with no stragglers left is not signalled at all.
func (w *processWorkload) Stop(sig syscall.Signal, _ Ending) (string, bool) {
	if chans.Closed(w.exited) {
		if w.Gone() {
			return "", false
		}
		w.log.Info("workload exited but left processes behind, stopping them", "signal", sig)
	}
	if err := w.g.signal(sig); err != nil {
		w.log.Warn("signal workload group", "signal", sig, "error", err)
	}
	if w.tree != nil {
		if err := w.tree.Signal(sig); err != nil {
			w.log.Warn("signal the workload's process tree", "signal", sig, "error", err)
		}
	}
	return stoppingMessage(signalName(sig)), true
}

// Gone reports whether the workload exited and no process of it is left:
// none in its group, and none in its tree (when there is a view of it).
func (w *processWorkload) Gone() bool {
	if !chans.Closed(w.exited) {
		return false
	}
	if left, err := w.g.members(); err != nil || len(left) > 0 {
		return false
	}
	if w.tree == nil {
		return true
	}
	alive, err := w.tree.Alive()
	return err == nil && !alive
}

func (w *processWorkload) Arm(deadline time.Time) { w.g.arm(deadline) }

// KillBound is 0: a process's grace is cut to the lease's stop deadline.
func (w *processWorkload) KillBound() time.Duration { return 0 }

// KillAll SIGKILLs whatever is left of the workload (its group, its tree)
// and reports whether every process of it is proven dead.
func (w *processWorkload) KillAll() bool {
	if w.g != nil {
		if ok, err := w.g.killAll(confirmTimeout); !ok {
			w.log.Error("not releasing the lock: the workload's processes could not be confirmed dead; it expires on its own", "error", err)
			return false
		}
	}
	if w.tree != nil {
		if err := w.tree.KillAll(confirmTimeout); err != nil {
			w.log.Error("not releasing the lock: the workload's process tree could not be proven dead; it expires on its own", "error", err)
			return false
		}
	}
	if w.exited != nil {
		<-w.exited
	}
	return true
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
