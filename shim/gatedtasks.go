package shim

import (
	"context"
	"time"
)

// GatedTask is one task a gate holds the lock for, as its allocation names
// it: the task's name and its driver.
type GatedTask struct {
	Name, Driver string
}

// GatedTasks kills and proves dead, by itself, the gated tasks of one
// allocation, without waiting for Nomad's client (whose pre-kill hooks, the
// group's shutdown_delay and service deregistration among them, can delay a
// kill by tens of seconds). It is built by the driver, which knows where
// each task driver keeps its processes (Docker containers by Nomad's own
// labels, exec and raw_exec tasks by their cgroups), and reaches the gate
// through Gate.Killer.
type GatedTasks interface {
	// Direct names the gated tasks it can kill and prove dead itself. The
	// others are left to Nomad's client, bounded by the server's expiry.
	Direct() []string
	// WhyLeft says why task is left to Nomad ("" when it is Direct, or
	// when there is nothing to say), naming the setting that would change
	// it.
	WhyLeft(task string) string
	// Stop stops every task in Direct that runs: its kill_signal first,
	// then, once it has exited or has had its kill_timeout or grace,
	// whichever is shorter, freeze and SIGKILL of every process of it, so
	// that no code of theirs runs again. grace <= 0 freezes and SIGKILLs at
	// once. It returns nil only once each is proven gone; ctx bounds it
	// all. It is safe to call more than once.
	Stop(ctx context.Context, grace time.Duration) error
}

// GatedTasksFunc builds the GatedTasks of an allocation once the gate has
// read its gated tasks.
type GatedTasksFunc func(allocID string, tasks []GatedTask) (GatedTasks, error)
