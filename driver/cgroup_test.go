package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/drivers"
)

func TestMemoryLimitsMatchTheExecutor(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name                  string
		memory, max           int64
		wantHard, wantReserve int64
	}{
		{"memory alone is the hard limit", 256, 0, 256 * mb, 0},
		{"memory_max is the hard limit, memory the reserve", 256, 1024, 1024 * mb, 256 * mb},
		{"memory_max = -1 is no hard limit, memory the reserve", 256, -1, -1, 256 * mb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hard, reserve := memoryLimits(tc.memory, tc.max)
			if hard != tc.wantHard || reserve != tc.wantReserve {
				t.Errorf("memoryLimits(%d, %d) = %d, %d; want %d, %d", tc.memory, tc.max, hard, reserve, tc.wantHard, tc.wantReserve)
			}
		})
	}
}

// fakeResources is a task's resources as Nomad passes them to a driver.
func fakeResources(memory, memoryMax, shares int64, cores string) *drivers.Resources {
	return &drivers.Resources{
		NomadResources: &structs.AllocatedTaskResources{
			Memory: structs.AllocatedMemoryResources{MemoryMB: memory, MemoryMaxMB: memoryMax},
		},
		LinuxResources: &drivers.LinuxResources{CPUShares: shares, CpusetCpus: cores},
	}
}

// readTree reads every file below root into a map keyed by relative path.
func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		out[rel] = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestApplyLimitsV2 writes into a fake unified cgroup (a temp dir standing
// for /sys/fs/cgroup/nomad.slice/share.slice/<alloc>.<task>.scope).
func TestApplyLimitsV2(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  *drivers.Resources
		want map[string]string
	}{
		{"memory is the hard limit", fakeResources(256, 0, 100, ""),
			map[string]string{"memory.max": "268435456", "cpu.weight": "4"}},
		{"memory_max raises the hard limit, memory is kept as memory.low", fakeResources(256, 512, 100, ""),
			map[string]string{"memory.max": "536870912", "memory.low": "268435456", "cpu.weight": "4"}},
		{"memory_max = -1: no hard limit", fakeResources(256, -1, 1024, ""),
			map[string]string{"memory.max": "max", "memory.low": "268435456", "cpu.weight": "39"}},
		{"resources.cores sets cpuset.cpus", fakeResources(128, 0, 1024, "2,3"),
			map[string]string{"memory.max": "134217728", "cpu.weight": "39", "cpuset.cpus": "2,3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cg := &taskCgroup{mode: cgroupslib.CG2, path: dir}
			if err := cg.applyLimits(tc.res); err != nil {
				t.Fatal(err)
			}
			got := readTree(t, dir)
			if len(got) != len(tc.want) {
				t.Errorf("wrote %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestApplyLimitsV1 writes into a fake v1 hierarchy: one dir per
// controller, the task's cgroup at <controller>/nomad/<alloc>.<task>.
func TestApplyLimitsV1(t *testing.T) {
	root := t.TempDir()
	const task = "a1.web"
	for _, ctl := range []string{"freezer", "memory", "cpu", "cpuset"} {
		if err := os.MkdirAll(filepath.Join(root, ctl, "nomad", task), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg := &taskCgroup{mode: cgroupslib.CG1, path: filepath.Join(root, "freezer", "nomad", task),
		cpuset: filepath.Join(root, "cpuset", "nomad", task)}
	if err := cg.applyLimits(fakeResources(256, -1, 100, "1")); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"memory/nomad/a1.web/memory.limit_in_bytes":      "-1",
		"memory/nomad/a1.web/memory.soft_limit_in_bytes": "268435456",
		"cpu/nomad/a1.web/cpu.shares":                    "100",
		"cpuset/nomad/a1.web/cpuset.cpus":                "1",
	}
	got := readTree(t, root)
	if len(got) != len(want) {
		t.Errorf("wrote %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestOOMKillsReadsBothVersions(t *testing.T) {
	v2 := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(v2, "memory.events"), "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
	v1 := t.TempDir()
	write(filepath.Join(v1, "memory", "nomad", "a1.web", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
	for _, tc := range []struct {
		cg   *taskCgroup
		want uint64
	}{
		{&taskCgroup{mode: cgroupslib.CG2, path: v2}, 2},
		{&taskCgroup{mode: cgroupslib.CG1, path: filepath.Join(v1, "freezer", "nomad", "a1.web")}, 5},
	} {
		n, err := tc.cg.oomKills()
		if err != nil || n != tc.want {
			t.Errorf("oomKills(%s) = %d, %v; want %d", tc.cg.path, n, err, tc.want)
		}
		before := tc.want - 1
		if !tc.cg.oomKilledSince(&before) {
			t.Errorf("oomKilledSince(%d) with %d kills = false", before, tc.want)
		}
		if tc.cg.oomKilledSince(&tc.want) || tc.cg.oomKilledSince(nil) {
			t.Errorf("oomKilledSince reports a kill that did not happen (or an unknown start)")
		}
	}
	old := &taskCgroup{mode: cgroupslib.CG2, path: t.TempDir()}
	write(filepath.Join(old.path, "memory.events"), "low 0\nhigh 0\nmax 0\noom 0\n")
	if _, err := old.oomKills(); err == nil || !strings.Contains(err.Error(), "4.13") {
		t.Errorf("oomKills without an oom_kill line = %v, want an error naming the kernel version", err)
	}
}
