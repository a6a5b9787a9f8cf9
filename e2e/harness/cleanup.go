package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"
	"golang.org/x/sys/unix"
)

// cleanup is registered by StartAgent. It stops every job, then the client
// and the server, kills anything the tasks left behind, and removes the data
// dirs. Problems are reported with t.Errorf: a leaked process or mount is a
// bug.
func (a *Agent) cleanup() {
	t := a.t
	defer func() {
		for _, release := range a.releases {
			release()
		}
	}()
	defer func() {
		if !t.Failed() {
			return
		}
		for _, m := range a.members() {
			t.Logf("harness: %s agent config %s, log tail (%s):\n%s", m.name, m.cfgPath, m.logPath, fileTail(m.logPath, 60))
		}
	}()
	defer func() {
		for _, m := range a.members() {
			if m.api != nil {
				m.api.Close()
			}
		}
		if a.api != nil {
			a.api.Close()
		}
	}()

	if a.server != nil && a.api != nil {
		for _, m := range a.members() {
			if m.Partitioned() {
				if err := m.Heal(); err != nil {
					a.errorf("cleanup: heal %s: %v", m.name, err)
				}
			}
			if m.isPaused() {
				if err := m.Resume(); err != nil {
					a.errorf("cleanup: resume %s agent: %v", m.name, err)
				}
			}
		}
		// Tasks outlive a stopped non-dev client, and a stopped server cannot
		// stop them. Bring the cluster back so that Nomad stops them properly.
		if !a.opts.Dev && !a.allRunning() && len(a.leftovers(false)) > 0 {
			a.log.Info("cleanup: an agent process is stopped but tasks still run; starting it to stop them")
			for _, m := range a.members() {
				if !m.Running() {
					if err := m.Start(); err != nil {
						a.log.Warn("cleanup: could not start agent", "agent", m.name, "error", err)
						break
					}
				}
			}
		}
		if a.allRunning() {
			a.stopAllJobs()
			// Allocations report "complete" before their poststop hooks have
			// run (e.g. the logmon hook stopping its logmon process); stopping
			// the client too early orphans those processes. A task's stop may
			// itself take long: a holder's LB REMOVE retried against an LB
			// that is down (10 s), then its kill_timeout, on a loaded
			// machine; a whole minute is left before anything alive counts
			// as a leak (the wait ends as soon as nothing is).
			deadline := time.Now().Add(60 * time.Second)
			for len(a.leftovers(false)) > 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
		}
		members := a.members()
		slices.Reverse(members) // client first
		for _, m := range members {
			if err := m.Stop(); err != nil {
				a.errorf("cleanup: stop %s agent: %v", m.name, err)
			}
		}
		for pid, desc := range a.leftovers(true) {
			if agentProbe(desc) {
				// The agent's own driver fingerprint, in flight when it
				// stopped (a JVM starting on a loaded machine takes
				// seconds): Nomad's, not a task's, so not a leak of ours.
				a.log.Info("cleanup: killing the agent's fingerprint probe that outlived it", "pid", pid, "argv", desc)
			} else {
				a.errorf("cleanup: process %d outlived the agent; killing it: %s", pid, desc)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				a.errorf("cleanup: kill %d: %v", pid, err)
			}
		}
	}

	if a.net != nil {
		if err := a.net.teardown(); err != nil {
			a.errorf("cleanup: network namespaces: %v", err)
		}
	}
	if a.dir == "" {
		return
	}
	if err := unmountBelow(a.dir); err != nil {
		a.errorf("cleanup: %v; leaving %s in place", err, a.dir)
		return
	}
	if err := os.RemoveAll(a.dir); err != nil {
		a.errorf("cleanup: remove %s: %v", a.dir, err)
	}
}

