package driver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"golang.org/x/sys/unix"
)

// supervisorProc is a handle on a task's supervisor process: the child we
// started, or, after a plugin restart, a process found again by PID and
// start time and held through a pidfd so a recycled PID can never be hit.
type supervisorProc struct {
	pid   int
	cmd   *exec.Cmd // set when this plugin started it (and so must reap it)
	pidfd int       // set for a recovered process; -1 otherwise
	// ticks is the start time of a recovered process without a pidfd: it
	// is then checked before every signal and polled for its end.
	ticks uint64
}

// same reports whether the recovered process without a pidfd still lives.
func (p *supervisorProc) same() bool {
	t, err := startTicks(p.pid)
	return err == nil && t == p.ticks
}

// startTicks is when the process started, in clock ticks since boot. With
// the PID it identifies a process for good.
func startTicks(pid int) (uint64, error) {
	s, err := procfs.Read(pid)
	return s.StartTime, err
}

// errSupervisorGone means the recorded supervisor no longer exists.
var errSupervisorGone = errors.New("supervisor process is gone")

// findSupervisor reopens a supervisor after a plugin restart. It checks the
// start time before and after opening the pidfd, so the fd refers to our
// process and not to a newer one that reused the PID.
func findSupervisor(pid int, ticks uint64) (*supervisorProc, error) {
	if t, err := startTicks(pid); err != nil || t != ticks {
		return nil, errSupervisorGone
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, errSupervisorGone
		}
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	if t, err := startTicks(pid); err != nil || t != ticks {
		unix.Close(fd)
		return nil, errSupervisorGone
	}
	return &supervisorProc{pid: pid, pidfd: fd}, nil
}

func (p *supervisorProc) signal(sig syscall.Signal) error {
	if p.cmd != nil {
		err := p.cmd.Process.Signal(sig)
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	if p.pidfd < 0 {
		if !p.same() {
			return nil
		}
		return syscall.Kill(p.pid, sig)
	}
	err := unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// wait blocks until the supervisor exits. For our own child it returns the
// wait status; for a recovered one only that it is gone (the exit code then
// comes from exit.json).
func (p *supervisorProc) wait() (state *os.ProcessState, err error) {
	if p.cmd != nil {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = nil
		}
		return p.cmd.ProcessState, err
	}
	if p.pidfd < 0 {
		for p.same() {
			time.Sleep(100 * time.Millisecond)
		}
		return nil, nil
	}
	defer unix.Close(p.pidfd)
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("poll pidfd of %d: %w", p.pid, err)
		}
		return nil, nil
	}
}

// groupAlive reports whether any process is left in process group pgid.
// It only probes (signal 0); pgid 1 and below never name a task's group.
func groupAlive(pgid int) bool {
	return pgid > 1 && syscall.Kill(-pgid, 0) == nil
}

// signalChild delivers sig to pid only if it is a child of parent: it opens
// a pidfd first, then checks the parent, then signals through the pidfd, so
// a PID that was reused in between is never hit (the pidfd then refers to a
// process that is gone, and the signal fails).
func signalChild(parent, pid int, sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("workload pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if ppid, err := parentPID(pid); err != nil || ppid != parent {
		return fmt.Errorf("workload pid %d is no longer the supervisor's child: not signalling it", pid)
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// parentPID is the parent of pid.
func parentPID(pid int) (int, error) {
	s, err := procfs.Read(pid)
	return s.PPID, err
}

// startSupervisor writes the spec into the task's (emptied) state dir and
// launches the supervisor on it.
func (d *Driver) startSupervisor(cfg *drivers.TaskConfig, root *securefs.Dir, spec supervisorSpec) (*securefs.Dir, *supervisorProc, error) {
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
	return dir, proc, nil
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

// logFIFOTimeout bounds the wait for logmon to open a task log FIFO.
var logFIFOTimeout = 30 * time.Second

// openLogFIFO opens the write end of a logmon FIFO (or /dev/null). A FIFO
// opens for writing only once a reader has it open: it is opened without
// blocking, again every logFIFOPoll until logmon has, so that nothing is
// left blocked in open() when the wait gives up.
//
// The log dir is in the shared alloc dir, which the task user can write:
// never follow a symlink there, and write only to a FIFO (or /dev/null),
// never to a file that root would then fill.
func openLogFIFO(path string) (*os.File, error) {
	deadline := time.Now().Add(logFIFOTimeout)
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		switch {
		case err == nil:
			return logFile(fd, path)
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.ENXIO): // ENXIO: a FIFO with no reader yet
			return nil, fmt.Errorf("open task log %s: %w", path, err)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("open task log %s: no reader after %s (is logmon running?)", path, logFIFOTimeout)
		}
		time.Sleep(logFIFOPoll)
	}
}

// logFIFOPoll is the time between two tries to open a task log FIFO.
const logFIFOPoll = 20 * time.Millisecond

// logFile checks that fd, opened at path, is a FIFO (or /dev/null) and
// returns it as a blocking file, as the supervisor's stdout and stderr.
func logFile(fd int, path string) (*os.File, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	kind := st.Mode & unix.S_IFMT
	if err != nil || !(kind == unix.S_IFIFO || path == os.DevNull && kind == unix.S_IFCHR) {
		unix.Close(fd)
		return nil, fmt.Errorf("open task log %s: not a FIFO: refusing to write the task's log into it", path)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open task log %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}
