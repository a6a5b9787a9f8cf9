package shim

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
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

// GatedTasksFunc builds the GatedTasks of the gate's allocation, as the
// gate read it at start, for its gated tasks.
type GatedTasksFunc func(alloc *api.Allocation, tasks []GatedTask) (GatedTasks, error)

// A gate kills its gated tasks itself, and proves them dead, on every
// Ending but Nomad's own stop of its allocation: its lock lost (409, 404,
// its fence deadline passed), a signal, a failed LB ADD, a gate command
// that ended, a stop that raced a stop of the allocation. It does so before
// it exits and before the lock can pass: Nomad's own kill of them, which
// follows the gate's failure, comes only after the group's shutdown_delay
// and, on a client cut off from the servers, after its services'
// deregistration gives up. Those it cannot kill (GatedTasks.Direct does
// not name them: drivers other than docker, exec, raw_exec and java: exec2, podman, qemu…)
// are left to Nomad, within the bound checkGateJob checks. Nomad's own
// stop of the allocation stays Nomad's: the gated tasks get their
// kill_signal, kill_timeout and shutdown_delays.

// gatedWorkload is a gate's gated tasks, as the run's Workload: Nomad
// starts, stops and restarts them, so the core has no process to start,
// signal or wait for; what it needs of them is the time their kill takes
// (KillBound). Their kill, by the gate itself, is the gate's to decide at
// the release by its rule (gateHook.Release, docs/gate.md), not the
// core's KillAll.
type gatedWorkload struct {
	// adopted: the run took its previous run's lease over (a restart of
	// the gate), and the gated tasks run on.
	adopted bool
	// lease: the gate's lock is in lease mode (docs/lease.md): every gated
	// task must be one it kills itself, dead by lease_fence +
	// lease_kill_grace after its last acknowledged heartbeat.
	lease bool
	// build, when set, builds at start the GatedTasks that kill and prove
	// dead, by the gate itself, those of its gated tasks that it can (the
	// driver's docker containers and task cgroups).
	build GatedTasksFunc
	log   hclog.Logger
	emit  Emitter

	// gated are the tasks the gate holds the lock for, found at start.
	gated []string
	// killBound is the longest the gated tasks may take to die once the
	// gate has failed, found at start: the group's shutdown_delay + the
	// task's kill_timeout + shutdown_delay for those Nomad kills, the
	// gate's own kill (gateKillAllTimeout) for the others.
	killBound time.Duration
	// killer and direct are what build built: nil and empty without one,
	// or when it kills none of the gated tasks; planned is what it built
	// in any case, which says why a task is left to Nomad.
	killer, planned GatedTasks
	direct          []string
	// tasks are the gated tasks with their drivers; killerErr why build
	// failed, if it did.
	tasks     []GatedTask
	killerErr error
	// killedAt is when the gate began its first kill of its gated tasks
	// (zero: none): Nomad's restarts scheduled from then on are that
	// kill's (see GatedPending).
	killedAt time.Time
}

// plan builds the gate's GatedTasks (gatedWorkload.build) for the gated
// tasks of alloc, the gate task gate's allocation, and returns the set of
// those it kills itself.
func (w *gatedWorkload) plan(alloc *api.Allocation, gate string) map[string]bool {
	w.tasks = GatedTasksOf(alloc, gate)
	w.killer, w.planned, w.direct, w.killerErr = nil, nil, nil, nil
	if w.build == nil || len(w.tasks) == 0 {
		return nil
	}
	k, err := w.build(alloc, w.tasks)
	if err != nil {
		w.log.Warn("gate: cannot kill the gated tasks itself; Nomad kills them", "error", err)
		w.killerErr = err
		return nil
	}
	if k == nil {
		return nil
	}
	w.planned = k
	direct := map[string]bool{}
	for _, name := range k.Direct() {
		if slices.ContainsFunc(w.tasks, func(t GatedTask) bool { return t.Name == name }) {
			direct[name] = true
		}
	}
	if len(direct) == 0 {
		return nil
	}
	w.killer = k
	for _, t := range w.tasks {
		if direct[t.Name] {
			w.direct = append(w.direct, t.Name)
		}
	}
	return direct
}

// allDirect reports whether the gate kills every gated task itself.
func (w *gatedWorkload) allDirect() bool {
	return w.killer != nil && len(w.direct) == len(w.gated) && len(w.gated) > 0
}

// whyLeft says why the gate leaves task to Nomad, as its killer knows
// ("" if it says nothing).
func (w *gatedWorkload) whyLeft(task string) string {
	if w.planned == nil {
		return ""
	}
	return w.planned.WhyLeft(task)
}

// notDirectWhy says why the gate does not kill gated task task itself.
func (w *gatedWorkload) notDirectWhy(task string) string {
	switch {
	case w.killerErr != nil:
		return w.killerErr.Error()
	case w.build == nil:
		return "no direct kill on this client"
	case w.whyLeft(task) != "":
		return w.whyLeft(task)
	}
	return "see the gate's start event for why"
}

// driverOf is the driver of a task of the gate's group, as the gate found
// it at start (task's own otherwise).
func (w *gatedWorkload) driverOf(task *api.Task) string {
	for _, t := range w.tasks {
		if t.Name == task.Name {
			return t.Driver
		}
	}
	return task.Driver
}

