package driver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/client/lib/cgroupslib"
)

// nomad alloc signal reaches the workload only while it is the
// supervisor's child: a PID that now belongs to another process is never
// signalled.
func TestSignalChildOnlyHitsChildren(t *testing.T) {
	child := exec.Command("/bin/sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	if err := signalChild(os.Getpid(), child.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatalf("signal our own child: %v", err)
	}
	if st, _ := child.Process.Wait(); st == nil || st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("child did not die of SIGTERM: %v", st)
	}
	if err := signalChild(os.Getpid(), 1, syscall.SIGTERM); err == nil {
		t.Fatal("signalChild accepted pid 1, which is not our child")
	}
}

// The task cgroup as the workload's tree, on a real v1 freezer cgroup: a
// daemon that left the process group (setsid) and ignores SIGTERM is seen,
// signalled, and killed; only then is the tree proven empty.
func TestCgroupTreeKillsDaemons(t *testing.T) {
	root := "/sys/fs/cgroup/freezer"
	if cgroupslib.GetMode() != cgroupslib.CG1 || os.Geteuid() != 0 {
		t.Skip("needs root and a cgroups v1 freezer (the v2 path writes cgroup.kill)")
	}
	dir := filepath.Join(root, fmt.Sprintf("singleton-unit-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &taskCgroup{mode: cgroupslib.CG1, path: dir}
	t.Cleanup(func() { _ = c.KillAll(10 * time.Second); _ = os.Remove(dir) })
	// The shell joins the cgroup, then starts a SIGTERM-ignoring daemon in
	// its own session and waits.
	sh := exec.Command("/bin/sh", "-c", `echo $$ > "$1/cgroup.procs"; setsid sh -c 'trap "" TERM; while :; do sleep 1; done' & wait`, "sh", dir)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sh.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := c.pids()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) >= 3 { // sh, the daemon's sh, its sleep
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup members: %v", pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if alive, err := c.Alive(); !alive || err != nil {
		t.Fatalf("Alive = %v, %v", alive, err)
	}
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.KillAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if alive, err := c.Alive(); alive || err != nil {
		t.Fatalf("after KillAll: Alive = %v, %v", alive, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err != nil || string(b) != "THAWED\n" {
		t.Errorf("freezer.state after KillAll: %q %v", b, err)
	}
	var missing *os.PathError
	if err := (&taskCgroup{mode: cgroupslib.CG1, path: filepath.Join(root, "gone-"+strconv.Itoa(os.Getpid()))}).KillAll(time.Second); err != nil && !errors.As(err, &missing) {
		t.Errorf("KillAll of a cgroup that is gone: %v", err)
	}
}

// The task log FIFOs live in the shared alloc dir, which the task user can
// write: the root plugin must not follow a planted symlink or fill a file.
func TestOpenLogFIFORefusesFilesAndSymlinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "root-only")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, ".t.stdout.fifo")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if f, err := openLogFIFO(link); err == nil {
		f.Close()
		t.Error("openLogFIFO followed a symlink")
	}
	if f, err := openLogFIFO(victim); err == nil {
		f.Close()
		t.Error("openLogFIFO opened a regular file")
	}
	fifo := filepath.Join(dir, "real.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	reader := make(chan *os.File, 1)
	go func() {
		r, _ := os.OpenFile(fifo, os.O_RDONLY, 0)
		reader <- r
	}()
	f, err := openLogFIFO(fifo)
	if err != nil {
		t.Fatalf("a real FIFO: %v", err)
	}
	f.Close()
	if r := <-reader; r != nil {
		r.Close()
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("victim changed: %q", b)
	}
}

// A log FIFO that logmon never opens fails the start after the wait, and
// leaves nothing blocked in open() behind: a plugin that retries starts
// must not pile up stuck goroutines (and threads).
func TestOpenLogFIFOGivesUpCleanly(t *testing.T) {
	defer func(d time.Duration) { logFIFOTimeout = d }(logFIFOTimeout)
	logFIFOTimeout = 200 * time.Millisecond
	fifo := filepath.Join(t.TempDir(), "nobody-reads.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openLogFIFO(fifo)
	if err == nil {
		f.Close()
		t.Fatal("openLogFIFO opened a FIFO that no one reads")
	}
	if !strings.Contains(err.Error(), "no reader") {
		t.Errorf("error %q does not say that no reader came", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "openLogFIFO") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine is still in openLogFIFO after it gave up:\n%s", stacks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
