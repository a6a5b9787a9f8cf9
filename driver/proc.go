package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// supervisorProc is a handle on a task's supervisor process: the child we
// started, or, after a plugin restart, a process found again by PID and
// start time and held through a pidfd so a recycled PID can never be hit.
type supervisorProc struct {
	pid   int
	cmd   *exec.Cmd // set when this plugin started it (and so must reap it)
	pidfd int       // set for a recovered process; -1 otherwise
}

// startTicks is field 22 of /proc/<pid>/stat: when the process started, in
// clock ticks since boot. With the PID it identifies a process for good.
func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := bytes.Fields(b[i+1:])
	// After the comm field: state is field 3, starttime field 22.
	const starttime = 22 - 3
	if len(fields) <= starttime {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(string(fields[starttime]), 10, 64)
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
func groupAlive(pgid int) bool {
	return pgid > 0 && syscall.Kill(-pgid, 0) == nil
}