// stopAllJobs deregisters every job in every namespace, waits (bounded) for
// their allocations to stop, purges the jobs and garbage-collects the
// client's allocations so Nomad unmounts their directories.
func (a *Agent) stopAllJobs() {
	// A short per-request timeout: a wedged agent must not stall cleanup.
	cl, err := a.newAPIClient(a.Addr(), 10*time.Second)
	if err != nil {
		a.errorf("cleanup: %v", err)
		return
	}
	defer cl.Close()

	all := &api.QueryOptions{Namespace: "*"}
	jobs, _, err := cl.Jobs().List(all)
	if err != nil {
		a.log.Warn("cleanup: list jobs", "error", err)
		return
	}
	for _, j := range jobs {
		if _, _, err := cl.Jobs().Deregister(j.ID, false, &api.WriteOptions{Namespace: j.Namespace}); err != nil {
			a.log.Warn("cleanup: stop job", "job", j.ID, "error", err)
		}
	}
	deadline := time.Now().Add(cleanupJobTimeout)
	for {
		allocs, _, err := cl.Allocations().List(all)
		var live []string
		for _, al := range allocs {
			if al.ClientStatus == api.AllocClientStatusPending || al.ClientStatus == api.AllocClientStatusRunning {
				live = append(live, short(al.ID)+"/"+al.JobID)
			}
		}
		if err == nil && len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			a.errorf("cleanup: allocations still live %s after stopping all jobs: %v (err=%v)", cleanupJobTimeout, live, err)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, j := range jobs {
		_, _, _ = cl.Jobs().Deregister(j.ID, true, &api.WriteOptions{Namespace: j.Namespace})
	}
	for _, m := range a.clients {
		if id := m.NodeID(); id != "" {
			// The endpoint answers with an empty body, which the api client
			// reports as io.EOF.
			if err := cl.Nodes().GC(id, nil); err != nil && !errors.Is(err, io.EOF) {
				a.log.Warn("cleanup: client GC", "client", m.name, "error", err)
			}
		}
	}
}

// allRunning reports whether every agent process is running.
func (a *Agent) allRunning() bool {
	for _, m := range a.members() {
		if !m.Running() {
			return false
		}
	}
	return true
}

// agentProbe reports whether argv is a driver fingerprint probe the agent
// runs itself (Nomad's java and qemu drivers run `java -version` and
// `qemu-system-x86_64 --version` every fingerprint period).
func agentProbe(argv string) bool {
	f := strings.Fields(argv)
	if len(f) != 2 {
		return false
	}
	name := filepath.Base(f[0])
	return (name == "java" && f[1] == "-version") || (strings.HasPrefix(name, "qemu") && f[1] == "--version")
}

// leftovers finds live processes, other than the agent processes themselves,
// that the agent or its tasks started:
//   - argv or environment inside the private dir (executors, raw_exec tasks),
//   - the process group of an agent run, running the nomad binary (logmon),
//   - membership in the cgroup of one of its allocations (exec tasks),
//   - with withCwd, a working directory inside the private dir: that also
//     matches the plugins of a running client, so use it once it is stopped.
func (a *Agent) leftovers(withCwd bool) map[int]string {
	found := map[int]string{}
	if a.dir == "" || a.server == nil {
		return found
	}
	running := map[int]bool{}
	pgids := map[int]bool{}
	for _, m := range a.members() {
		running[m.PID()] = true
		m.mu.Lock()
		for _, g := range m.pgids {
			pgids[g] = true
		}
		m.mu.Unlock()
	}
	marker := a.dir + "/"
	procs, err := scanProcs(func(p Proc) bool {
		if running[p.PID] {
			return false
		}
		if p.contains(marker) {
			return true
		}
		if pgids[p.PGID] && strings.TrimSuffix(p.Exe, " (deleted)") == a.bin {
			return true
		}
		if !withCwd {
			return false
		}
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p.PID))
		return err == nil && (cwd == a.dir || strings.HasPrefix(cwd, marker))
	})
	if err != nil {
		a.log.Warn("cleanup: scan /proc", "error", err)
	}
	for _, p := range procs {
		found[p.PID] = strings.Join(p.Argv, " ")
	}
	for _, m := range a.clients {
		allocs, _ := os.ReadDir(m.AllocDir())
		for _, al := range allocs {
			for _, pid := range allocCgroupPIDs(al.Name()) {
				if _, ok := found[pid]; !ok && !running[pid] {
					found[pid] = "in a cgroup of allocation " + al.Name()
				}
			}
		}
	}
	delete(found, os.Getpid())
	return found
}

// allocCgroupPIDs lists the processes in the task cgroups of one allocation,
// for cgroups v1 (<controller>/nomad/<alloc>.<task>) and v2
// (nomad.slice/<partition>.slice/<alloc>.<task>.scope).
func allocCgroupPIDs(allocID string) []int {
	if len(allocID) != 36 {
		return nil
	}
	patterns := []string{
		"/sys/fs/cgroup/*/nomad/" + allocID + ".*/cgroup.procs",
		"/sys/fs/cgroup/cpuset/nomad/reserve/" + allocID + ".*/cgroup.procs",
		"/sys/fs/cgroup/nomad.slice/*/" + allocID + ".*.scope/cgroup.procs",
	}
	seen := map[int]bool{}
	var pids []int
	for _, pat := range patterns {
		files, _ := filepath.Glob(pat)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, field := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(field); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// unmountBelow detaches every mount at or below dir, deepest first, so that
// removing dir can never reach into a bind-mounted host directory. Nomad
// mounts a tmpfs on every task's secrets dir and bind-mounts shared alloc
// dirs; it unmounts them only when it garbage-collects an allocation.
func unmountBelow(dir string) error {
	mounts, err := mountsBelow(dir)
	if err != nil {
		return err
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var errs []error
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	if rest, err := mountsBelow(dir); err == nil && len(rest) > 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("still mounted below %s: %v", dir, rest))
	}
	return errors.Join(errs...)
}

// mountsBelow lists the mount points at or below dir from /proc/self/mountinfo.
func mountsBelow(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMountinfo decodes the \ooo octal escapes used in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
