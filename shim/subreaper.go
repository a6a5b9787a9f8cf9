package shim

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
)

// subreaperTree is the `lock` binary's view of the workload's whole tree
// where it has no cgroup: lock is a child subreaper (PR_SET_CHILD_SUBREAPER),
// so a process that daemonizes (setsid, double fork) is re-parented to lock
// instead of to init, and stays its descendant. Every descendant but the
// group guard belongs to the workload. lock reaps the orphans that die, and
// leaves the workload and the guard to their own Wait.
type subreaperTree struct {
	self int
	// own are the children whose exit status the supervisor collects itself.
	own map[int]bool
}

// becomeSubreaper makes this process the reaper of its orphaned descendants.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

func newSubreaperTree(own ...int) *subreaperTree {
	t := &subreaperTree{self: os.Getpid(), own: map[int]bool{}}
	for _, pid := range own {
		t.own[pid] = true
	}
	return t
}

// proc names one process for good: its PID and its start time (a reused
// PID has another start time).
type proc struct {
	pid   int
	start uint64
}

// descendants lists our live descendants other than the guard, and reaps
// orphans of ours that are zombies.
func (t *subreaperTree) descendants(guard int) ([]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	type info struct {
		ppid  int
		gone  bool // zombie or dead
		start uint64
	}
	procs := map[int]info{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if stat, err := procfs.Read(pid); err == nil {
			procs[pid] = info{ppid: stat.PPID, gone: stat.Gone(), start: stat.StartTime}
		}
	}
	var out []proc
	for pid, p := range procs {
		if pid == guard {
			continue
		}
		if !descendsFrom(p.ppid, t.self, func(pid int) (int, bool) {
			q, ok := procs[pid]
			return q.ppid, ok
		}) {
			continue
		}
		if p.gone {
			if p.ppid == t.self && !t.own[pid] {
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			}
			if !threadsLeft(pid) {
				continue
			}
		}
		out = append(out, proc{pid, p.start})
	}
	return out, nil
}

// descendsFrom walks up from ppid through parentOf and reports whether it
// reaches self. PID 1 ends the walk unless self is PID 1: lock as a
// container's entrypoint is the init of its PID namespace, and every
// orphan there (a setsid daemon) is re-parented to it, so it is ours.
func descendsFrom(ppid, self int, parentOf func(int) (int, bool)) bool {
	for cur, hops := ppid, 0; cur > 0 && hops < 4096; hops++ {
		if cur == self {
			return true
		}
		if cur == 1 {
			return false
		}
		next, ok := parentOf(cur)
		if !ok {
			return false
		}
		cur = next
	}
	return false
}

// signalAll sends sig to every descendant (see signal).
func (t *subreaperTree) signalAll(sig syscall.Signal, guard int) (int, error) {
	procs, err := t.descendants(guard)
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		t.signal(p, sig)
	}
	return len(procs), nil
}

// signal sends sig to p through a pidfd, once the process the pidfd holds
// is proven to be p: its start time is the one the scan saw. Between the
// scan and pidfd_open, p may have died and its PID gone to another
// process (anywhere on the host: lock may run as root), which must not be
// hit; once the pidfd is open, the PID can no longer change hands.
func (t *subreaperTree) signal(p proc, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	stat, err := procfs.Read(p.pid)
	if err != nil || stat.StartTime != p.start {
		return
	}
	if stat.PPID > 1 || stat.PPID == t.self {
		// Still parented (not re-parented to an init that is not
		// us): when lock is PID 1 of a container, orphans are ours.
		_ = unix.PidfdSendSignal(fd, sig, nil, 0)
	}
}

// guardedTree binds the tree to the group's guard, which is a descendant
// too but not the workload's.
type guardedTree struct {
	*subreaperTree
	guard int
}

func (g guardedTree) Signal(sig syscall.Signal) error {
	_, err := g.signalAll(sig, g.guard)
	return err
}

func (g guardedTree) Alive() (bool, error) {
	pids, err := g.descendants(g.guard)
	return len(pids) > 0, err
}

func (g guardedTree) KillAll(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := g.signalAll(syscall.SIGKILL, g.guard)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d descendant process(es) still alive %s after SIGKILL", n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
