package shim

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// A gate kills its gated tasks itself, and proves them dead, on every
// ending but Nomad's own stop of its allocation: its lock lost (409, 404,
// its fence deadline passed), a signal, a failed LB ADD, a gate command
// that ended, a stop that raced a stop of the allocation. It does so before
// it exits and before the lock can pass: Nomad's own kill of them, which
// follows the gate's failure, comes only after the group's shutdown_delay
// and, on a client cut off from the servers, after its services'
// deregistration gives up. Those it cannot kill (GatedTasks.Direct does
// not name them: drivers other than docker, exec, raw_exec, java, exec2)
// are left to Nomad, within the bound checkGateJob checks. Nomad's own
// stop of the allocation stays Nomad's: the gated tasks get their
// kill_signal, kill_timeout and shutdown_delays.

// buildKiller builds the gate's GatedTasks (Gate.Killer) for the gated
// tasks of alloc and returns the set of those it kills itself.
func (g *Gate) buildKiller(s *Supervisor, alloc *api.Allocation) map[string]bool {
	g.tasks = GatedTasksOf(alloc, g.Task)
	g.killer, g.planned, g.direct, g.killerErr = nil, nil, nil, nil
	if g.Killer == nil || len(g.tasks) == 0 {
		return nil
	}
	k, err := g.Killer(g.AllocID, g.tasks)
	if err != nil {
		s.Logger.Warn("gate: cannot kill the gated tasks itself; Nomad kills them", "error", err)
		g.killerErr = err
		return nil
	}
	if k == nil {
		return nil
	}
	g.planned = k
	direct := map[string]bool{}
	for _, name := range k.Direct() {
		if slices.ContainsFunc(g.tasks, func(t GatedTask) bool { return t.Name == name }) {
			direct[name] = true
		}
	}
	if len(direct) == 0 {
		return nil
	}
	g.killer = k
	for _, t := range g.tasks {
		if direct[t.Name] {
			g.direct = append(g.direct, t.Name)
		}
	}
	return direct
}

// allDirect reports whether the gate kills every gated task itself.
func (g *Gate) allDirect() bool {
	return g.killer != nil && len(g.direct) == len(g.gated) && len(g.gated) > 0
}

// whyLeft says why the gate leaves task to Nomad, as its killer knows
// ("" if it says nothing).
func (g *Gate) whyLeft(task string) string {
	if g.planned == nil {
		return ""
	}
	return g.planned.WhyLeft(task)
}

// leftToNomad lists the gated tasks the gate does not kill itself.
func (g *Gate) leftToNomad() []string {
	var out []string
	for _, name := range g.gated {
		if !slices.Contains(g.direct, name) {
			out = append(out, name)
		}
	}
	return out
}

// gateKillReserve is what a graceful stop of the gated tasks leaves,
// before the lease's stop deadline, for their SIGKILL and its proof.
const gateKillReserve = time.Second

// killDirect stops and proves dead the gated tasks the gate kills itself.
// Each gets its kill_signal and its kill_timeout, cut to what the lease's
// stop deadline leaves (lock mode: before the server can expire the lock,
// the fence deadline after a 409; lease mode: lease_fence +
// lease_kill_grace after the last heartbeat), then SIGKILL. The kill
// itself is never bounded by that deadline: every attempt gets a budget of
// its own, and a failed one is retried, past the deadline too, for
// gateKillRetryFor; once the gate has exited, the plugin's warden goes on.
// It reports whether they are all proven dead (true when there are none).
// An empty why proves them dead without an event unless that fails (Nomad
// stopped them first, as far as the gate knows).
func (s *Supervisor) killDirect(lease *lockclient.Lease, why string) bool {
	g := s.Config.Gate
	if g.killer == nil {
		return true
	}
	grace := lockclient.BootUntil(lease.StopDeadline()) - gateKillReserve
	s.Logger.Info("gate: killing the gated tasks itself", "tasks", strings.Join(g.direct, ","), "why", why, "grace", max(grace, 0).Round(time.Millisecond))
	began := lockclient.BootNow()
	if g.killedAt.IsZero() {
		g.killedAt = time.Now() // wall clock, as Nomad's task events on this host
	}
	var err error
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), gateKillAllTimeout+max(grace, 0))
		err = g.killer.Stop(ctx, grace)
		cancel()
		if err == nil {
			s.Logger.Info("gate: the gated tasks are proven dead", "tasks", strings.Join(g.direct, ","))
			if why != "" {
				s.emit(stoppingEvent(lease, gateKilledMessage(g.direct, why)))
			}
			return true
		}
		s.Logger.Error("gate: cannot prove the gated tasks dead", "error", err, "attempt", attempt+1)
		grace = 0
		if lockclient.BootNow().Sub(began) >= gateKillRetryFor {
			break
		}
		time.Sleep(gateKillRetryEvery)
	}
	s.emit(stoppingEvent(lease, gateKillUnprovenMessage(g.direct, err)))
	return false
}

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

// gateKillRetryFor bounds the gate's retries of a kill that fails; the
// plugin's warden retries once the gate has exited. gateKillRetryEvery is
// the pause between two attempts.
var gateKillRetryFor = 2 * gateKillAllTimeout

const gateKillRetryEvery = 500 * time.Millisecond

// killDirectHeld is killDirect for a lease that is still ours: if the
// gated tasks cannot be proven dead, the holder's record no longer claims
// that the gate kills them all (so the next holder waits for Nomad's report
// of them instead of trusting the lock's expiry), and the lease is left to
// expire.
func (s *Supervisor) killDirectHeld(lease *lockclient.Lease, why string) bool {
	if s.killDirect(lease, why) {
		return true
	}
	if s.Config.Gate.allDirect() {
		ctx, cancel := context.WithTimeout(context.Background(), s.Locker.Config().RequestTimeout)
		defer cancel()
		if err := lease.MarkNotGatedDirect(ctx); err != nil {
			s.Logger.Error("gate: cannot withdraw the record that it kills its gated tasks itself", "error", err)
		}
	}
	return false
}
