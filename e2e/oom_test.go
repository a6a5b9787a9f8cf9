package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverOOMKill: a workload that allocates far more than its task's
// memory (64 MB) is OOM-killed by the kernel in the task's memory cgroup.
// Nomad must show it (the Terminated event carries oom_killed = true and
// the "OOM Killed" exit message), and the supervisor, which stays outside
// that cgroup, must survive it: it proves the task dead and releases the
// lock itself ("Released lock", not the plugin's crash release).
func TestDriverOOMKill(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	j := newDrvJob(t, "oom", 1)
	j.args = []string{"-eat-mb", "512"}
	j.failFast = true
	j.run(t, a)

	start := j.waitStart(t, 60*time.Second, nil)
	term := drvWaitTerminated(t, a, start.AllocID, 60*time.Second)
	if term.Details["oom_killed"] != "true" {
		t.Errorf("Terminated event has oom_killed = %q, want true: %s", term.Details["oom_killed"], drvEventText(term))
	}
	if term.Details["exit_code"] != "137" {
		t.Errorf("Terminated event has exit code %q, want 137 (SIGKILL by the OOM killer): %s", term.Details["exit_code"], drvEventText(term))
	}
	drvWaitEvent(t, a, start.AllocID, 10*time.Second, "OOM Killed", "resources.memory")
	evs := drvEvents(t, a, start.AllocID)
	if len(drvMatching(evs, "Released lock")) == 0 {
		t.Errorf("no \"Released lock\" event: the supervisor did not release after the OOM kill; events:\n%s", drvFormatEvents(evs))
	}
	if m := drvMatching(evs, "crashed supervisor"); len(m) > 0 {
		t.Errorf("the supervisor died with its workload (the plugin released for it): %s", drvFormatEvents(m))
	}
	if v := drvLock(t, a, j.lockPath()); v.Lock != nil && v.Lock.ID != "" {
		t.Errorf("lock %s is still held after the task ended: %+v", j.lockPath(), v.Lock)
	}
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusFailed, 60*time.Second)
}

