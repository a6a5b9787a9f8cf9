package driver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/plugins/drivers"
	"golang.org/x/sys/unix"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// taskCgroup is where Nomad's wrangler put the task: the cgroups the
// workload is born in (the supervisor joins them only around the fork; see
// taskStarter), so the workload's resources {} limits apply, and the cgroup holds
// every process of the workload and nothing else.
type taskCgroup struct {
	mode cgroupslib.Mode
	// v2: the task's unified cgroup. v1: the freezer cgroup, which
	// identifies the task's per-controller cgroups.
	path   string
	cpuset string // v1 cpuset cgroup (shared or reserved)
}

// setUpCgroup makes the task's cgroup with its resource limits and names it
// in the spec: the cgroup.procs files the workload is started in, the
// cgroup that proves it dead, and its OOM kill count before the start.
// Without cgroups it returns nil and leaves the spec without any.
func (d *Driver) setUpCgroup(cfg *drivers.TaskConfig, spec *supervisorSpec) (*taskCgroup, error) {
	cg, err := newTaskCgroup(cfg)
	if err != nil {
		return nil, err
	}
	if err := cg.applyLimits(cfg.Resources); err != nil {
		return nil, fmt.Errorf("task cgroup: %w", err)
	}
	spec.CgroupProcs = cg.procsFiles()
	if cg != nil {
		spec.CgroupMode, spec.CgroupPath = int(cg.mode), cg.path
		if n, err := cg.oomKills(); err == nil {
			spec.OOMKillsAtStart = &n
		} else {
			d.logger.Warn("cannot read the task cgroup's OOM kill count: an OOM kill will not be reported", "error", err)
		}
	}
	return cg, nil
}

func newTaskCgroup(cfg *drivers.TaskConfig) (*taskCgroup, error) {
	mode := cgroupslib.GetMode()
	if mode == cgroupslib.OFF || cfg.Resources == nil || cfg.Resources.LinuxResources == nil {
		return nil, nil
	}
	lr := cfg.Resources.LinuxResources
	switch mode {
	case cgroupslib.CG1:
		return &taskCgroup{mode: mode, path: cgroupslib.PathCG1(cfg.AllocID, cfg.Name, "freezer"), cpuset: lr.CpusetCgroupPath}, nil
	default:
		return &taskCgroup{mode: mode, path: lr.CpusetCgroupPath}, nil
	}
}

// v1dir is the task's cgroup for one v1 controller.
func (c *taskCgroup) v1dir(controller string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(c.path))), controller, "nomad", filepath.Base(c.path))
}

// procsFiles are the cgroup.procs files the supervisor writes itself into.
func (c *taskCgroup) procsFiles() []string {
	if c == nil {
		return nil
	}
	if c.mode != cgroupslib.CG1 {
		return []string{filepath.Join(c.path, "cgroup.procs")}
	}
	var files []string
	for _, ctl := range []string{"freezer", "cpu", "memory", "pids"} {
		dir := c.v1dir(ctl)
		if _, err := os.Stat(dir); err == nil {
			files = append(files, filepath.Join(dir, "cgroup.procs"))
		}
	}
	if c.cpuset != "" {
		files = append(files, filepath.Join(c.cpuset, "cgroup.procs"))
	}
	return files
}

// memoryNoLimit is memory_max = -1: with memory oversubscription, memory
// is only a reservation and there is no hard limit.
const memoryNoLimit = -1

// memoryLimits turns the task's memory and memory_max (MB) into the hard
// limit and the reservation (bytes), as Nomad's executor does: memory alone
// is the hard limit; memory_max > 0 is the hard limit with memory reserved;
// memory_max = -1 is no hard limit (hard = -1) with memory reserved.
func memoryLimits(memoryMB, memoryMaxMB int64) (hard, reserved int64) {
	const mb = 1 << 20
	switch {
	case memoryMaxMB == memoryNoLimit:
		return -1, memoryMB * mb
	case memoryMaxMB <= 0:
		return memoryMB * mb, 0
	default:
		return memoryMaxMB * mb, memoryMB * mb
	}
}

// cgroupWrite is one value for one cgroup interface file.
type cgroupWrite struct {
	dir, file, value string
	// optional writes may fail (a kernel or controller without the file).
	optional bool
}

