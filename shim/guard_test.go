package shim

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// TestMain lets the test binary act as the process-group guard, as the
// lock and plugin mains do.
func TestMain(m *testing.M) {
	MaybeRunGuard(os.Args, openPIDTree)
	os.Exit(m.Run())
}

// pidTree is a test's stand-in for the driver's task cgroup as the guard's
// tree: the one process it names.
type pidTree struct{ pid int }

func (p pidTree) GuardArgs() []string             { return []string{strconv.Itoa(p.pid)} }
func (p pidTree) Signal(sig syscall.Signal) error { return syscall.Kill(p.pid, sig) }
func (p pidTree) Alive() (bool, error)            { return !waitDead(p.pid, 0), nil }
func (p pidTree) KillAll(timeout time.Duration) error {
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	if !waitDead(p.pid, timeout) {
		return fmt.Errorf("pid %d alive after SIGKILL", p.pid)
	}
	return nil
}

func openPIDTree(args []string) (Tree, error) {
	pid, err := strconv.Atoi(args[0])
	return pidTree{pid}, err
}

// startGuarded starts `sleep 60` in a fresh guard's process group; tree,
// if not nil, is the guard's tree.
func startGuarded(t *testing.T, tree ...Tree) (*group, *exec.Cmd) {
	t.Helper()
	var tr Tree
	if len(tree) > 0 {
		tr = tree[0]
	}
	g, err := startGuard(newSpawner(), tr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.pgid}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		<-done
	})
	return g, cmd
}

// waitDead reports whether pid is gone or a zombie, checking at least once
// and until timeout.
func waitDead(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if stat, err := procfs.Read(pid); err != nil || stat.Gone() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGuardFence: once armed, the guard SIGKILLs the group when the
// deadline passes without a newer one, even though the supervisor (here the
// test) never signals anything: this is what stops a frozen supervisor's
// workload before the server can hand the lock to a standby.
func TestGuardFence(t *testing.T) {
	g, cmd := startGuarded(t)
	armed := time.Now()
	g.arm(lockclient.BootNow().Add(400 * time.Millisecond))
	if !waitDead(cmd.Process.Pid, 10*time.Second) {
		t.Fatalf("workload %d alive 10s after the guard's deadline", cmd.Process.Pid)
	}
	if d := time.Since(armed); d < 350*time.Millisecond {
		t.Errorf("killed after %s, before the 400ms deadline", d)
	}
}

// TestGuardFenceRearm: a newer deadline replaces the old one, and an
// unarmed guard never fires.
func TestGuardFenceRearm(t *testing.T) {
	g, cmd := startGuarded(t)
	g.arm(lockclient.BootNow().Add(300 * time.Millisecond))
	g.arm(lockclient.BootNow().Add(time.Hour))
	time.Sleep(1200 * time.Millisecond)
	if waitDead(cmd.Process.Pid, 0) {
		t.Fatalf("re-armed guard killed the workload at the old deadline")
	}
	_, cmd2 := startGuarded(t)
	time.Sleep(500 * time.Millisecond)
	if waitDead(cmd2.Process.Pid, 0) {
		t.Fatalf("unarmed guard killed the workload")
	}
}

// The guard's deadline is a point in time, not a duration from whenever it
// reads it: a guard that reads its arming late (here: stopped meanwhile,
// as under a loaded or paused host) fires at once if the deadline has
// passed, instead of that duration later.
func TestGuardDeadlineIsAbsolute(t *testing.T) {
	g, cmd := startGuarded(t)
	const ahead, stopped = 4 * time.Second, 5 * time.Second
	if err := syscall.Kill(g.pgid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	g.arm(lockclient.BootNow().Add(ahead))
	time.Sleep(stopped)
	if !waitDead(cmd.Process.Pid, 0) {
		resumed := time.Now()
		_ = syscall.Kill(g.pgid, syscall.SIGCONT)
		// Past its deadline when it resumes: the guard kills at once, not
		// `ahead` after it read the arming.
		if !waitDead(cmd.Process.Pid, ahead-time.Second) {
			t.Fatalf("workload alive %s after the guard resumed %s past its deadline", ahead-time.Second, stopped-ahead)
		}
		t.Logf("killed %s after the guard resumed", time.Since(resumed).Round(time.Millisecond))
	}
}

// When it fires, the guard also kills the workload's tree it was given (the
// driver's task cgroup): a daemon that left the process group (setsid)
// dies with it, while the supervisor that should have killed it is stuck.
func TestGuardKillsTheTree(t *testing.T) {
	daemon := exec.Command("sleep", "60")
	daemon.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = daemon.Wait() }()
	t.Cleanup(func() { _ = daemon.Process.Kill() })
	g, cmd := startGuarded(t, pidTree{daemon.Process.Pid})
	g.arm(lockclient.BootNow().Add(300 * time.Millisecond))
	if !waitDead(cmd.Process.Pid, 10*time.Second) {
		t.Fatalf("workload %d alive 10s after the guard's deadline", cmd.Process.Pid)
	}
	if !waitDead(daemon.Process.Pid, 10*time.Second) {
		t.Fatalf("daemon %d (out of the process group, in the guard's tree) alive 10s after the guard's deadline", daemon.Process.Pid)
	}
}

// A supervisor of an earlier build (main at aa8bd1d) runs on across an
// upgrade of the binary, and starts its guard from the new one
// (os.Executable): its arming, a duration from when the guard reads it,
// is read as such, not as a deadline long past that kills the workload
// at once.
func TestGuardReadsTheEarlierProtocol(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// As that build started it: no tree, no boot clock line.
	guard := exec.Command(self, GuardCommand, strconv.Itoa(os.Getpid()))
	guard.Env, guard.Dir = []string{}, "/"
	guard.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: guardSignal}
	out, err := guard.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := guard.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = guard.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("guard said %q, %v", line, err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: guard.Process.Pid}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-guard.Process.Pid, syscall.SIGKILL) })

	fmt.Fprintf(in, "%d\n", time.Minute.Nanoseconds())
	if waitDead(cmd.Process.Pid, 1500*time.Millisecond) {
		t.Fatal("the guard killed the workload at once on an arming of one minute from now")
	}
	armed := time.Now()
	fmt.Fprintf(in, "%d\n", (300 * time.Millisecond).Nanoseconds())
	if !waitDead(cmd.Process.Pid, 10*time.Second) {
		t.Fatalf("workload %d alive 10s after an arming of 300ms", cmd.Process.Pid)
	}
	if d := time.Since(armed); d < 250*time.Millisecond {
		t.Errorf("killed after %s, before the 300ms deadline", d)
	}
}
