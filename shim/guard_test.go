package shim

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
)

// TestMain lets the test binary act as the process-group guard, as the
// lock and plugin mains do.
func TestMain(m *testing.M) {
	MaybeRunGuard(os.Args)
	os.Exit(m.Run())
}

// startGuarded starts `sleep 60` in a fresh guard's process group.
func startGuarded(t *testing.T) (*group, *exec.Cmd) {
	t.Helper()
	g, err := startGuard(newSpawner())
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
	g.arm(armed.Add(400 * time.Millisecond))
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
	g.arm(time.Now().Add(300 * time.Millisecond))
	g.arm(time.Now().Add(time.Hour))
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
