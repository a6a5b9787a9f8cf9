package driver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func gatedAlloc(tasks ...*api.Task) *api.Allocation {
	name := "g"
	return &api.Allocation{ID: "a1", TaskGroup: name, Job: &api.Job{TaskGroups: []*api.TaskGroup{{Name: &name, Tasks: tasks}}}}
}

func TestPlanGatedKillsOnlyWhatItCanFind(t *testing.T) {
	alloc := gatedAlloc(
		&api.Task{Name: "gate", Driver: "singleton"},
		&api.Task{Name: "web", Driver: "docker"},
		&api.Task{Name: "worker", Driver: "raw_exec"},
		&api.Task{Name: "pinned", Driver: "raw_exec", Config: map[string]any{"cgroup_v2_override": "custom.slice/x.scope"}},
		&api.Task{Name: "vm", Driver: "qemu"},
		&api.Task{Name: "cleanup", Driver: "raw_exec", Lifecycle: &api.TaskLifecycle{Hook: api.TaskLifecycleHookPoststop}},
	)
	tasks := shim.GatedTasksOf(alloc, "gate")
	var names []string
	for _, g := range tasks {
		names = append(names, g.Name)
	}
	if got := strings.Join(names, ","); got != "web,worker,pinned,vm" {
		t.Fatalf("gated tasks = %s, want web,worker,pinned,vm (not the gate, not poststop)", got)
	}
	const v1gate = "/sys/fs/cgroup/freezer/nomad/a1.gate"
	for _, tc := range []struct {
		name   string
		env    gatedEnv
		alloc  *api.Allocation
		direct string
	}{
		{"docker endpoint and cgroups v1", gatedEnv{DockerEndpoint: "unix:///run/docker.sock", CgroupMode: cgroupslib.CG1, GateCgroup: v1gate}, alloc, "web,worker"},
		{"no docker endpoint", gatedEnv{CgroupMode: cgroupslib.CG1, GateCgroup: v1gate}, alloc, "worker"},
		{"v1 without the gate's cgroup", gatedEnv{CgroupMode: cgroupslib.CG1}, alloc, ""},
		{"cgroups off", gatedEnv{DockerEndpoint: "unix:///run/docker.sock", CgroupMode: cgroupslib.OFF}, alloc, "web"},
		{"v2 without the gate's cgroup", gatedEnv{CgroupMode: cgroupslib.CG2}, alloc, ""},
		{"v2", gatedEnv{CgroupMode: cgroupslib.CG2, GateCgroup: "/sys/fs/cgroup/nomad.slice/share.slice/a1.gate.scope"}, alloc, "worker"},
		{"task configs unread: exec tasks left to Nomad", gatedEnv{DockerEndpoint: "unix:///run/docker.sock", CgroupMode: cgroupslib.CG1, GateCgroup: v1gate}, nil, "web"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := planGated("a1", tasks, tc.alloc, tc.env)
			k, err := newGatedKiller(rec, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(k.Direct(), ","); got != tc.direct {
				t.Errorf("Direct() = %q, want %q; left to Nomad: %v", got, tc.direct, k.LeftToNomad())
			}
			for _, left := range k.LeftToNomad() {
				if !strings.Contains(left, ": ") {
					t.Errorf("left to Nomad without a reason: %q", left)
				}
			}
		})
	}
}

func TestContainerNameIsNomads(t *testing.T) {
	if got := containerName("api/v1", "0b5d"); got != "/api_v1-0b5d" {
		t.Errorf("containerName = %q, want /api_v1-0b5d (the docker driver's <task>-<alloc ID>)", got)
	}
}

func TestGatedKillerV2PathsAreTheGatesSiblings(t *testing.T) {
	k := &gatedKiller{rec: gatedRecord{AllocID: "a1"}, env: gatedEnv{CgroupMode: cgroupslib.CG2,
		GateCgroup: "/sys/fs/cgroup/custom.slice/share.slice/a1.gate.scope"}}
	var got []string
	for _, cg := range k.taskCgroupOf("app") {
		got = append(got, cg.path)
	}
	want := "/sys/fs/cgroup/custom.slice/share.slice/a1.app.scope,/sys/fs/cgroup/custom.slice/reserve.slice/a1.app.scope"
	if strings.Join(got, ",") != want {
		t.Errorf("v2 task cgroups = %v, want %s", got, want)
	}
}

// cgroupWithDaemon makes a real v1 freezer cgroup where Nomad's executor
// would put task "app" of a test allocation, with a shell that ignores
// SIGTERM and a setsid child that does too, and returns it.
func cgroupWithDaemon(t *testing.T) (allocID string, cg *taskCgroup) {
	return cgroupRunning(t, `trap "" TERM; setsid sh -c 'trap "" TERM; while :; do sleep 1; done' & while :; do sleep 1; done`, 4)
}

