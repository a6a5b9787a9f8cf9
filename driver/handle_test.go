package driver

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// In lease mode a standby may release the lock 1 s after the stop deadline
// the holder published (lease_fence + lease_kill_grace after its last
// heartbeat, plus lockclient.TakeoverMargin): the watchdog kills a task
// whose supervisor let that deadline pass well inside that second, in
// whatever state it was last heard of (frozen while holding, or in a
// graceful stop), a daemon in the task cgroup included; and not before it,
// so the workload keeps its kill grace after a fence. A lock-mode task
// keeps the longer grace (the server expires a lock a TTL later).
func TestWatchdogLeaseModeActsInsideTheTakeoverMargin(t *testing.T) {
	late := 400 * time.Millisecond // past the lease grace, inside the lock-mode one
	tests := []struct {
		name  string
		lease bool
		st    func(now int64) supervisorStatus
		kills bool
	}{
		{"lease mode, stopping past the stop deadline", true, func(now int64) supervisorStatus {
			return supervisorStatus{State: string(shim.StateStopping), StopDeadlineBoot: now - int64(late)}
		}, true},
		{"lease mode, holding past the stop deadline", true, func(now int64) supervisorStatus {
			return supervisorStatus{State: string(shim.StateHolding), FenceDeadlineBoot: now - int64(late) - int64(2*time.Second),
				StopDeadlineBoot: now - int64(late)}
		}, true},
		{"lease mode, holding past the fence deadline, inside the kill grace", true, func(now int64) supervisorStatus {
			return supervisorStatus{State: string(shim.StateHolding), FenceDeadlineBoot: now - int64(late),
				StopDeadlineBoot: now + int64(time.Minute)}
		}, false},
		{"lock mode, stopping as late", false, func(now int64) supervisorStatus {
			return supervisorStatus{State: string(shim.StateStopping), StopDeadlineBoot: now - int64(late)}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, cg := cgroupWithDaemon(t)
			d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
			h := &taskHandle{cfg: &drivers.TaskConfig{ID: "a/app/1", Name: "app", AllocID: "a"}, cgroup: cg, lease: tc.lease,
				logger: hclog.NewNullLogger(), status: tc.st(bootNow())}
			d.watchdog(h)
			wait := time.Second // the watchdog's kill starts at once, or not at all
			if tc.kills {
				wait = 10 * time.Second
			}
			dead := waitCgroupEmpty(cg, wait)
			if dead != tc.kills {
				t.Fatalf("task cgroup emptied = %v, want %v (the watchdog's grace)", dead, tc.kills)
			}
		})
	}
}

// waitCgroupEmpty reports whether cg has no process left, within timeout.
func waitCgroupEmpty(cg *taskCgroup, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if alive, err := cg.Alive(); err == nil && !alive {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// The watchdog asks for a kill on every tick while the workload lives;
// one kill of the task cgroup runs at a time, not one more per tick.
func TestKillTaskRunsOneCgroupKillAtATime(t *testing.T) {
	_, cg := cgroupWithDaemon(t)
	h := &taskHandle{cgroup: cg, logger: hclog.NewNullLogger()}
	most := 0
	for range 30 {
		h.killTask()
		most = max(most, goroutinesIn("(*taskHandle).killTask.func"))
	}
	if !waitCgroupEmpty(cg, 10*time.Second) {
		t.Fatal("the task cgroup was not killed")
	}
	if most > 1 {
		t.Fatalf("%d cgroup kills ran at once, want one at a time", most)
	}
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}