// limitWrites are the task's memory, CPU weight and cpuset limits for its
// cgroup version, as Nomad's executor writes them.
func (c *taskCgroup) limitWrites(res *drivers.Resources) []cgroupWrite {
	if c == nil || res == nil || res.LinuxResources == nil || res.NomadResources == nil {
		return nil
	}
	hard, reserved := memoryLimits(res.NomadResources.Memory.MemoryMB, res.NomadResources.Memory.MemoryMaxMB)
	shares := res.LinuxResources.CPUShares
	cpus := res.LinuxResources.CpusetCpus
	var w []cgroupWrite
	if c.mode == cgroupslib.CG1 {
		mem := c.v1dir("memory")
		if hard != 0 {
			// -1 is v1's "no limit".
			w = append(w, cgroupWrite{dir: mem, file: "memory.limit_in_bytes", value: strconv.FormatInt(hard, 10)})
		}
		if reserved > 0 {
			w = append(w, cgroupWrite{dir: mem, file: "memory.soft_limit_in_bytes", value: strconv.FormatInt(reserved, 10), optional: true})
		}
		if shares > 0 {
			w = append(w, cgroupWrite{dir: c.v1dir("cpu"), file: "cpu.shares", value: strconv.FormatInt(shares, 10)})
		}
		if cpus != "" && c.cpuset != "" {
			// Nomad's v1 core partitioning has set it already; best effort, as the executor.
			w = append(w, cgroupWrite{dir: c.cpuset, file: "cpuset.cpus", value: cpus, optional: true})
		}
		return w
	}
	switch {
	case hard < 0:
		w = append(w, cgroupWrite{dir: c.path, file: "memory.max", value: "max"})
	case hard > 0:
		w = append(w, cgroupWrite{dir: c.path, file: "memory.max", value: strconv.FormatInt(hard, 10)})
	}
	if reserved > 0 {
		w = append(w, cgroupWrite{dir: c.path, file: "memory.low", value: strconv.FormatInt(reserved, 10), optional: true})
	}
	if shares > 0 {
		// The kernel's shares → weight mapping (runc's ConvertCPUSharesToCgroupV2Value).
		weight := 1 + ((shares-2)*9999)/262142
		w = append(w, cgroupWrite{dir: c.path, file: "cpu.weight", value: strconv.FormatInt(weight, 10)})
	}
	if cpus != "" {
		// resources.cores: the task's reserved cores.
		w = append(w, cgroupWrite{dir: c.path, file: "cpuset.cpus", value: cpus})
	}
	return w
}

// applyLimits writes the task's limits (see limitWrites).
func (c *taskCgroup) applyLimits(res *drivers.Resources) error {
	for _, w := range c.limitWrites(res) {
		err := os.WriteFile(filepath.Join(w.dir, w.file), []byte(w.value), 0o644)
		if err != nil && !w.optional {
			return fmt.Errorf("set %s to %s in %s: %w", w.file, w.value, w.dir, err)
		}
	}
	return nil
}

// oomKills is how many processes the kernel has OOM-killed in the task's
// memory cgroup: `oom_kill` of memory.oom_control (v1) or memory.events (v2).
func (c *taskCgroup) oomKills() (uint64, error) {
	if c == nil {
		return 0, errors.New("no task cgroup")
	}
	file := filepath.Join(c.path, "memory.events")
	if c.mode == cgroupslib.CG1 {
		file = filepath.Join(c.v1dir("memory"), "memory.oom_control")
	}
	kv, err := readKV(file)
	if err != nil {
		return 0, err
	}
	n, ok := kv["oom_kill"]
	if !ok {
		return 0, fmt.Errorf("%s has no oom_kill counter (it needs Linux 4.13 or later)", file)
	}
	return n, nil
}

// oomKilledSince reports whether the OOM kill count grew past before (nil:
// unknown, so no).
func (c *taskCgroup) oomKilledSince(before *uint64) bool {
	if c == nil || before == nil {
		return false
	}
	n, err := c.oomKills()
	return err == nil && n > *before
}

// cpuSample is cumulative CPU time of the cgroup at a moment.
type cpuSample struct {
	at           time.Time
	user, system time.Duration
	total        time.Duration
}

