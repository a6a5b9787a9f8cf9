package driver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// A gated task may run only while its own allocation's gate holds the
// lock. The gate proves its gated tasks dead when it lets the lock go, but
// that is "dead now": Nomad's task runner owns their lives, and a task
// killed from outside (by the gate, the plugin, its own crash) is restarted
// in place after its restart delay, whatever the gate does, until Nomad's
// own kill of the allocation has begun, which comes only after the
// group's shutdown_delay (docs/gate-nomad.md). So the plugin, which runs as
// root and outlives every run of the gate, keeps a warden per gated
// allocation: armed when the gate first holds (before StartTask returns,
// so before any gated task starts), recorded in the allocation's root-only
// state dir so that a restarted plugin resumes it. Whenever no run of that
// gate holds (runHolds: no supervisor in a holding or stopping state, no
// lease kept for a restart within its fence deadline), it kills whatever
// gated task of the allocation it finds running, retrying failed kills,
// until the gate holds again, or until Nomad's kill of the allocation has
// ended every gated task for good (the servers report each dead, or the
// allocation complete, failed or gone: read with the gate's identity, or
// the operator's release token), or the allocation is gone from the
// client. It polls locally (a cgroup read, one Docker Engine list) every
// wardenEvery while the gate does not hold, keeps one blocking read of the
// allocation open meanwhile, and does nothing but read the gate's state
// files while it holds.

const (
	// wardenEvery is how often a warden looks at its gate and, while the
	// gate does not hold, for gated tasks that run.
	wardenEvery = 100 * time.Millisecond
	// wardenKillReserve is what the warden's graceful stop of the gated
	// tasks, when a kept lease ran out, leaves before the lease's stop
	// deadline for their SIGKILL and its proof.
	wardenKillReserve = time.Second
	// wardenReadRetry is the pause after a failed read of the allocation.
	wardenReadRetry = 2 * time.Second
	// wardenNoticeEvery paces the warden's task events about kills that
	// fail.
	wardenNoticeEvery = time.Minute
)

// wardenName names a gate's warden in its allocation's state dir.
func wardenName(task string) string { return "warden-" + url.PathEscape(task) + ".json" }

// wardenState is a warden on disk: what it needs to find the gate's runs,
// kill the gated tasks and ask the servers, after a plugin restart too.
type wardenState struct {
	AllocID, Task, Namespace, LockPath string
	TTL, LockDelay                     time.Duration
	// SecretsDir is the gate's secrets dir (its Task API socket and, with
	// identity { file = true }, its token); AllocDir Nomad's allocation
	// dir, gone once Nomad has destroyed the allocation on this client.
	SecretsDir, AllocDir string
	Record               gatedRecord
	Env                  gatedEnv
}

func (w wardenState) key() string { return w.AllocID + "/" + w.Task }

// wardens are the wardens that run in this plugin.
type wardens struct {
	mu      sync.Mutex
	running map[string]bool
}

// start runs w's warden unless it runs already.
func (d *Driver) startWarden(w wardenState) {
	d.wardens.mu.Lock()
	defer d.wardens.mu.Unlock()
	if d.wardens.running == nil {
		d.wardens.running = map[string]bool{}
	}
	if d.wardens.running[w.key()] {
		return
	}
	d.wardens.running[w.key()] = true
	go d.runWarden(w)
}

// armWarden arms the warden of gate h, which holds its lock: it must be on
// disk before StartTask returns, so before Nomad starts any gated task.
func (d *Driver) armWarden(h *taskHandle, root *securefs.Dir) error {
	var spec supervisorSpec
	if err := readSpec(h.dir, &spec); err != nil || spec.Run.Gate == nil {
		return fmt.Errorf("read the gate's spec: %v", err)
	}
	w := wardenState{AllocID: spec.Run.Gate.AllocID, Task: spec.Run.Gate.Task, Namespace: spec.Run.Gate.Namespace, LockPath: spec.Run.Path,
		TTL: spec.Run.TTL, LockDelay: spec.Run.LockDelay, SecretsDir: h.cfg.TaskDir().SecretsDir, AllocDir: h.cfg.AllocDir,
		Env: gatedEnvOf(spec)}
	if k, err := d.gatedKillerOf(h, spec); err != nil {
		h.logger.Warn("gate: its gated tasks are not known yet; the warden learns them from the allocation", "error", err)
	} else {
		w.Record = k.rec
		k.close()
	}
	d.gateLeases.mu.Lock()
	alloc, err := root.Sub(w.AllocID, true)
	if err == nil {
		err = writeJSON(alloc, wardenName(w.Task), w)
		alloc.Close()
	}
	d.gateLeases.mu.Unlock()
	if err != nil {
		return fmt.Errorf("arm the warden of the gated tasks: %w", err)
	}
	d.startWarden(w)
	return nil
}

