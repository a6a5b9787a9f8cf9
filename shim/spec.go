package shim

import (
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// SpecVersion is the version of Spec's serialised form (encoding/json).
// A front end that keeps a Spec across its own upgrades (the driver, in
// its task state) records the version it wrote, and reads an older one
// through a converter of its own, or refuses it naming the way out.
const SpecVersion = 2

// Spec is one supervised run, whole and serialisable: the lock settings and
// the workload (Config), what the run attaches besides (a gate, the watch of
// its allocation) and the lock's holder record. A front end builds it once
// (lock from its flags and -config file, the driver from the task config)
// and the supervisor reads it unchanged: the driver writes it into the
// task's state and its supervisor reads it back, so a new lock setting is
// one row of LockSettings and one Config field, never copied by hand.
type Spec struct {
	// Version is SpecVersion when the Spec was written.
	Version int
	Config
	// Gate makes the run hold the lock for the other tasks of its
	// allocation (the driver's `gate = true`); nil for none. A gate's
	// Config.Command may be empty.
	Gate *GateSpec `json:",omitempty"`
	// WatchAlloc ends the wait for the lock when the run's allocation is
	// being stopped (the driver's start = "on_lock"); nil for none. A gate
	// watches its allocation anyway.
	WatchAlloc *AllocWatch `json:",omitempty"`
	// Holder is the lock's holder record: who takes the lock (NewLocker
	// adds the upstream).
	Holder lockclient.Holder
}

// GateSpec names a gate's own task (from Nomad, never from the task
// environment), and the lease its previous run left it, if any: see Gate.
type GateSpec struct {
	AllocID, Task, Namespace string
	// Adopt is the lease a previous run of this gate, in this allocation,
	// left held (Nomad restarted the gate): the gate renews it instead of
	// acquiring, so its gated tasks, which may run on, never lose cover.
	Adopt *AdoptLease `json:",omitempty"`
}

// AdoptLease names a lease to take over: its lock ID and fencing token,
// and the lock it holds (for a semaphore, its slot's path; "" is the
// gate's lock path).
type AdoptLease struct {
	LockID string
	Fence  uint64
	Path   string `json:",omitempty"`
	// FenceBoot and StopBoot, when set, are the previous run's fence and
	// stop deadlines (CLOCK_BOOTTIME ns, lockclient.BootNanos). The lease
	// may be taken over only before FenceBoot (lease mode: D after its last
	// acknowledged heartbeat): past it the gated tasks, which ran on under
	// it, have no one to stop them should the lock be lost, and the plugin
	// kills them, gracefully where StopBoot leaves the time.
	FenceBoot int64 `json:",omitempty"`
	StopBoot  int64 `json:",omitempty"`
}

// Validate checks everything that can be checked without Nomad: the
// config as a run of its kind (a gate needs no command of its own), and
// what a gate adds to lease mode.
func (s Spec) Validate() error { return s.Config.validate(s.Gate != nil) }

// Heartbeat is lease mode's heartbeat for the run (see Config's): a
// gate's lease_kill_grace is at least GateLeaseKillGrace. nil outside
// lease mode.
func (s Spec) Heartbeat() *lockclient.Heartbeat { return s.Config.heartbeat(s.Gate != nil) }
