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

// arm tells the guard to SIGKILL the whole group (and the workload's tree,
// where the guard can reach it: GuardTree) once d has passed without a
// newer deadline: the fence still holds when the supervisor itself is
// frozen (SIGSTOP, a stuck kernel call, a paused VM thread) and cannot stop
// the workload on its own. The supervisor re-arms after every renew (see
// Supervisor.guardDeadline: fence deadline + kill timeout + 1s, capped by
// the lease's stop deadline, which is before the server can expire the
// lock), so a standby never starts while a frozen holder's workload runs.
// d is sent as a CLOCK_BOOTTIME reading, not a duration: a supervisor
// delayed between computing d and the write, or a guard slow to read it,
// moves nothing later. Best effort: an error only means the guard is gone.
func (g *group) arm(d time.Time) {
	if g == nil || g.fence == nil {
		return
	}
	_, _ = fmt.Fprintf(g.fence, "%s%d\n", guardAt, lockclient.BootNanos(d))
}

// guardAt marks an arm line as a CLOCK_BOOTTIME reading. A line without it
// is a duration from now: what the supervisors of builds before the
// absolute deadline send, which still run after an upgrade replaced the
// binary under them and start their guards from the new one
// (os.Executable names the replaced file's path).
const guardAt = "at "

// parseArm reads one arm line of the guard's stdin as the boot time it
// arms the fence for, read at now for an older supervisor's duration.
func parseArm(line string, now time.Time) (time.Time, bool) {
	line = strings.TrimSpace(line)
	abs := strings.HasPrefix(line, guardAt)
	n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, guardAt)), 10, 64)
	switch {
	case err != nil:
		return time.Time{}, false
	case abs:
		return lockclient.BootTime(n), true
	}
	return now.Add(time.Duration(n)), true
}

// GuardTree is a Tree that the guard, a process of its own, can open
// again from GuardArgs (with the TreeOpener its main passes to
// MaybeRunGuard) and kill when it fires: the driver's task cgroup, which
// also holds the daemons that left the workload's process group.
type GuardTree interface {
	Tree
	GuardArgs() []string
}

// TreeOpener opens, in the guard, the Tree whose GuardArgs it was given.
type TreeOpener func(args []string) (Tree, error)

// guardTreeKillTimeout bounds the guard's kill of the workload's tree
// before it kills its process group (and itself).
const guardTreeKillTimeout = 2 * time.Second

// startGuard starts our own binary as the guard: the leader of a fresh
// process group that ignores every signal but its parent-death signal, on
// which it SIGKILLs the whole group. So if the supervisor is SIGKILLed, the
// workload and all its descendants still in the group die with it, and
// with tree (a GuardTree), every process of the workload's tree too.
func startGuard(sp *spawner, tree Tree) (*group, error) {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	args := []string{GuardCommand, strconv.Itoa(os.Getpid())}
	if gt, ok := tree.(GuardTree); ok {
		args = append(args, gt.GuardArgs()...)
	}
	cmd := exec.Command(self, args...)
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

// MaybeRunGuard runs the guard and exits if args ask for it. open opens
// the workload's tree the supervisor named (nil: the process group only).
func MaybeRunGuard(args []string, open TreeOpener) {
	if len(args) < 3 || args[1] != GuardCommand {
		return
	}
	parent, _ := strconv.Atoi(args[2])
	var tree Tree
	if len(args) > 3 && open != nil {
		var err error
		if tree, err = open(args[3:]); err != nil {
			fmt.Fprintf(os.Stderr, "lock: process-group guard: %v; guarding the process group only\n", err)
		}
	}
	os.Exit(runGuard(parent, tree))
}

func runGuard(parent int, tree Tree) int {
	for sig := syscall.Signal(1); sig < 65; sig++ {
		if sig != guardSignal && sig != syscall.SIGKILL && sig != syscall.SIGSTOP && sig != syscall.SIGCHLD && sig != syscall.SIGURG {
			signal.Ignore(sig)
		}
	}
	died := make(chan os.Signal, 1)
	signal.Notify(died, guardSignal)
	// killAll kills the workload's tree (where the guard was given it),
	// then the process group, the guard itself included.
	killAll := func() int {
		if tree != nil {
			if err := tree.KillAll(guardTreeKillTimeout); err != nil {
				fmt.Fprintf(os.Stderr, "lock: process-group guard: %v\n", err)
			}
		}
		_ = syscall.Kill(0, syscall.SIGKILL) // pid 0: our own process group, ourselves included
		return 1
	}
	if os.Getppid() != parent {
		return killAll()
	}
	fmt.Fprintln(os.Stdout, "ready")
	_ = os.Stdout.Close()
	// Each stdin line arms the fence: a CLOCK_BOOTTIME reading in
	// nanoseconds by which the group must be gone unless a newer line
	// arrives (parseArm). EOF keeps the last one.
	arms := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if at, ok := parseArm(sc.Text(), lockclient.BootNow()); ok {
				arms <- at
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
			return killAll()
		case at := <-arms:
			if timer != nil {
				timer.Stop()
			}
			timer = lockclient.NewBootTimer(max(lockclient.BootUntil(at), 0))
			fence = timer.C()
		case <-fence:
			fmt.Fprintln(os.Stderr, "lock: process-group guard: the supervisor missed its stop deadline; killing the workload")
			return killAll()
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
