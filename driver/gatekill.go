package driver

import (
	"context"
	"errors"
	"fmt"
	"github.com/hashicorp/nomad/api"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// The plugin kills a gate's gated tasks itself (see gatedtasks.go) when the
// gate's supervisor cannot: it crashed or was killed (releaseAfterCrash), or
// it stopped running past its fence or stop deadline (the watchdog).

// gatedReadTimeout bounds the read of the gate's allocation, when the
// plugin has no record of its gated tasks yet.
const gatedReadTimeout = 5 * time.Second

// gatedEnvOf is the gate's node facts, from its spec.
func gatedEnvOf(spec supervisorSpec) gatedEnv {
	env := gatedEnv{CgroupMode: cgroupslib.OFF}
	if spec.Run.Gate != nil {
		env.DockerEndpoint = spec.DockerEndpoint
	}
	if spec.CgroupPath != "" {
		env.CgroupMode, env.GateCgroup = cgroupslib.Mode(spec.CgroupMode), spec.CgroupPath
	}
	return env
}

// gatedTasksFunc is a gate supervisor's shim.Env.GatedTasks: from the
// allocation as the gate read it at start (for cgroup overrides), it
// records the plan for the plugin and returns the killer.
func gatedTasksFunc(dir *securefs.Dir, spec supervisorSpec, log hclog.Logger) func(*api.Allocation, []shim.GatedTask) (shim.GatedTasks, error) {
	return func(alloc *api.Allocation, tasks []shim.GatedTask) (shim.GatedTasks, error) {
		env := gatedEnvOf(spec)
		checkEngine(context.Background(), &env)
		rec := planGated(spec.Run.Gate.AllocID, tasks, alloc, env)
		if err := writeJSON(dir, gatedFile, rec); err != nil {
			log.Warn("gate: record the gated tasks for the plugin", "error", err)
		}
		return newGatedKiller(rec, env)
	}
}

// gatedKillerOf returns the killer of gate h's gated tasks: from the
// record in its state dir, else from its allocation, read with the gate's
// own identity (and then recorded).
func (d *Driver) gatedKillerOf(h *taskHandle, spec supervisorSpec) (*gatedKiller, error) {
	if spec.Run.Gate == nil {
		return nil, errors.New("not a gate")
	}
	env := gatedEnvOf(spec)
	var rec gatedRecord
	if err := readJSON(h.dir, gatedFile, &rec); err == nil && rec.AllocID == spec.Run.Gate.AllocID {
		return newGatedKiller(rec, env)
	}
	reader, err := allocs.New(allocs.Config{Endpoint: h.taskEndpoint(),
		Timing: lockclient.Timing{TTL: spec.Run.TTL, LockDelay: spec.Run.LockDelay}})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(d.ctx, gatedReadTimeout)
	defer cancel()
	alloc, _, err := reader.Allocation(ctx, spec.Run.Gate.AllocID, spec.Run.Gate.Namespace, 0)
	if err != nil {
		return nil, fmt.Errorf("read the gate's allocation to find its gated tasks: %w", err)
	}
	checkEngine(ctx, &env)
	rec = planGated(spec.Run.Gate.AllocID, shim.GatedTasksOf(alloc, spec.Run.Gate.Task), alloc, env)
	if err := writeJSON(h.dir, gatedFile, rec); err != nil {
		h.logger.Warn("record the gated tasks", "error", err)
	}
	return newGatedKiller(rec, env)
}

// killGated kills and proves dead every gated task of gate h. all is true
// when none is left to Nomad.
func (d *Driver) killGated(h *taskHandle, spec supervisorSpec, within time.Duration) (all bool, err error) {
	k, err := d.gatedKillerOf(h, spec)
	if err != nil {
		return false, err
	}
	defer k.close()
	ctx, cancel := context.WithTimeout(d.ctx, within)
	defer cancel()
	if err := k.KillAll(ctx); err != nil {
		return false, err
	}
	return len(k.LeftToNomad()) == 0, nil
}

// gateWatchdog is the watchdog's act for a gate whose supervisor let a
// deadline pass: it kills the gated tasks, then the supervisor, so that the
// gate fails (and the crash clean-up releases the lock once they are dead).
func (d *Driver) gateWatchdog(h *taskHandle, why string) {
	var spec supervisorSpec
	if err := readSpec(h.dir, &spec); err != nil {
		h.logger.Error("watchdog: read the gate's spec", "error", err)
	}
	h.logger.Error("watchdog: killing the gate's gated tasks and its supervisor", "why", why)
	_, err := d.killGated(h, spec, confirmDeadWithin)
	if err != nil {
		h.logger.Error("watchdog: the gated tasks are not proven dead; Nomad kills them once the gate has failed", "error", err)
	}
	h.killTask()
	d.emitEvent(h.cfg, watchdogGateMessage(err, why), map[string]string{"lock_state": string(shim.StateLost)})
}

func (k *gatedKiller) close() {
	if k.docker != nil {
		k.docker.Close()
	}
}