// drvWaitTerminated waits for the task's Terminated event.
func drvWaitTerminated(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs := drvEvents(t, a, allocID)
		for _, ev := range evs {
			if ev.Type == api.TaskTerminated {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no Terminated event within %s; events:\n%s", drvShort(allocID), timeout, drvFormatEvents(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDriverProcessOptions: oom_score_adj, work_dir and denied_envvars reach
// the workload, the supervisor keeps its own strongly negative
// oom_score_adj, and a work_dir the task user cannot enter (/root, 0700)
// fails the task instead of being entered as root.
func TestDriverProcessOptions(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))

	j := newDrvJob(t, "procopts", 1)
	j.meta = map[string]string{"hidden": "x"}
	j.configExtra = "oom_score_adj = 500\n        work_dir = \"/tmp\"\n        denied_envvars = [\"NOMAD_META_*\"]"
	j.run(t, a)
	start := j.waitStart(t, 60*time.Second, nil)
	sup := drvSupervisor(t, start.AllocID)
	read := func(pid int, file string) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read(start.PID, "oom_score_adj"); got != "500" {
		t.Errorf("workload oom_score_adj = %s, want the task's 500", got)
	}
	switch got := read(sup.PID, "oom_score_adj"); {
	case !hasCapSysResource(t):
		// Lowering oom_score_adj needs CAP_SYS_RESOURCE, which some
		// container sandboxes drop even for root: the supervisor warns.
		t.Logf("no CAP_SYS_RESOURCE here: supervisor oom_score_adj is %s, its -999 not checked", got)
	case got != "-999":
		t.Errorf("supervisor oom_score_adj = %s, want -999", got)
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", start.PID)); err != nil || cwd != "/tmp" {
		t.Errorf("workload cwd = %q (%v), want work_dir /tmp", cwd, err)
	}
	env := strings.Split(read(start.PID, "environ"), "\x00")
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "NOMAD_META_") }) {
		t.Errorf("denied NOMAD_META_* reached the workload: %q", env)
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "NOMAD_ALLOC_ID=") }) {
		t.Errorf("NOMAD_ALLOC_ID is missing from the workload's environment: %q", env)
	}

	bad := newDrvJob(t, "workdir-root", 1)
	bad.failFast = true
	bad.user = "nobody" // the harness runs tasks as root unless told
	bad.configExtra = "work_dir = \"/root\""
	bad.run(t, a)
	deadline := time.Now().Add(60 * time.Second)
	for {
		allocs, err := a.Allocs(bad.id)
		if err != nil {
			t.Fatal(err)
		}
		if len(allocs) > 0 {
			if term := drvMatching(drvEvents(t, a, allocs[0].ID), "Terminated"); len(term) > 0 {
				if term[0].Details["exit_code"] != "126" {
					t.Errorf("work_dir /root: Terminated with exit code %q, want 126 (cannot run): %s", term[0].Details["exit_code"], drvEventText(term[0]))
				}
				if logs := a.AllocLogs(t, allocs[0].ID, drvTask, "stderr"); !strings.Contains(logs, "config.work_dir") || !strings.Contains(logs, "/root") {
					t.Errorf("the task's stderr does not name config.work_dir:\n%s", logs)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			allocs, _ := a.Allocs(bad.id)
			for _, al := range allocs {
				t.Logf("alloc %s %s events:\n%s", drvShort(al.ID), al.ClientStatus, drvFormatEvents(drvEvents(t, a, al.ID)))
			}
			t.Fatalf("work_dir /root: the task did not terminate within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hasCapSysResource reports whether this process holds CAP_SYS_RESOURCE
// (bit 24 of CapEff), which the supervisor needs to lower its oom_score_adj.
func hasCapSysResource(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<24) != 0
		}
	}
	return false
}

// TestDriverMemoryMax: with memory oversubscription on, memory_max = 128
// is the hard limit with memory (64) reserved, and memory_max = -1 sets no
// hard limit at all, as Nomad's executor does (it used to become a hard
// limit equal to memory). Read back from the task's real memory cgroup.
func TestDriverMemoryMax(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	sched, _, err := a.API().Operator().SchedulerGetConfiguration(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sched.SchedulerConfig
	cfg.MemoryOversubscriptionEnabled = true
	if _, _, err := a.API().Operator().SchedulerSetConfiguration(cfg, nil); err != nil {
		t.Fatalf("enable memory oversubscription: %v", err)
	}
	const mb = 1 << 20
	for _, tc := range []struct {
		name             string
		memoryMax        int
		wantHard, wantLo int64 // wantHard -1: no limit
	}{
		{"max128", 128, 128 * mb, 64 * mb},
		{"nolimit", -1, -1, 64 * mb},
	} {
		j := newDrvJob(t, "memmax-"+tc.name, 1)
		j.memoryMax = tc.memoryMax
		j.run(t, a)
		start := j.waitStart(t, 60*time.Second, nil)
		hard, low := drvMemoryLimits(t, start.AllocID)
		// v1 spells "no limit" as the largest page-aligned value.
		if (tc.wantHard < 0 && hard < 1<<62) || (tc.wantHard >= 0 && hard != tc.wantHard) || low != tc.wantLo {
			t.Errorf("memory_max = %d: hard limit %d, reservation %d; want %d (-1: none), %d", tc.memoryMax, hard, low, tc.wantHard, tc.wantLo)
		}
	}
}

// drvMemoryLimits reads the hard limit and the reservation of the task's
// memory cgroup (v1: limit_in_bytes and soft_limit_in_bytes; v2: memory.max
// and memory.low, "max" read as 1<<63-1).
func drvMemoryLimits(t *testing.T, allocID string) (hard, low int64) {
	t.Helper()
	read := func(p string) int64 {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 1<<63 - 1
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return n
	}
	if cgroupslib.GetMode() == cgroupslib.CG1 {
		dir := cgroupslib.PathCG1(allocID, drvTask, "memory")
		return read(filepath.Join(dir, "memory.limit_in_bytes")), read(filepath.Join(dir, "memory.soft_limit_in_bytes"))
	}
	dir := cgroupslib.LinuxResourcesPath(allocID, drvTask, false)
	return read(filepath.Join(dir, "memory.max")), read(filepath.Join(dir, "memory.low"))
}
