package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// With lock as a child subreaper, a daemon that its workload started (and
// that ignores SIGTERM) stays lock's descendant after the workload exits:
// the tree sees it, and KillAll proves it dead and reaps it.
func TestSubreaperTreeKeepsDaemons(t *testing.T) {
	if err := becomeSubreaper(); err != nil {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	pidFile := t.TempDir() + "/daemon.pid"
	sh := exec.Command("/bin/sh", "-c", `setsid sh -c 'trap "" TERM; echo $$ > "$1"; while :; do sleep 1; done' sh "$1" & exit 0`, "sh", pidFile)
	if err := sh.Run(); err != nil {
		t.Fatal(err)
	}
	tree := guardedTree{newSubreaperTree(sh.Process.Pid), 0}
	var daemon int
	deadline := time.Now().Add(30 * time.Second)
	for daemon == 0 {
		if b, err := os.ReadFile(pidFile); err == nil {
			daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon never wrote its pid")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGKILL) })
	if alive, err := tree.Alive(); !alive || err != nil {
		t.Fatalf("the tree does not see the daemon %d: %v %v", daemon, alive, err)
	}
	if err := tree.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if alive, _ := tree.Alive(); !alive {
		t.Fatal("the daemon ignores SIGTERM, yet the tree is empty")
	}
	if err := tree.KillAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if alive, err := tree.Alive(); alive || err != nil {
		t.Fatalf("after KillAll: %v %v", alive, err)
	}
	// Reaped, not left a zombie.
	deadline = time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(daemon)); os.IsNotExist(err) {
			break
		}
		_, _ = tree.descendants(0)
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d not reaped", daemon)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReleaseFailedMessageNamesTheCause(t *testing.T) {
	cfg := lockclient.Config{Timing: lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second}}
	rejected := fmt.Errorf("release p: %w (Unexpected response code: 500 (Server error authenticating request))", lockclient.ErrIdentityRejected)
	purged := releaseFailedMessage(rejected, cfg, false)
	for _, want := range []string{"Lock not released", "21s", "stop -purge", "stop the job first"} {
		if !strings.Contains(purged, want) {
			t.Errorf("lock: %q lacks %q", purged, want)
		}
	}
	driver := releaseFailedMessage(rejected, cfg, true)
	for _, want := range []string{"Lock not released by the task", "stop -purge", "release_token_file", "21s"} {
		if !strings.Contains(driver, want) {
			t.Errorf("driver: %q lacks %q", driver, want)
		}
	}
	if other := releaseFailedMessage(errors.New("connection refused"), cfg, true); strings.Contains(other, "purge") {
		t.Errorf("a transport error blamed on a purge: %q", other)
	}
}

// lock as a container's entrypoint is PID 1: orphans re-parented to PID 1
// are its own, and must count as live workload (they did not before, so a
// setsid daemon outlived the release). Elsewhere PID 1 is someone else's.
func TestDescendsFromAsPID1(t *testing.T) {
	// 1 (lock) ─ 7 (workload) ─ 9; 12 is a daemon re-parented to 1; 20's
	// parent 15 is not in the table.
	parents := map[int]int{1: 0, 7: 1, 9: 7, 12: 1, 20: 15}
	parentOf := func(pid int) (int, bool) { p, ok := parents[pid]; return p, ok }
	for _, tc := range []struct {
		pid, self int
		want      bool
	}{
		{9, 1, true}, {12, 1, true}, {7, 1, true}, {20, 1, false},
		// lock not PID 1 (self 7): the daemon under init is not ours.
		{9, 7, true}, {12, 7, false},
	} {
		if got := descendsFrom(parents[tc.pid], tc.self, parentOf); got != tc.want {
			t.Errorf("descendsFrom(pid %d, self %d) = %t, want %t", tc.pid, tc.self, got, tc.want)
		}
	}
}

// Between the scan of /proc and pidfd_open, a descendant may die and its PID
// go to another process. The subreaper signals only the process the scan
// saw: one whose start time differs is left alone. The child here stands
// for that other process: a SIGKILL aimed at its PID with another start time
// must not reach it, so the SIGTERM sent next (with its own) is what ends it.
func TestSubreaperSignalsOnlyTheProcessItScanned(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill() })
	stat, err := procfs.Read(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	tree := newSubreaperTree()
	tree.signal(proc{pid: child.Process.Pid, start: stat.StartTime + 1}, syscall.SIGKILL)
	tree.signal(proc{pid: child.Process.Pid, start: stat.StartTime}, syscall.SIGTERM)
	_ = child.Wait()
	ws, _ := child.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the child ended with %v, want SIGTERM: the SIGKILL for a process of another start time reached it", child.ProcessState)
	}
}