// wardenArmed reports whether the gate task of cfg's allocation has an
// armed warden: it held before, in this allocation, and its gated tasks
// may still be started by Nomad.
func (d *Driver) wardenArmed(cfg *drivers.TaskConfig, root *securefs.Dir) bool {
	if root == nil || !allocIDPattern.MatchString(cfg.AllocID) {
		return false
	}
	alloc, err := root.Sub(cfg.AllocID, false)
	if err != nil {
		return false
	}
	defer alloc.Close()
	var w wardenState
	return readJSON(alloc, wardenName(cfg.Name), &w) == nil
}

// resumeWardens starts the wardens recorded below root (a restarted
// plugin).
func (d *Driver) resumeWardens(root *securefs.Dir) {
	allocs, err := root.Names()
	if err != nil {
		d.logger.Warn("list the state dir for gate wardens", "error", err)
		return
	}
	for _, id := range allocs {
		if !allocIDPattern.MatchString(id) {
			continue
		}
		alloc, err := root.Sub(id, false)
		if err != nil {
			continue
		}
		names, _ := alloc.Names()
		for _, name := range names {
			var w wardenState
			if strings.HasPrefix(name, "warden-") && readJSON(alloc, name, &w) == nil && w.AllocID == id {
				d.logger.Info("resuming the warden of a gate's tasks", "alloc_id", id, "task", w.Task)
				d.startWarden(w)
			}
		}
		alloc.Close()
	}
}

// disarmWarden removes w's record: the warden is done.
func (d *Driver) disarmWarden(w wardenState) {
	d.mu.RLock()
	root := d.stateRoot
	d.mu.RUnlock()
	if root == nil {
		return
	}
	d.gateLeases.mu.Lock()
	defer d.gateLeases.mu.Unlock()
	if alloc, err := root.Sub(w.AllocID, false); err == nil {
		_ = alloc.Remove(wardenName(w.Task))
		alloc.Close()
		_ = root.RemoveEmptySub(w.AllocID)
	}
}

// runWarden is one gate's warden (see above), until it is done or the
// plugin ends.
func (d *Driver) runWarden(w wardenState) {
	log := d.logger.With("alloc_id", w.AllocID, "task", w.Task, "warden", true)
	defer func() {
		d.wardens.mu.Lock()
		delete(d.wardens.running, w.key())
		d.wardens.mu.Unlock()
	}()
	k, err := newGatedKiller(w.Record, w.Env)
	if err != nil {
		log.Error("gate warden: cannot build the killer of the gated tasks; Nomad's kill alone ends them", "error", err)
		k = nil
	}
	if k != nil {
		defer k.close()
	}
	cfg := &drivers.TaskConfig{ID: w.key(), AllocID: w.AllocID, Name: w.Task}
	tick := time.NewTicker(wardenEvery)
	defer tick.Stop()
	var done chan string
	var stopWatch context.CancelFunc
	defer func() {
		if stopWatch != nil {
			stopWatch()
		}
	}()
	held, killBy := true, int64(0) // armed while the gate holds
	var noticed time.Time
	for {
		select {
		case <-d.ctx.Done():
			return
		case why := <-done:
			log.Info("gate warden: done", "why", why)
			d.disarmWarden(w)
			return
		case <-tick.C:
		}
		if _, err := os.Lstat(w.AllocDir); w.AllocDir != "" && errors.Is(err, os.ErrNotExist) {
			log.Info("gate warden: done", "why", "Nomad destroyed the allocation on this client")
			d.disarmWarden(w)
			return
		}
		holds, by, why := d.gateHolds(w)
		if holds {
			held, killBy = true, by
			if stopWatch != nil {
				stopWatch()
				stopWatch, done = nil, nil
			}
			continue
		}
		if stopWatch == nil {
			stopWatch, done = d.startWardenWatch(w, log)
		}
		var grace time.Duration
		if held && killBy > 0 {
			// A kept lease ran out: the gated tasks get their graceful
			// stop, within what its stop deadline leaves.
			grace = time.Duration(killBy-bootNow()) - wardenKillReserve
		}
		held, killBy = false, 0
		if k == nil {
			continue
		}
		if err := d.wardenKill(k, grace, cfg, log.With("not_held", why)); err != nil && time.Since(noticed) > wardenNoticeEvery {
			noticed = time.Now()
			d.emitEvent(cfg, wardenKillFailedMessage(k.Direct(), err), map[string]string{"lock_state": string(shim.StateStopping)})
		}
	}
}

