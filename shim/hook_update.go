package shim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
)

// DefaultUpdateGrace is how long an old-version standby gives way to a
// newer version of its group before it takes a lock that came free
// (update_grace; docs/updates.md).
const DefaultUpdateGrace = 10 * time.Second

// updateHook makes a standby of an older job version give way to a newer
// one during a rolling update. Nomad replaces the allocations of a group
// lowest name index first, so the holder of the lock is often stopped
// before its standbys: without this, an old-version standby takes the
// lock, and hands it over again when it is replaced in turn.
//
// When the lock looks free, the hook reads the task's own allocation and
// its job's allocations (read-job on the namespace). An allocation that is
// being stopped never takes the lock. One of an older version than a
// successor (standbySuccessor) waits up to the grace for it to take the
// lock, and then takes it anyway if it is still free: a broken new version
// costs the grace, never two holders (the lock decides, as always).
// Without read-job it does as before, and says so once.
type updateHook struct {
	allocs                      *allocs.Reader
	emit                        Emitter
	log                         hclog.Logger
	allocID, jobID, group, task string
	namespace                   string
	grace                       time.Duration
	// off is set once the allocations cannot be read for good (no
	// read-job): the standby then takes the lock as soon as it is free.
	off bool
	// told is the successor last announced, so each is told once.
	told string
	// serves: the run has a workload of its own that a delayed stop keeps
	// serving (a gate with no command has none: Nomad killed its gated
	// tasks before it stops the gate).
	serves bool
}

// newUpdateHook attaches to a run of a task of a Nomad allocation (its
// holder names the allocation, job, group and task); nil otherwise, and nil
// when update_grace = 0 turns the rule off. getenv reads the task
// environment.
func newUpdateHook(cfg Config, holder lockclient.Holder, serves bool, getenv func(string) string) *updateHook {
	h := holder
	if h.AllocID == "" || h.JobID == "" || h.Group == "" || h.Task == "" || cfg.UpdateGrace < 0 {
		return nil
	}
	// The task's namespace: the driver's supervisor (root beside a task it
	// does not trust: RootSecretsDir) has it from Nomad's task config, and
	// never from the task's environment, which the job's env block can set;
	// lock, which runs as the task, has only its environment.
	ns := cfg.Namespace
	if cfg.RootSecretsDir == "" {
		ns = cmp.Or(getenv("NOMAD_NAMESPACE"), ns)
	}
	grace := cfg.UpdateGrace
	if grace == 0 {
		grace = DefaultUpdateGrace
	}
	return &updateHook{allocID: h.AllocID, jobID: h.JobID, group: h.Group, task: h.Task, namespace: ns, grace: grace, serves: serves}
}

func (h *updateHook) Name() string { return "update" }

// PreAcquire makes the acquire give way (deferTo).
func (h *updateHook) PreAcquire(_ context.Context, resp *PreAcquireResponse) error {
	resp.AddDefer(h.deferTo)
	return nil
}

// Stopping keeps the workload serving a while after a stop request of a
// rolling update (delayStop).
func (h *updateHook) Stopping(ctx context.Context, req StoppingRequest, resp *StoppingResponse) {
	if req.End != EndStopRequest || req.Budget <= 0 {
		return
	}
	if c := h.delayStop(ctx, req.Budget); c != nil {
		resp.Delay = c
	}
}

// deferTo is the acquire's Defer: hold while our allocation is being
// stopped, the grace while a successor of a newer version is on its way.
func (h *updateHook) deferTo(ctx context.Context, _ lockclient.Holder) (time.Duration, bool) {
	if h.off {
		return 0, false
	}
	l := h.allocs
	self, _, err := l.Allocation(ctx, h.allocID, h.namespace, 0)
	if err != nil {
		h.readFailed(err)
		return 0, false
	}
	if standbyStopping(self) {
		h.log.Info("the lock is free but this allocation is being stopped: not taking it", "desired", self.DesiredStatus)
		return 0, true
	}
	stubs, _, err := l.JobAllocations(ctx, h.jobID, h.namespace, 0)
	if err != nil {
		h.readFailed(err)
		return 0, false
	}
	succ := standbySuccessor(self, stubs, h.task)
	if succ == nil {
		h.log.Info("lock free: no newer version of the group on its way", "allocations", describeStubs(stubs, h.task))
		return 0, false
	}
	if h.told != succ.ID {
		h.told = succ.ID
		h.log.Info("lock free: giving way to a newer version of the group", "successor", succ.ID, "version", succ.JobVersion, "grace", h.grace)
		h.emit.Notice(Event{State: StateWaiting, Message: updateGivingWayMessage(h.grace, shortAlloc(succ.ID), succ.JobVersion)})
	}
	return h.grace, false
}