// cgroupRunning makes a real v1 freezer cgroup where Nomad's executor
// would put task "app" of a test allocation, runs script in it with sh,
// waits until it holds at least procs processes, and returns it.
func cgroupRunning(t *testing.T, script string, procs int) (allocID string, cg *taskCgroup) {
	t.Helper()
	if cgroupslib.GetMode() != cgroupslib.CG1 || os.Geteuid() != 0 {
		t.Skip("needs root and cgroups v1 (this test creates a freezer cgroup)")
	}
	// Hexadecimal, as an allocation ID: the plugin checks it (allocIDPattern).
	allocID = "feed-" + strconv.FormatInt(int64(os.Getpid()), 16) + "-" + strconv.FormatInt(time.Now().UnixNano(), 16)
	dir := cgroupslib.PathCG1(allocID, "app", "freezer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot create a freezer cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	// The workload waits for go before it runs, so that its children are
	// born in the cgroup.
	goFile := filepath.Join(t.TempDir(), "go")
	cmd := exec.Command("sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done; `+script, goFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cg = &taskCgroup{mode: cgroupslib.CG1, path: dir}
	t.Cleanup(func() { _ = cg.KillAll(5 * time.Second) })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pids, _ := cg.pids()
		if len(pids) >= procs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the test processes did not appear in %s: %v", dir, pids)
		}
	}
	go func() { _ = cmd.Wait() }()
	return allocID, cg
}

// waitEmpty waits, within bound, for the cgroup to be empty.
func waitEmpty(t *testing.T, cg *taskCgroup, bound time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(bound); ; time.Sleep(20 * time.Millisecond) {
		if alive, err := cg.Alive(); err == nil && !alive {
			return
		}
		if time.Now().After(deadline) {
			pids, _ := cg.pids()
			t.Fatalf("the task cgroup still has processes %v %s later", pids, bound)
		}
	}
}

// rawExecKiller is the killer of task "app" (raw_exec) of allocation
// alloc, with kill_signal sig and kill_timeout kt.
func rawExecKiller(t *testing.T, alloc, sig string, kt time.Duration) *gatedKiller {
	t.Helper()
	env := gatedEnv{CgroupMode: cgroupslib.CG1, GateCgroup: cgroupslib.PathCG1(alloc, "gate", "freezer")}
	app := &api.Task{Name: "app", Driver: "raw_exec", KillSignal: sig, KillTimeout: &kt}
	rec := planGated(alloc, []shim.GatedTask{{Name: "app", Driver: "raw_exec"}}, gatedAlloc(app), env)
	k, err := newGatedKiller(rec, env)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// H1(a), at the killer: a kill whose time is already up still SIGKILLs
// (once), rather than giving up before it signals. (Before: the cgroup
// kill returned its error first, and every process lived.)
func TestGatedKillerKillsPastItsDeadline(t *testing.T) {
	alloc, cg := cgroupWithDaemon(t)
	k := rawExecKiller(t, alloc, "", time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-10*time.Millisecond))
	defer cancel()
	_ = k.KillAll(ctx)
	waitEmpty(t, cg, 5*time.Second)
}

