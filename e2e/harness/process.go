package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// Process is a program the test started itself, outside Nomad: for example
// bin/lock run against the agent's NOMAD_ADDR. Create it with StartProcess.
type Process struct {
	t              testing.TB
	cmd            *exec.Cmd
	stdout, stderr *proctest.SyncBuffer
	started        time.Time
	done           chan struct{}
	ended          time.Time // when Wait returned; read only after done is closed
	err            error     // from cmd.Wait; read only after done is closed
}

// StartProcess starts cmd in a process group of its own, with Pdeathsig
// SIGKILL (forked from the harness's pinned thread, so the signal fires only
// when the test binary dies), and captures its stdout and stderr unless cmd
// already sets them. cmd.Env is used as given: pass os.Environ() and
// Agent.Env() explicitly if you want them. t.Cleanup SIGKILLs the process
// group, by the process's PID, if the process still runs, and reaps it.
func StartProcess(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{t: t, cmd: cmd, stdout: &proctest.SyncBuffer{}, stderr: &proctest.SyncBuffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = p.stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = p.stderr
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	// Output pipes held open by descendants must not block Wait forever.
	cmd.WaitDelay = 5 * time.Second
	p.started = time.Now()
	if err := proctest.StartPinned(cmd); err != nil {
		t.Fatalf("harness: start %s: %v", strings.Join(cmd.Args, " "), err)
	}
	go func() {
		p.err = cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.Exited() {
			return
		}
		pid := cmd.Process.Pid
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("harness: kill process group %d: %v", pid, err)
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("harness: process %d (%s) not reaped 10s after SIGKILL", pid, cmd.Path)
		}
	})
	return p
}

// PID of the process.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// code: its own code, or 128+N if signal N killed it, as a shell reports it.
// The test fails if it is still running after timeout.
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("harness: %s (pid %d) still running after %s\nstderr:\n%s", p.cmd.Path, p.PID(), timeout, p.Stderr())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	p.t.Fatalf("harness: wait for %s: %v", p.cmd.Path, p.err)
	return -1
}

// Runtime is how long the process ran (from StartProcess until it was
// reaped), or so far if it still runs.
func (p *Process) Runtime() time.Duration {
	if p.Exited() {
		return p.ended.Sub(p.started)
	}
	return time.Since(p.started)
}

// Stdout is what the process wrote to stdout so far (if captured).
func (p *Process) Stdout() string { return p.stdout.String() }

// Stderr is what the process wrote to stderr so far (if captured).
func (p *Process) Stderr() string { return p.stderr.String() }

// WaitOutput polls the captured stdout and stderr until either contains s,
// and fails the test after timeout.
func (p *Process) WaitOutput(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Stdout(), s) && !strings.Contains(p.Stderr(), s) {
		if time.Now().After(deadline) {
			p.t.Fatalf("harness: %s (pid %d) did not print %q within %s\nstdout:\n%s\nstderr:\n%s",
				p.cmd.Path, p.PID(), s, timeout, p.Stdout(), p.Stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ReadEnviron returns the initial environment of a live process as KEY=VALUE
// entries, from /proc/<pid>/environ.
func ReadEnviron(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

// ReadCmdline returns the argv of a live process, from /proc/<pid>/cmdline:
// what every user on the host can read.
func ReadCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

// Getenv looks key up in KEY=VALUE entries such as ReadEnviron returns.
func Getenv(env []string, key string) string {
	i := slices.IndexFunc(env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
	if i < 0 {
		return ""
	}
	return env[i][len(key)+1:]
}

// WithoutNomadEnv returns env without NOMAD_* entries, so that a process the
// test starts talks only to the cluster it is pointed at (see Agent.Env).
func WithoutNomadEnv(env []string) []string { return filterEnv(env, "NOMAD_") }