// readFailed turns the hook off, with one event, when the identity may not
// read the allocations; other errors only cost this attempt's deferral.
func (h *updateHook) readFailed(err error) {
	var pe *allocs.PermissionError
	if !errors.As(err, &pe) && !errors.Is(err, allocs.ErrHidden) {
		h.log.Warn("rolling updates: cannot read the allocations, not giving way this time", "error", err)
		return
	}
	h.off = true
	h.log.Warn("rolling updates: the task's identity may not read its job's allocations", "error", err)
	h.emit.Notice(Event{State: StateWaiting, Message: updateNoReadJobMessage(h.jobID, nsOrDefault(h.namespace))})
}

func nsOrDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

func shortAlloc(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// standbyStopping reports whether the servers want alloc stopped (or
// evicted): such a standby never takes the lock.
func standbyStopping(alloc *api.Allocation) bool {
	return alloc.DesiredStatus != "" && alloc.DesiredStatus != "run"
}

// allocVersion is the job version alloc runs.
func allocVersion(alloc *api.Allocation) (uint64, bool) {
	if alloc.Job == nil || alloc.Job.Version == nil {
		return 0, false
	}
	return *alloc.Job.Version, true
}

// standbySuccessor is the allocation that self, a standby about to take a
// free lock, gives way to: one of the same group and a newer job version
// (so self's version is older than the job's latest), that the servers want
// running, and that is on its way to the lock: placed (pending: a
// replacement waits for the allocation it replaces to finish, see
// docs/updates.md) or running its task task. An allocation whose node is
// down is lost or unknown, not pending or running. The newest such wins;
// nil for none.
func standbySuccessor(self *api.Allocation, stubs []*api.AllocationListStub, task string) *api.AllocationListStub {
	mine, ok := allocVersion(self)
	if !ok {
		return nil
	}
	var best *api.AllocationListStub
	for _, a := range stubs {
		if a.ID == self.ID || a.TaskGroup != self.TaskGroup || a.JobVersion <= mine || a.DesiredStatus != "run" {
			continue
		}
		switch a.ClientStatus {
		case "pending":
		case "running":
			if st := a.TaskStates[task]; st != nil && st.State == "dead" {
				continue
			}
		default:
			continue
		}
		if best == nil || a.JobVersion > best.JobVersion {
			best = a
		}
	}
	return best
}

// Release marks the release clean once the workload is proven dead: the
// mark is what tells a standby whose token is not shown the lock's state
// (any token under ACLs) that the lock is free, so that an old-version
// standby gives way to a new version then too.
func (h *updateHook) Release(_ context.Context, req ReleaseRequest, resp *ReleaseResponse) {
	if req.Proven {
		resp.MarkClean = true
	}
}

func (h *updateHook) Released(error) {}

// describeStubs sums allocations up for a log line.
func describeStubs(stubs []*api.AllocationListStub, task string) string {
	var b strings.Builder
	for _, a := range stubs {
		st := ""
		if ts := a.TaskStates[task]; ts != nil {
			st = ts.State
		}
		fmt.Fprintf(&b, "%s:%s:v%d:%s/%s/%s ", shortAlloc(a.ID), a.TaskGroup, a.JobVersion, a.DesiredStatus, a.ClientStatus, st)
	}
	return b.String()
}

// statusAllocUpdating is the DesiredDescription the scheduler gives an
// allocation it stops to replace it in a rolling update
// (scheduler/structs/const.go, StatusAllocUpdating, set by
// computeDestructiveUpdates). A stop for any other reason (job stopped,
// scale-down, drain, canary promotion's "alloc not needed due to job
// update") does not delay.
const statusAllocUpdating = "alloc is being updated due to job update"

// updateStop reports whether alloc is being stopped to be replaced in a
// rolling update.
func updateStop(alloc *api.Allocation) bool {
	return alloc.DesiredStatus == "stop" && alloc.DesiredDescription == statusAllocUpdating
}

// delayStop keeps the holder's workload serving, the lock held, after a
// stop request of a rolling update, until a newer version of the group
// waits for the lock, for up to budget: the lock then goes from a running
// workload straight to a waiting one. It waits only while such an
// allocation is on its way and is not this allocation's own replacement
// (Nomad starts a replacement only once the allocation it replaces is
// terminal: client/allocwatcher), so with max_parallel = 1 it never
// waits; it does with max_parallel >= 2 or max_parallel = 0, where the
// other replacements start while the holder is stopping. A crash or a node
// death sends no stop request; any other stop does not wait.
func (h *updateHook) delayStop(ctx context.Context, budget time.Duration) <-chan string {
	if h.off || !h.serves {
		return nil
	}
	out := make(chan string, 1)
	go func() {
		defer close(out)
		send := func(msg string) {
			select {
			case out <- msg:
			case <-ctx.Done():
			}
		}
		wctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		h.awaitSuccessor(wctx, budget, send)
	}()
	return out
}

// awaitSuccessor returns once a newer version waits for the lock (after
// sending an event), nothing newer is on its way, or ctx ends.
func (h *updateHook) awaitSuccessor(ctx context.Context, budget time.Duration, send func(string)) {
	l := h.allocs
	// Every stop asks first why it came, briefly: a client cut off from
	// the servers (whose own stop_on_client_after stops may come then)
	// must not hold a stop up for the whole budget.
	rctx, cancel := context.WithTimeout(ctx, min(budget, selfReadBound))
	self, _, err := l.Allocation(rctx, h.allocID, h.namespace, 0)
	cancel()
	if err != nil {
		h.log.Warn("stop: cannot read this allocation, stopping at once", "error", err)
		return
	}
	if !updateStop(self) {
		return
	}
	began := time.Now()
	var index uint64
	var told string
	for {
		stubs, idx, err := l.JobAllocations(ctx, h.jobID, h.namespace, index)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			h.log.Warn("stop: cannot read the job's allocations", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		succ, waiting := holderSuccessor(self, stubs, h.task)
		switch {
		case succ == nil:
			h.log.Info("stopped for a rolling update: no newer version on its way but this allocation's own replacement, stopping now",
				"allocations", describeStubs(stubs, h.task))
			if told != "" {
				send(updateSuccessorGoneMessage(time.Since(began).Round(time.Millisecond)))
			}
			return
		case waiting:
			h.log.Info("stopped for a rolling update: a newer version waits for the lock, stopping now", "successor", succ.ID)
			send(updateSuccessorWaitingMessage(shortAlloc(succ.ID), succ.JobVersion, time.Since(began).Round(time.Millisecond)))
			return
		}
		if told == "" {
			told = succ.ID
			h.log.Info("stopped for a rolling update: keeping the workload running until a newer version waits", "successor", succ.ID, "budget", budget)
			send(updateKeepServingMessage(budget, shortAlloc(succ.ID), succ.JobVersion))
		}
		index = idx
	}
	h.log.Info("stopped for a rolling update: no newer version waits after the budget, stopping now", "budget", budget)
	if told != "" {
		send(updateSuccessorLateMessage(budget))
	}
}

// holderSuccessor is the allocation a holder stopped for a rolling update
// waits for: one of its group, of a newer job version, that the servers
// want running, on its way (pending, or running its task task), and that
// is not the holder's own replacement (NextAllocation), which Nomad starts
// only once the holder's allocation is terminal. waiting is true when it
// waits for the lock: it said so in an event (its acquire found the lock
// held, so it is parked on the lock's blocking query), or its task has run
// for runningSettle. A
// waiting one wins; nil when none is on its way.
func holderSuccessor(self *api.Allocation, stubs []*api.AllocationListStub, task string) (*api.AllocationListStub, bool) {
	mine, ok := allocVersion(self)
	if !ok {
		return nil, false
	}
	next := map[string]bool{}
	if self.NextAllocation != "" {
		next[self.NextAllocation] = true
	}
	for _, a := range stubs {
		if a.ID == self.ID && a.NextAllocation != "" {
			next[a.NextAllocation] = true
		}
	}
	var onWay *api.AllocationListStub
	for _, a := range stubs {
		if a.ID == self.ID || next[a.ID] || a.TaskGroup != self.TaskGroup || a.JobVersion <= mine || a.DesiredStatus != "run" {
			continue
		}
		st := a.TaskStates[task]
		switch a.ClientStatus {
		case "pending":
			if st != nil && waitsForLock(st) {
				return a, true
			}
		case "running":
			if st == nil {
				break
			}
			if st.State == "dead" {
				continue
			}
			if waitsForLock(st) || (st.State == "running" && !st.StartedAt.IsZero() && time.Since(st.StartedAt) >= runningSettle) {
				return a, true
			}
		default:
			continue
		}
		if onWay == nil {
			onWay = a
		}
	}
	return onWay, false
}

// selfReadBound caps the read of its own allocation that a stopped holder
// makes to learn whether the stop is a rolling update's.
const selfReadBound = 2 * time.Second

// runningSettle is how long a successor's task must have run to count as
// waiting for the lock without its event saying so (an event list that
// Nomad truncated). A task that has just started may still be starting
// its supervisor: releasing to it then lets the holder's own replacement
// race it.
const runningSettle = 5 * time.Second

// waitsForLock reports whether the task said, in its latest event of ours,
// that it waits for a held lock.
func waitsForLock(st *api.TaskState) bool {
	for i := len(st.Events) - 1; i >= 0; i-- {
		ev := st.Events[i]
		for _, m := range []string{ev.DisplayMessage, ev.Message, ev.DriverMessage} {
			if strings.HasPrefix(m, evWaitingHeld.Prefix) {
				return true
			}
		}
	}
	return false
}