// Stop gives a gated task its kill_signal (SIGINT, Nomad's default for an
// executor task) and lets it exit by itself within its grace; one that
// ignores the signal is SIGKILLed once the grace is over.
func TestGatedKillerStopGivesTheKillSignal(t *testing.T) {
	t.Run("exits on its signal", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "signal")
		alloc, cg := cgroupRunning(t, `trap 'echo int > `+out+`; exit 0' INT; while :; do sleep 0.1; done`, 2)
		k := rawExecKiller(t, alloc, "", 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := k.Stop(ctx, 3*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if b, err := os.ReadFile(out); err != nil || strings.TrimSpace(string(b)) != "int" {
			t.Errorf("the task did not handle SIGINT before it died (%q, %v)", b, err)
		}
		waitEmpty(t, cg, time.Second)
	})
	t.Run("ignores it: killed after the grace", func(t *testing.T) {
		alloc, cg := cgroupRunning(t, `trap '' INT TERM; while :; do sleep 0.1; done`, 2)
		k := rawExecKiller(t, alloc, "SIGTERM", 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		if err := k.Stop(ctx, 500*time.Millisecond); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(began); took < 450*time.Millisecond {
			t.Errorf("Stop took %s, want the 500ms grace first", took)
		}
		waitEmpty(t, cg, time.Second)
	})
}

// TestGatedKillerKillsARealCgroup proves dead a raw_exec task's processes,
// a setsid daemon that ignores SIGTERM included.
func TestGatedKillerKillsARealCgroup(t *testing.T) {
	alloc, cg := cgroupWithDaemon(t)
	env := gatedEnv{CgroupMode: cgroupslib.CG1, GateCgroup: cgroupslib.PathCG1(alloc, "gate", "freezer")}
	rec := planGated(alloc, []shim.GatedTask{{Name: "app", Driver: "raw_exec"}}, gatedAlloc(&api.Task{Name: "app", Driver: "raw_exec"}), env)
	k, err := newGatedKiller(rec, env)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.KillAll(ctx); err != nil {
		t.Fatalf("KillAll: %v", err)
	}
	if alive, err := cg.Alive(); alive || err != nil {
		t.Errorf("after KillAll the cgroup still has processes (err %v)", err)
	}
	if err := k.KillAll(ctx); err != nil {
		t.Errorf("a second KillAll: %v, want nil (nothing left to kill)", err)
	}
}

// TestWatchdogSeesADaemonInTheTaskCgroup: with no workload process group
// left (the leader gone), a daemon in the task cgroup still counts as the
// workload running, so the watchdog kills it.
func TestWatchdogSeesADaemonInTheTaskCgroup(t *testing.T) {
	_, cg := cgroupWithDaemon(t)
	h := &taskHandle{cgroup: cg}
	if !h.workloadAlive(0) {
		t.Fatal("workloadAlive(no group) = false with processes in the task cgroup")
	}
	if err := cg.KillAll(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if h.workloadAlive(0) {
		t.Error("workloadAlive = true with an empty task cgroup and no group")
	}
	if (&taskHandle{}).workloadAlive(0) {
		t.Error("workloadAlive = true without a task cgroup or group")
	}
}

// TestKeptGateLeaseOutlivesThePlugin: the lease a destroyed gate left held
// is found by a new plugin (a new gateLeases), once, and not past the
// moment the server may have expired it.
func TestKeptGateLeaseOutlivesThePlugin(t *testing.T) {
	root, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &drivers.TaskConfig{ID: "0b5d-1/gate/x", AllocID: "0b5d-1", Name: "gate"}
	dir, err := openTaskState(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &taskHandle{cfg: cfg, dir: dir, logger: hclog.NewNullLogger()}
	for _, f := range []struct {
		name string
		v    any
	}{
		{specFile, gateSpecFile(shim.GateSpec{AllocID: cfg.AllocID, Task: cfg.Name})},
		{leaseFile, heldLease{LockID: "lock-1", Fence: 7, TTL: 10 * time.Second, LockDelay: time.Second,
			LastRenewBoot: lockclient.BootNanos(lockclient.BootNow())}},
		{exitFile, exitStatus{}}, // a restart: stopped while its allocation runs on
	} {
		if err := writeJSON(dir, f.name, f.v); err != nil {
			t.Fatal(err)
		}
	}
	(&gateLeases{}).keep(h, root)
	if err := removeTaskState(root, cfg); err != nil {
		t.Fatal(err)
	}
	restarted := &gateLeases{}
	got := restarted.take(cfg, root)
	if got == nil || got.LockID != "lock-1" || got.Fence != 7 {
		t.Fatalf("after a plugin restart take = %+v, want lock-1 fence 7", got)
	}
	if again := restarted.take(cfg, root); again != nil {
		t.Errorf("a kept lease was taken twice: %+v", again)
	}

	// One past its time is forgotten.
	dir, err = openTaskState(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.dir = dir
	if err := writeJSON(dir, leaseFile, heldLease{LockID: "lock-2", Fence: 8, TTL: -time.Second}); err != nil {
		t.Fatal(err)
	}
	(&gateLeases{}).keep(h, root)
	if got := (&gateLeases{}).take(cfg, root); got != nil {
		t.Errorf("a kept lease past 2×TTL + delay was taken: %+v", got)
	}
}

// The gated tasks learn the slot their gate holds from nomad-lock.env.
func TestGateLockEnvNamesTheSlot(t *testing.T) {
	held := heldLease{Path: lockclient.SlotPath("nomad/jobs/j/g/gate/lock", 1), Fence: 42}
	got := gateLockEnv(held, "nomad/jobs/j/g/gate/lock", 2)
	want := "NOMAD_LOCK_PATH=nomad/jobs/j/g/gate/lock/slot-1\nNOMAD_LOCK_FENCE=42\nNOMAD_LOCK_SLOT=1\n"
	if got != want {
		t.Errorf("semaphore: %q, want %q", got, want)
	}
	single := gateLockEnv(heldLease{Path: "nomad/jobs/j/g/gate/lock", Fence: 7}, "nomad/jobs/j/g/gate/lock", 0)
	if single != "NOMAD_LOCK_PATH=nomad/jobs/j/g/gate/lock\nNOMAD_LOCK_FENCE=7\n" {
		t.Errorf("single lock: %q", single)
	}
}
