package driver

import (
	"testing"

	"github.com/hashicorp/nomad/client/lib/cgroupslib"
)

// The supervisor returns to its own cgroup in each hierarchy it joined for
// the workload's fork.
func TestOwnProcsFile(t *testing.T) {
	v1 := []byte("12:pids:/system.slice/nomad.service\n4:cpu,cpuacct:/system.slice/nomad.service\n" +
		"9:memory:/system.slice/nomad.service\n3:freezer:/\n2:cpuset:/\n0::/system.slice/nomad.service\n")
	for task, want := range map[string]string{
		"/sys/fs/cgroup/cpu/nomad/a.t/cgroup.procs":           "/sys/fs/cgroup/cpu/system.slice/nomad.service/cgroup.procs",
		"/sys/fs/cgroup/memory/nomad/a.t/cgroup.procs":        "/sys/fs/cgroup/memory/system.slice/nomad.service/cgroup.procs",
		"/sys/fs/cgroup/freezer/nomad/a.t/cgroup.procs":       "/sys/fs/cgroup/freezer/cgroup.procs",
		"/sys/fs/cgroup/cpuset/nomad/shared/a.t/cgroup.procs": "/sys/fs/cgroup/cpuset/cgroup.procs",
	} {
		if got, err := ownProcsFile(v1, task, cgroupslib.CG1); err != nil || got != want {
			t.Errorf("v1 %s: %q, %v; want %q", task, got, err, want)
		}
	}
	if _, err := ownProcsFile(v1, "/sys/fs/cgroup/blkio/nomad/a.t/cgroup.procs", cgroupslib.CG1); err == nil {
		t.Error("a hierarchy we are not in was accepted")
	}
	v2 := []byte("0::/nomad.slice/agent.scope\n")
	got, err := ownProcsFile(v2, "/sys/fs/cgroup/nomad.slice/share.slice/a.t.scope/cgroup.procs", cgroupslib.CG2)
	if err != nil || got != "/sys/fs/cgroup/nomad.slice/agent.scope/cgroup.procs" {
		t.Errorf("v2: %q, %v", got, err)
	}
}
