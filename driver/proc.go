package driver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
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