// wardenKill kills the gated tasks that run, and says so.
func (d *Driver) wardenKill(k *gatedKiller, grace time.Duration, cfg *drivers.TaskConfig, log hclog.Logger) error {
	ctx, cancel := context.WithTimeout(d.ctx, confirmDeadWithin)
	running, err := k.Running(ctx)
	cancel()
	if err != nil {
		log.Warn("gate warden: cannot see whether the gated tasks run", "error", err)
		return err
	}
	if len(running) == 0 {
		return nil
	}
	log.Warn("gate warden: gated tasks run while their gate does not hold the lock; killing them", "tasks", strings.Join(running, ","),
		"grace", max(grace, 0).Round(time.Millisecond))
	ctx, cancel = context.WithTimeout(d.ctx, confirmDeadWithin+max(grace, 0))
	defer cancel()
	if err := k.Stop(ctx, grace); err != nil {
		log.Error("gate warden: the gated tasks are not proven dead; retrying", "error", err)
		return err
	}
	d.emitEvent(cfg, wardenKilledMessage(running, grace > 0), map[string]string{"lock_state": string(shim.StateStopping)})
	return nil
}

// gateHolds reports whether a run of w's gate holds its lease, or may
// still take it over (runHolds), and, for a kept or adopting lease, its
// stop deadline (CLOCK_BOOTTIME ns), by which the gated tasks must be
// dead once it runs out. why says, when none holds, what each run showed.
func (d *Driver) gateHolds(w wardenState) (held bool, killBy int64, why string) {
	d.mu.RLock()
	root := d.stateRoot
	d.mu.RUnlock()
	if root == nil {
		return true, 0, "" // nothing known: leave it
	}
	d.gateLeases.mu.Lock()
	defer d.gateLeases.mu.Unlock()
	alloc, err := root.Sub(w.AllocID, false)
	if err != nil {
		return false, 0, "the allocation's state dir: " + err.Error()
	}
	defer alloc.Close()
	now := bootNow()
	var k keptLease
	if readJSON(alloc, keptName(w.Task), &k) == nil && now < k.Lease.FenceBoot {
		return true, k.Lease.StopBoot, ""
	}
	names, err := alloc.Names()
	if err != nil {
		return true, 0, "" // unreadable: leave it
	}
	var whys []string
	prefix := url.PathEscape(w.Task + "/")
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		dir, err := alloc.Sub(name, false)
		if err != nil {
			whys = append(whys, name+": "+err.Error())
			continue
		}
		held, by, why := runHolds(dir, now)
		dir.Close()
		if held {
			return true, by, ""
		}
		whys = append(whys, name+": "+why)
	}
	if len(whys) == 0 {
		return false, 0, "no run of the gate"
	}
	return false, 0, strings.Join(whys, "; ")
}

// runHolds reports whether the run of a gate whose state dir is dir holds
// its lease, or may still: its supervisor runs in a holding, stopping or
// lost state (it, and the watchdog should it hang, stop the gated tasks
// themselves); or it is to take over a kept lease (not yet started, or
// still adopting) before that lease's fence deadline; or, before its fence
// deadline, it exited 0 holding its lease (a restart: the lease is kept
// for the next run) or died holding it (the plugin's crash clean-up is
// under way). by is a kept lease's stop deadline.
func runHolds(dir *securefs.Dir, now int64) (held bool, by int64, why string) {
	var spec supervisorSpec
	if err := readSpec(dir, &spec); err != nil || spec.Run.Gate == nil {
		return false, 0, fmt.Sprintf("no gate spec (%v)", err)
	}
	var st supervisorStatus
	_ = readJSON(dir, statusFile, &st)
	adopting := spec.Run.Gate.Adopt != nil && now < spec.Run.Gate.Adopt.FenceBoot
	if st.SupervisorPID == 0 {
		if adopting {
			return true, spec.Run.Gate.Adopt.StopBoot, ""
		}
		return false, 0, "no supervisor recorded"
	}
	ticks, err := startTicks(st.SupervisorPID)
	if err == nil && ticks == st.SupervisorTicks {
		switch state := shim.State(st.State); {
		case state.Holds() || state == shim.StateStopping || state == shim.StateLost:
			return true, 0, ""
		case adopting:
			return true, spec.Run.Gate.Adopt.StopBoot, ""
		}
		return false, 0, fmt.Sprintf("supervisor %d %s", st.SupervisorPID, st.State)
	}
	var held0 heldLease
	switch {
	case readJSON(dir, leaseFile, &held0) != nil:
		return false, 0, fmt.Sprintf("supervisor %d gone (%v), no lease recorded", st.SupervisorPID, err)
	case held0.Fence != st.Fence:
		return false, 0, fmt.Sprintf("supervisor %d gone (%v), its lease (fence %d) not the one published (%d)", st.SupervisorPID, err, held0.Fence, st.Fence)
	case now >= st.FenceDeadlineBoot:
		return false, 0, fmt.Sprintf("supervisor %d gone (%v), past its fence deadline", st.SupervisorPID, err)
	}
	var es exitStatus
	switch err := readJSON(dir, exitFile, &es); {
	case err == nil && es.ExitCode == 0:
		return true, st.StopDeadlineBoot, ""
	case err != nil:
		// Crashed holding: the plugin's crash clean-up kills the gated
		// tasks (after their LB REMOVE) and releases, or keeps the lease.
		return true, 0, ""
	}
	return false, 0, fmt.Sprintf("supervisor %d exited %d", st.SupervisorPID, es.ExitCode)
}

