package shim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// GuardCommand is the hidden argv[1] that turns our own binary into the
// process-group guard. Mains must call MaybeRunGuard before anything else.
const GuardCommand = "__singleton-group-guard"

// guardSignal is the parent-death signal of the guard. A real-time signal no
// one sends by accident, so forwarded signals never trip it.
const guardSignal = syscall.Signal(50)

// spawner forks every child from one OS thread that lives as long as the
// supervisor. PDEATHSIG fires when the forking *thread* exits, so forking from
// an arbitrary goroutine could kill the workload when Go retires that thread.
type spawner struct{ reqs chan spawnReq }

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread must not be reused or retired
		for r := range s.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	s.reqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// group is the workload's process group. Its leader is the guard when one
// could be started, so the group ID is never recycled while we use it.
type group struct {
	pgid  int
	guard *exec.Cmd // nil if the guard could not start
	// fence feeds the guard its kill deadline (see arm); nil without a guard.
	fence io.WriteCloser
}

// arm tells the guard to SIGKILL the whole group once d has passed without a
// newer deadline: the fence still holds when the supervisor itself is frozen
// (SIGSTOP, a stuck kernel call, a paused VM thread) and cannot stop the
// workload on its own. The supervisor re-arms after every renew (see
// Supervisor.guardDeadline: fence deadline + kill timeout + 1s, capped by
// the lease's stop deadline, which is before the server can expire the
// lock), so a standby never starts while a frozen holder's workload runs.
// Best effort: an error only means the guard is gone.
func (g *group) arm(d time.Time) {
	if g == nil || g.fence == nil {
		return
	}
	_, _ = fmt.Fprintf(g.fence, "%d\n", lockclient.BootUntil(d).Nanoseconds())
}

// startGuard starts our own binary as the guard: the leader of a fresh
// process group that ignores every signal but its parent-death signal, on
// which it SIGKILLs the whole group. So if the supervisor is SIGKILLed, the
// workload and all its descendants still in the group die with it.
func startGuard(sp *spawner) (*group, error) {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	cmd := exec.Command(self, GuardCommand, strconv.Itoa(os.Getpid()))
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: guardSignal}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	fence, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := sp.start(cmd); err != nil {
		return nil, fmt.Errorf("start process-group guard %s: %w", self, err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-time.After(5 * time.Second):
		err = errors.New("no ready signal within 5s")
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("process-group guard: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reap it whenever it dies
	return &group{pgid: cmd.Process.Pid, guard: cmd, fence: fence}, nil
}

// MaybeRunGuard runs the guard and exits if args ask for it.
func MaybeRunGuard(args []string) {
	if len(args) < 3 || args[1] != GuardCommand {
		return
	}
	parent, _ := strconv.Atoi(args[2])
	os.Exit(runGuard(parent))
}

func runGuard(parent int) int {
	for sig := syscall.Signal(1); sig < 65; sig++ {
		if sig != guardSignal && sig != syscall.SIGKILL && sig != syscall.SIGSTOP && sig != syscall.SIGCHLD && sig != syscall.SIGURG {
			signal.Ignore(sig)
		}
	}
	died := make(chan os.Signal, 1)
	signal.Notify(died, guardSignal)
	if os.Getppid() != parent {
		_ = syscall.Kill(0, syscall.SIGKILL)
		return 1
	}
	fmt.Fprintln(os.Stdout, "ready")
	_ = os.Stdout.Close()
	// Each stdin line arms the fence: the group must be gone within that
	// many nanoseconds unless a newer line arrives. EOF keeps the last one.
	arms := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if n, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 64); err == nil {
				arms <- time.Duration(n)
			}
		}
	}()
	// The fence is measured on CLOCK_BOOTTIME, as the server's expiry is
	// in effect: a suspend of the host shortens it, never extends it.
	var fence <-chan time.Time
	var timer *lockclient.BootTimer
	for {
		select {
		case <-died:
			_ = syscall.Kill(0, syscall.SIGKILL) // pid 0: our own process group, ourselves included
			return 1
		case d := <-arms:
			if timer != nil {
				timer.Stop()
			}
			timer = lockclient.NewBootTimer(max(d, 0))
			fence = timer.C()
		case <-fence:
			fmt.Fprintln(os.Stderr, "lock: process-group guard: the supervisor missed its stop deadline; killing the workload")
			_ = syscall.Kill(0, syscall.SIGKILL)
			return 1
		}
	}
}

// signal sends sig to every workload process in the group. The guard
// ignores it.
func (g *group) signal(sig syscall.Signal) error {
	err := syscall.Kill(-g.pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// members lists live processes in the group other than the guard.
func (g *group) members() ([]int, error) {
	return groupMembers(g.pgid, g.pgid)
}

// GroupMembers lists the live (non-zombie) processes in process group pgid.
func GroupMembers(pgid int) ([]int, error) { return groupMembers(pgid, -1) }

// groupMembers scans /proc for live (non-zombie) processes whose process
// group is pgid, leaving out except.
func groupMembers(pgid, except int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == except {
			continue
		}
		stat, err := procfs.Read(pid)
		if err != nil {
			continue // exited meanwhile
		}
		if stat.PGRP == pgid && (!stat.Gone() || threadsLeft(pid)) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// threadsLeft reports whether a zombie thread-group leader still has live
// threads: its main thread exited (pthread_exit), the process did not.
func threadsLeft(pid int) bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	return err == nil && len(tasks) > 1
}

// killAll SIGKILLs the whole group, guard included, and waits until no
// member is left, up to timeout. It reports whether the group is confirmed empty.
func (g *group) killAll(timeout time.Duration) (bool, error) {
	if err := g.signal(syscall.SIGKILL); err != nil {
		return false, fmt.Errorf("kill process group %d: %w", g.pgid, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		left, err := groupMembers(g.pgid, -1)
		if err != nil {
			return false, err
		}
		if len(left) == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("process group %d: %d process(es) still alive %s after SIGKILL: %v", g.pgid, len(left), timeout, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