// usage reads memory and CPU of everything in the task cgroup: the whole
// workload tree, supervisor included.
func (c *taskCgroup) usage(prev *cpuSample) (*drivers.TaskResourceUsage, cpuSample, error) {
	var (
		mem cstructs.MemoryStats
		cur = cpuSample{at: time.Now()}
		err error
	)
	if c.mode == cgroupslib.CG1 {
		err = c.readV1(&mem, &cur)
	} else {
		err = c.readV2(&mem, &cur)
	}
	if err != nil {
		return nil, cur, err
	}
	cpu := &cstructs.CpuStats{Measured: []string{"System Mode", "User Mode", "Percent"}}
	if prev != nil && !prev.at.IsZero() {
		elapsed := cur.at.Sub(prev.at).Seconds()
		if elapsed > 0 {
			pct := func(a, b time.Duration) float64 { return (b - a).Seconds() / elapsed * 100 }
			cpu.UserMode = pct(prev.user, cur.user)
			cpu.SystemMode = pct(prev.system, cur.system)
			cpu.Percent = pct(prev.total, cur.total)
		}
	}
	return &drivers.TaskResourceUsage{
		ResourceUsage: &cstructs.ResourceUsage{MemoryStats: &mem, CpuStats: cpu},
		Timestamp:     cur.at.UnixNano(),
	}, cur, nil
}

func (c *taskCgroup) readV1(mem *cstructs.MemoryStats, cur *cpuSample) error {
	memDir := c.v1dir("memory")
	usage, err := readUint(filepath.Join(memDir, "memory.usage_in_bytes"))
	if err != nil {
		return err
	}
	stat, _ := readKV(filepath.Join(memDir, "memory.stat"))
	mem.Usage = usage
	mem.RSS = stat["total_rss"]
	mem.Cache = stat["total_cache"]
	mem.Swap = stat["total_swap"]
	mem.MaxUsage, _ = readUint(filepath.Join(memDir, "memory.max_usage_in_bytes"))
	mem.Measured = []string{"RSS", "Cache", "Swap", "Usage", "Max Usage"}

	// Nomad creates no cpuacct cgroup for tasks, so CPU time is summed over
	// the processes in the task's freezer cgroup (the whole workload tree).
	user, system, err := procsCPU(filepath.Join(c.path, "cgroup.procs"))
	if err != nil {
		return err
	}
	cur.user, cur.system, cur.total = user, system, user+system
	return nil
}

// procsCPU sums user and system CPU time of the processes listed in a
// cgroup.procs file.
func procsCPU(procsFile string) (user, system time.Duration, err error) {
	b, err := os.ReadFile(procsFile)
	if err != nil {
		return 0, 0, err
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		stat, err := procfs.Read(pid)
		if err != nil {
			continue // exited meanwhile
		}
		u, s := stat.CPU()
		user += u
		system += s
	}
	return user, system, nil
}