// startWardenWatch starts wardenWatch; stop ends it.
func (d *Driver) startWardenWatch(w wardenState, log hclog.Logger) (stop context.CancelFunc, done chan string) {
	ctx, stop := context.WithCancel(d.ctx)
	done = make(chan string, 1)
	go d.wardenWatch(ctx, w, done, log)
	return stop, done
}

// wardenWatch reads w's allocation (blocking queries) until Nomad's kill
// has ended every gated task for good (wardenDone), and says why on done.
func (d *Driver) wardenWatch(ctx context.Context, w wardenState, done chan<- string, log hclog.Logger) {
	var index uint64
	for ctx.Err() == nil {
		reader, err := d.wardenReader(w)
		if err != nil {
			log.Debug("gate warden: no identity to read the allocation with", "error", err)
			_ = ctxsleep.Sleep(ctx, wardenReadRetry)
			continue
		}
		alloc, next, err := reader.Allocation(ctx, w.AllocID, w.Namespace, index)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, allocs.ErrGone) && !errors.Is(err, allocs.ErrHidden):
			done <- "the allocation is gone from the servers"
			return
		case err != nil:
			log.Debug("gate warden: read the allocation", "error", err)
			index = 0
			_ = ctxsleep.Sleep(ctx, wardenReadRetry)
			continue
		}
		if why := wardenDone(alloc, w); why != "" {
			done <- why
			return
		}
		index = next
	}
}

// wardenDone says why Nomad can no longer start any of w's gated tasks,
// or "" if it still may: its client reported the allocation complete or
// failed, or every gated task dead (a task runner reports dead once it
// will not restart the task: killed by Nomad, or failed for good).
func wardenDone(alloc *api.Allocation, w wardenState) string {
	if alloc.ClientStatus == api.AllocClientStatusComplete || alloc.ClientStatus == api.AllocClientStatusFailed {
		return "the allocation's client reported it " + alloc.ClientStatus
	}
	if len(w.Record.Tasks) == 0 {
		return ""
	}
	for _, t := range w.Record.Tasks {
		if st := alloc.TaskStates[t.Name]; st == nil || st.State != "dead" {
			return ""
		}
	}
	return "Nomad reports every gated task dead"
}

// wardenReader reads with the gate's identity: a run's task environment
// (identity { env = true }), else its token file (file = true), else the
// operator's release_token_file.
func (d *Driver) wardenReader(w wardenState) (*allocs.Reader, error) {
	ep, err := lockclient.Endpoint{}, errors.New("no gate run known")
	for _, h := range d.tasks.all() {
		if h.cfg.AllocID == w.AllocID && h.cfg.Name == w.Task {
			if ep, err = lockclient.DiscoverRootEndpoint(w.SecretsDir, func(k string) string { return h.cfg.Env[k] }); err == nil {
				break
			}
		}
	}
	if err != nil {
		ep, err = lockclient.DiscoverRootEndpoint(w.SecretsDir, func(string) string { return "" })
	}
	if err != nil {
		ep, err = d.operatorEndpointAt(w.SecretsDir)
	}
	if err != nil {
		return nil, err
	}
	return allocs.New(allocs.Config{Endpoint: ep, Timing: lockclient.Timing{TTL: w.TTL, LockDelay: w.LockDelay}})
}
