package shim

import (
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

// A supervisor of an older build (before the absolute deadline) arms its
// guard with a duration; after an upgrade that guard is started from the
// new binary (os.Executable names the replaced file), so the guard still
// reads a bare number as a duration from now. Read as a boot time, it lies
// in the past, and the guard killed the old supervisor's workload at once
// (seen in TestPluginUpgradeKeepsHolders: the old-build standby's workload
// died as it started).
func TestGuardTakesAnOlderSupervisorsDuration(t *testing.T) {
	g, cmd := startGuarded(t)
	armed := time.Now()
	const d = 2 * time.Second
	if _, err := fmt.Fprintf(g.fence, "%d\n", d.Nanoseconds()); err != nil {
		t.Fatal(err)
	}
	if !waitDead(cmd.Process.Pid, 10*time.Second) {
		t.Fatalf("workload %d alive 10s after the older supervisor's %s deadline", cmd.Process.Pid, d)
	}
	if took := time.Since(armed); took < d/2 {
		t.Fatalf("killed %s after an arming for %s: the duration was read as a boot time", took.Round(time.Millisecond), d)
	}
}

func TestParseArm(t *testing.T) {
	now := lockclient.BootNow()
	for _, tc := range []struct {
		line string
		want time.Time
		ok   bool
	}{
		{"at 1234", lockclient.BootTime(1234), true},
		{"at 1234\n", lockclient.BootTime(1234), true},
		{"5000000000", now.Add(5 * time.Second), true},
		{"at x", time.Time{}, false},
		{"", time.Time{}, false},
	} {
		got, ok := parseArm(tc.line, now)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("parseArm(%q) = %v, %v; want %v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