func (c *taskCgroup) readV2(mem *cstructs.MemoryStats, cur *cpuSample) error {
	usage, err := readUint(filepath.Join(c.path, "memory.current"))
	if err != nil {
		return err
	}
	stat, _ := readKV(filepath.Join(c.path, "memory.stat"))
	mem.Usage = usage
	mem.RSS = stat["anon"]
	mem.Cache = stat["file"]
	mem.Swap, _ = readUint(filepath.Join(c.path, "memory.swap.current"))
	mem.Measured = []string{"RSS", "Cache", "Swap", "Usage"}

	cs, err := readKV(filepath.Join(c.path, "cpu.stat"))
	if err != nil {
		return err
	}
	cur.total = time.Duration(cs["usage_usec"]) * time.Microsecond
	cur.user = time.Duration(cs["user_usec"]) * time.Microsecond
	cur.system = time.Duration(cs["system_usec"]) * time.Microsecond
	return nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKV parses "key value" lines (memory.stat, cpu.stat, cpuacct.stat).
func readKV(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// The task cgroup is the workload's shim.Tree: it holds every process of
// the workload, daemons that called setsid included, and nothing else (the
// supervisor stays out of it).

// GuardArgs names the task cgroup to the workload's process-group guard
// (a guard tree, in package shim): the guard, root and outside the cgroup, kills the
// whole cgroup when it fires, so a daemon that left the workload's process
// group dies by the stop deadline too, even while the supervisor and the
// plugin are stuck.
func (c *taskCgroup) GuardArgs() []string {
	return []string{guardTreeCgroup, strconv.Itoa(int(c.mode)), c.path}
}

// guardTreeCgroup marks GuardArgs as a task cgroup's.
const guardTreeCgroup = "cgroup"

// OpenGuardTree is the plugin binary's guard tree opener: the task cgroup
// from its GuardArgs. The guard's arguments come from the supervisor that
// started it, which read them from the plugin's root-only spec.
func OpenGuardTree(args []string) (shim.Tree, error) {
	if len(args) != 3 || args[0] != guardTreeCgroup {
		return nil, fmt.Errorf("guard tree %q: not a task cgroup", args)
	}
	mode, err := strconv.Atoi(args[1])
	if err != nil || !filepath.IsAbs(args[2]) {
		return nil, fmt.Errorf("guard tree %q: not a task cgroup", args)
	}
	return &taskCgroup{mode: cgroupslib.Mode(mode), path: args[2]}, nil
}

// Alive reports whether any process is left in the task cgroup.
func (c *taskCgroup) Alive() (bool, error) {
	pids, err := c.pids()
	return len(pids) > 0, err
}

// Signal sends sig to every process in the task cgroup. On v1 the cgroup is
// frozen meanwhile, so no listed PID can exit and be reused before the
// signal; on v2 each PID is held through a pidfd and checked to be in the
// cgroup first.
func (c *taskCgroup) Signal(sig syscall.Signal) error {
	if c.mode == cgroupslib.CG1 {
		return c.frozen(time.Now().Add(killWait), func(pids []int) {
			for _, pid := range pids {
				_ = syscall.Kill(pid, sig)
			}
		})
	}
	pids, err := c.pids()
	if err != nil {
		return err
	}
	rel := "0::" + strings.TrimPrefix(c.path, cgroupslib.GetDefaultRoot())
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil && strings.TrimSpace(string(b)) == rel {
			_ = unix.PidfdSendSignal(fd, sig, nil, 0)
		}
		unix.Close(fd)
	}
	return nil
}

// KillAll SIGKILLs every process in the task cgroup and waits until it is
// empty. On v1 the freezer holds the cgroup still while its members are
// listed and killed, so a fork loop cannot outrun the kill and a listed PID
// cannot exit and be reused in between (frozen processes do not run); on v2
// the kernel kills the whole cgroup in one write to cgroup.kill.
//
// It kills at least once, however little time within leaves: a caller
// short of time still gets its SIGKILL sent.
func (c *taskCgroup) KillAll(within time.Duration) error {
	deadline := time.Now().Add(within)
	for killed := false; ; killed = true {
		pids, err := c.pids()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if killed && time.Now().After(deadline) {
			return fmt.Errorf("%d task process(es) still alive %s after SIGKILL: %v", len(pids), within, pids)
		}
		if c.mode == cgroupslib.CG1 {
			err = c.freezeAndKill(deadline)
		} else {
			err = os.WriteFile(filepath.Join(c.path, "cgroup.kill"), []byte("1"), 0o644)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill the task cgroup: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freezeAndKill freezes the v1 freezer cgroup, SIGKILLs every member, and
// thaws it so the kills take effect.
func (c *taskCgroup) freezeAndKill(deadline time.Time) error {
	return c.frozen(deadline, func(pids []int) {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// frozen runs fn with the members of the frozen v1 freezer cgroup, then
// thaws it.
func (c *taskCgroup) frozen(deadline time.Time, fn func(pids []int)) error {
	state := filepath.Join(c.path, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0o644); err != nil {
		return err
	}
	defer func() { _ = os.WriteFile(state, []byte("THAWED"), 0o644) }()
	for {
		b, err := os.ReadFile(state)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "FROZEN" || time.Now().After(deadline) {
			break // a member stuck in the kernel may keep it FREEZING; kill anyway
		}
		time.Sleep(time.Millisecond)
	}
	pids, err := c.pids()
	if err != nil {
		return err
	}
	fn(pids)
	return nil
}

// pids lists the processes in the task cgroup (zombies leave it on exit).
func (c *taskCgroup) pids() ([]int, error) {
	if c == nil {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // the cgroup is already gone, and its processes with it
	}
	if err != nil {
		return nil, fmt.Errorf("list task cgroup: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
