package shim

import "context"

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
	// KillAll freezes and SIGKILLs every process of every task in Direct,
	// so that no code of theirs runs again, and returns nil only once each
	// is proven gone. It is safe to call more than once.
	KillAll(ctx context.Context) error
}

// GatedTasksFunc builds the GatedTasks of an allocation once the gate has
// read its gated tasks.
type GatedTasksFunc func(allocID string, tasks []GatedTask) (GatedTasks, error)