// leftToNomad lists the gated tasks the gate does not kill itself.
func (w *gatedWorkload) leftToNomad() []string {
	var out []string
	for _, name := range w.gated {
		if !slices.Contains(w.direct, name) {
			out = append(out, name)
		}
	}
	return out
}

// gateKillReserve is what a graceful stop of the gated tasks leaves,
// before the lease's stop deadline, for their SIGKILL and its proof.
const gateKillReserve = time.Second

// kill stops and proves dead the gated tasks the gate kills itself. Each
// gets its kill_signal and its kill_timeout, cut to what the lease's stop
// deadline leaves (lock mode: before the server can expire the lock, the
// fence deadline after a 409; lease mode: lease_fence + lease_kill_grace
// after the last heartbeat), then SIGKILL. The kill itself is never
// bounded by that deadline: every attempt gets a budget of its own, and a
// failed one is retried, past the deadline too, for gateKillRetryFor; once
// the gate has exited, the plugin's warden goes on. It reports whether
// they are all proven dead (true when there are none). An empty why proves
// them dead without an event unless that fails (Nomad stopped them first,
// as far as the gate knows).
func (w *gatedWorkload) kill(lease *lockclient.Lease, why string) bool {
	if w.killer == nil {
		return true
	}
	grace := lockclient.BootUntil(lease.StopDeadline()) - gateKillReserve
	w.log.Info("gate: killing the gated tasks itself", "tasks", strings.Join(w.direct, ","), "why", why, "grace", max(grace, 0).Round(time.Millisecond))
	began := lockclient.BootNow()
	if w.killedAt.IsZero() {
		w.killedAt = time.Now() // wall clock, as Nomad's task events on this host
	}
	var err error
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), gateKillAllTimeout+max(grace, 0))
		err = w.killer.Stop(ctx, grace)
		cancel()
		if err == nil {
			w.log.Info("gate: the gated tasks are proven dead", "tasks", strings.Join(w.direct, ","))
			if why != "" {
				w.emit.Emit(stoppingEvent(lease, gateKilledMessage(w.direct, why)))
			}
			return true
		}
		w.log.Error("gate: cannot prove the gated tasks dead", "error", err, "attempt", attempt+1)
		grace = 0
		if lockclient.BootNow().Sub(began) >= gateKillRetryFor {
			break
		}
		time.Sleep(gateKillRetryEvery)
	}
	w.emit.Emit(stoppingEvent(lease, gateKillUnprovenMessage(w.direct, err)))
	return false
}

// gateKillRetryFor bounds the gate's retries of a kill that fails; the
// plugin's warden retries once the gate has exited. gateKillRetryEvery is
// the pause between two attempts.
var gateKillRetryFor = 2 * gateKillAllTimeout

const gateKillRetryEvery = 500 * time.Millisecond

// stoppingEvent is a stopping event with the lease's deadlines and last
// renew, which the plugin's watchdog, crash release and kept leases read.
func stoppingEvent(lease *lockclient.Lease, msg string) Event {
	return leaseEvent(StateStopping, lease, msg)
}

// leaseEvent is an event of state with the lease's deadlines and last
// renew.
func leaseEvent(state State, lease *lockclient.Lease, msg string) Event {
	return Event{State: state, Fence: lease.Fence, Message: msg,
		FenceDeadline: lease.FenceDeadline(), StopDeadline: lease.StopDeadline(), LastRenew: lease.LastRenew()}
}

// Start has nothing to start: Nomad starts the gated tasks once the gate's
// task runs. Its event says they may start, or run on after a restart.
func (w *gatedWorkload) Start(lease *lockclient.Lease) (Started, error) {
	if w.adopted {
		return Started{Event: gateTookOverMessage(lease.Fence, gateSlotNote(lease))}, nil
	}
	return Started{Event: gateAcquiredMessage(lease.Fence, gateSlotNote(lease))}, nil
}

// Exited never closes: a gate with no command runs until it is stopped.
func (w *gatedWorkload) Exited() <-chan struct{} { return nil }

func (w *gatedWorkload) ExitCode() int { return 0 }

func (w *gatedWorkload) Forward(sig os.Signal) {
	w.log.Debug("signal while holding, no workload to forward it to", "signal", sig)
}

// Stop words the gate's stop by Nomad or by a signal; Nomad stops the
// gated tasks itself.
func (w *gatedWorkload) Stop(_ syscall.Signal, end Ending) (string, bool) {
	switch end {
	case EndStopRequest:
		return gateStoppingMessage(false), false
	case EndSignal:
		return gateStoppingMessage(true), false
	}
	return "", false
}

func (w *gatedWorkload) Gone() bool { return true }

// Arm: the plugin's watchdog, not a guard of the supervisor's, kills the
// gated tasks of a frozen gate.
func (w *gatedWorkload) Arm(time.Time) {}

// KillBound is the gated tasks' kill bound and the slack Nomad needs to
// notice that the gate failed and begin killing them: what must remain of
// the time to the stop deadline once the gate fails.
func (w *gatedWorkload) KillBound() time.Duration { return w.killBound + gateKillSlack }

// KillAll proves nothing dead: the gated tasks' kill is the release's
// decision (gateHook.Release).
func (w *gatedWorkload) KillAll() bool { return true }
