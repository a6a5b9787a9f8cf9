package shim

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
)

// Env is what a front end gives a run besides its Spec: the lock, where
// the command's process runs (Process), what the hooks read and write
// with, and hooks of its own.
type Env struct {
	// Locker is the lock's client (NewLocker); Supervise builds it when nil.
	Locker *lockclient.Locker
	// Emitter publishes the hooks' events: the Supervisor that runs them
	// (Supervise sets it).
	Emitter Emitter
	Logger  hclog.Logger
	// Observe and Stop are the Supervisor's (Supervise).
	Observe func(Event)
	Stop    <-chan StopRequest
	// Getenv reads the task environment (the LB auth key,
	// NOMAD_NAMESPACE); nil means os.Getenv.
	Getenv func(string) string
	// Allocs reads allocations (a gate's, an on-lock task's, the update
	// rule's); nil reads them through the Locker's endpoint.
	Allocs *allocs.Reader
	// Process places a command's process.
	Process
	// GatedTasks builds the killer of a gate's gated tasks (the driver's);
	// nil leaves them all to Nomad.
	GatedTasks GatedTasksFunc
	// LBRecords keeps the LB registration for a crash REMOVE (the
	// driver's); nil for none.
	LBRecords LBRecorder
	// Hooks are the front end's own (the driver's records), which take
	// part in each phase before the run's.
	Hooks []Hook
	// Metrics, if set, counts the run's metrics (metricshook.go).
	Metrics *Metrics
}

// Attach builds the run's workload and hooks from spec: the one place
// that names the features, as Nomad's task runner does in initHooks. A
// new feature is a hook of its own, attached here; the core does not
// change.
func Attach(spec Spec, env Env) (Workload, []Hook, error) {
	log, getenv := env.Logger, env.Getenv
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	holder := env.Locker.Config().Holder
	reader := env.Allocs
	if reader == nil {
		var err error
		if reader, err = allocs.New(allocs.ConfigOf(env.Locker)); err != nil {
			return nil, nil, err
		}
	}

	var gated *gatedWorkload
	if g := spec.Gate; g != nil {
		gated = &gatedWorkload{adopted: g.Adopt != nil, lease: spec.Mode == ModeLease, build: env.GatedTasks,
			log: log, emit: env.Emitter}
	}
	var w Workload
	switch {
	case gated != nil && len(spec.Command) > 0:
		w = pairWorkload{newProcessWorkload(spec.Config, env.Process, log), gated}
	case gated != nil:
		w = gated
	default:
		w = newProcessWorkload(spec.Config, env.Process, log)
	}

	var hooks []Hook
	var metrics *metricsHook
	if env.Metrics != nil {
		metrics = newMetricsHook(env.Metrics, env.Locker)
		hooks = append(hooks, metrics)
	}
	hooks = append(hooks, env.Hooks...)
	if spec.Holders == 0 {
		hooks = append(hooks, newStepDownHook(env.Locker, stepDownMode(spec), stepDownWithin(spec.Config), env.Emitter, log))
	}
	switch {
	case spec.Gate != nil:
		hooks = append(hooks, &gateHook{spec: *spec.Gate, path: spec.Path, locker: env.Locker, allocs: reader,
			emit: env.Emitter, log: log, w: gated, pluginReleases: spec.PluginReleases})
	case spec.WatchAlloc != nil:
		hooks = append(hooks, &allocWatchHook{w: *spec.WatchAlloc, allocs: reader, emit: env.Emitter, log: log})
	}
	// A gate with no command has no workload of its own that a delayed
	// stop keeps serving: Nomad killed its gated tasks before it stops it.
	serves := spec.Gate == nil || len(spec.Command) > 0
	if h := newUpdateHook(spec.Config, holder, serves, getenv); h != nil {
		h.allocs, h.emit, h.log = reader, env.Emitter, log
		hooks = append(hooks, h)
	}
	if lb := spec.LB; lb != nil {
		h := &lbHook{cfg: lb, getenv: getenv, log: log, rec: env.LBRecords,
			startFailed: lbStartFailedMessage, addFailed: lbAddFailedMessage}
		if spec.Gate != nil {
			// A gate fails on an LB failure: Nomad kills its gated tasks.
			h.startFailed, h.addFailed = gateLBStartFailedMessage, gateLBAddFailedMessage
		}
		if h.allocID = holder.AllocID; h.allocID == "" {
			h.allocID = fmt.Sprintf("pid%d", holder.PID)
		}
		if metrics != nil {
			h.onRequest = metrics.lbRequest
		}
		hooks = append(hooks, h)
	}
	return w, hooks, nil
}

// stepDownMode is how the run steps down: a gate's gated tasks are
// Nomad's, so its allocation is restarted; any other run stops its own
// workload.
func stepDownMode(spec Spec) lockclient.StepDownMode {
	if spec.Gate != nil {
		return lockclient.StepDownRestart
	}
	return lockclient.StepDownStop
}

// stepDownWithin bounds a step-down's stop, from the request to the
// release: the workload's kill_timeout, and a TTL for the rest (the LB
// REMOVE, the proof of death, a gate's gated tasks, which must be dead
// within its lock's bounds anyway).
func stepDownWithin(cfg Config) time.Duration { return cfg.KillTimeout + cfg.TTL }

// Supervise runs spec to its end, as a front end does: the lock's client
// (unless env has one), the Supervisor with env's Observe and Stop, the
// run's workload and hooks (Attach), then Run. It returns the exit code,
// and why the run could not be set up (then ExitConfig).
func Supervise(ctx context.Context, spec Spec, env Env, sigs <-chan os.Signal) (int, error) {
	log := env.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if env.Locker == nil {
		var err error
		if env.Locker, err = NewLocker(spec, log); err != nil {
			log.Error("cannot set up the lock", "error", err)
			return ExitConfig, err
		}
	}
	sup := &Supervisor{Config: spec.Config, Locker: env.Locker, Logger: log, Observe: env.Observe, Stop: env.Stop}
	env.Emitter = sup
	var err error
	if sup.Workload, sup.Hooks, err = Attach(spec, env); err != nil {
		log.Error("cannot attach the run's hooks", "error", err)
		return ExitConfig, err
	}
	return sup.Run(ctx, sigs), nil
}
