package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/dockerengine"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// A gate's gated tasks, killed and proven dead by the plugin itself (see
// shim.GatedTasks): Nomad's client kills them only after the allocation's
// pre-kill hooks (the group's shutdown_delay, service deregistration), and
// its servers report them dead later still.
//
//   - docker: the containers Nomad's docker driver made for the allocation,
//     found by what Nomad itself records and a job cannot imitate: the label
//     com.hashicorp.nomad.alloc_id (set after the job's own labels, so it
//     always holds the true allocation) and the container name
//     "<task>-<alloc ID>" (unique on the engine). Both must match. Each is
//     paused (frozen), SIGKILLed while paused (a paused container's code
//     never runs again: `docker stop` would unpause it and run its SIGTERM
//     handler), and inspected until it no longer runs.
//   - exec, raw_exec, java: the task's cgroup as Nomad's executor lays it out
//     (v1: <root>/freezer/nomad/<alloc>.<task>; v2: the gate's own
//     partition parent, share.slice or reserve.slice, /<alloc>.<task>.scope),
//     frozen and killed (v1) or cgroup.kill'ed (v2) and read until empty, by
//     the code that kills the driver's own tasks (taskCgroup.KillAll). A
//     raw_exec task that sets cgroup_v1_override or cgroup_v2_override runs
//     elsewhere, so it is left to Nomad.
//   - any other driver (podman, qemu, exec2, ...): left to Nomad; the lock's
//     expiry bounds it.

// gatedFile records a gate's gated tasks (gatedRecord) in its state dir, for
// the plugin's watchdog and crash clean-up.
const gatedFile = "gated.json"

// gatedRecord is what the plugin needs to kill a gate's gated tasks without
// asking Nomad: the allocation, its tasks and which of them it can kill.
type gatedRecord struct {
	AllocID string
	Tasks   []gatedTaskRecord
}

type gatedTaskRecord struct {
	Name, Driver string
	// Direct: the plugin kills and proves it dead itself.
	Direct bool
	// Why it is left to Nomad, when not Direct.
	Why string `json:",omitempty"`
	// KillSignal and KillTimeout are the task's kill_signal ("" for the
	// driver's default) and kill_timeout, from its job: a kill that has
	// the time gives the task its own graceful stop first (Stop).
	KillSignal  string        `json:",omitempty"`
	KillTimeout time.Duration `json:",omitempty"`
}

// cgroupDrivers are the task drivers whose tasks Nomad's executor puts in a
// cgroup of the standard layout.
var cgroupDrivers = []string{"exec", "raw_exec", "java"}

// gatedKillDeadline bounds one KillAll when its context has no deadline.
const gatedKillDeadline = 10 * time.Second

// nomadAllocLabel is the docker driver's mandatory container label.
const nomadAllocLabel = "com.hashicorp.nomad.alloc_id"

// gatedEnv is what a gate's killer needs of the node: the docker endpoint
// (empty: docker tasks are left to Nomad) and the cgroup layout.
type gatedEnv struct {
	DockerEndpoint string
	// DockerUnreachable, when set, says why the engine at DockerEndpoint
	// did not answer (checkEngine): docker tasks are then left to Nomad.
	DockerUnreachable string `json:",omitempty"`
	CgroupMode        cgroupslib.Mode
	// GateCgroup is the gate's own task cgroup, which the plugin made its
	// limits in, where Nomad's layout puts it: v1 its freezer cgroup (the
	// gated tasks' are its siblings), v2 its unified cgroup, whose
	// grandparent is the Nomad cgroup parent.
	GateCgroup string
}

// planGated decides, for each gated task, whether the plugin can kill it
// itself. alloc, when known, shows cgroup overrides of raw_exec tasks.
func planGated(allocID string, tasks []shim.GatedTask, alloc *api.Allocation, env gatedEnv) gatedRecord {
	rec := gatedRecord{AllocID: allocID}
	for _, t := range tasks {
		r := gatedTaskRecord{Name: t.Name, Driver: t.Driver}
		r.KillSignal, r.KillTimeout = taskKill(alloc, t.Name)
		switch {
		case t.Driver == "docker" && env.DockerEndpoint == "":
			r.Why = "the plugin config's docker_endpoint is empty"
		case t.Driver == "docker" && env.DockerUnreachable != "":
			r.Why = env.DockerUnreachable
		case t.Driver == "docker":
			r.Direct = true
		case slices.Contains(cgroupDrivers, t.Driver) && env.CgroupMode == cgroupslib.OFF:
			r.Why = "cgroups are disabled on this client"
		case slices.Contains(cgroupDrivers, t.Driver) && env.GateCgroup == "":
			// The gate's own cgroup, made where Nomad's layout puts it, is
			// what shows the layout holds on this client.
			r.Why = "the gate has no task cgroup of its own, so the layout of the task cgroups is unproven"
		case slices.Contains(cgroupDrivers, t.Driver):
			if alloc == nil {
				r.Why = "its task config could not be read"
			} else if why := cgroupOverride(alloc, t.Name); why != "" {
				r.Why = why
			} else {
				r.Direct = true
			}
		default:
			r.Why = fmt.Sprintf("the plugin cannot find the processes of a %q task", t.Driver)
		}
		rec.Tasks = append(rec.Tasks, r)
	}
	return rec
}

// dockerPingTimeout bounds checkEngine's ping.
const dockerPingTimeout = 2 * time.Second

// checkEngine makes sure the plugin reaches the Docker engine at
// env.DockerEndpoint before any record says it kills a docker task
// itself: the docker plugin may use another endpoint (its own config's
// `endpoint`), and then every direct kill would fail, or find nothing.
// Where it cannot, env.DockerUnreachable says why and names the fix.
func checkEngine(ctx context.Context, env *gatedEnv) {
	if env.DockerEndpoint == "" {
		return
	}
	c, err := dockerengine.New(env.DockerEndpoint)
	if err == nil {
		defer c.Close()
		ctx, cancel := context.WithTimeout(ctx, dockerPingTimeout)
		defer cancel()
		err = c.Ping(ctx)
	}
	if err != nil {
		env.DockerUnreachable = fmt.Sprintf("the plugin cannot reach the Docker engine at %s (%v): set the plugin config's "+
			"docker_endpoint to the docker plugin's endpoint", env.DockerEndpoint, err)
	}
}

// taskKill is the kill_signal and kill_timeout of task in alloc's group
// (Nomad's default kill_timeout, 5s, where unset or unknown).
func taskKill(alloc *api.Allocation, task string) (string, time.Duration) {
	if alloc != nil && alloc.Job != nil {
		for _, g := range alloc.Job.TaskGroups {
			if g.Name == nil || *g.Name != alloc.TaskGroup {
				continue
			}
			for _, t := range g.Tasks {
				if t.Name == task && t.KillTimeout != nil {
					return t.KillSignal, *t.KillTimeout
				}
				if t.Name == task {
					return t.KillSignal, nomadKillTimeout
				}
			}
		}
	}
	return "", nomadKillTimeout
}

// nomadKillTimeout is Nomad's kill_timeout where a job sets none.
const nomadKillTimeout = 5 * time.Second

// cgroupOverride says why a task does not run in its standard cgroup, or "".
func cgroupOverride(alloc *api.Allocation, task string) string {
	if alloc.Job == nil {
		return "its task config could not be read"
	}
	for _, g := range alloc.Job.TaskGroups {
		if g.Name == nil || *g.Name != alloc.TaskGroup {
			continue
		}
		for _, t := range g.Tasks {
			if t.Name != task {
				continue
			}
			for _, key := range []string{"cgroup_v1_override", "cgroup_v2_override"} {
				if v, ok := t.Config[key]; ok && v != nil && v != "" {
					return "it sets " + key + ", so it runs outside the cgroup Nomad makes for it"
				}
			}
			return ""
		}
	}
	return "it is not in the allocation's group"
}

// gatedKiller is shim.GatedTasks for one allocation.
type gatedKiller struct {
	rec    gatedRecord
	env    gatedEnv
	docker *dockerengine.Client
}

func newGatedKiller(rec gatedRecord, env gatedEnv) (*gatedKiller, error) {
	k := &gatedKiller{rec: rec, env: env}
	if env.DockerEndpoint != "" {
		c, err := dockerengine.New(env.DockerEndpoint)
		if err != nil {
			return nil, err
		}
		k.docker = c
	}
	return k, nil
}

// Direct names the tasks the plugin kills itself.
func (k *gatedKiller) Direct() []string {
	var out []string
	for _, t := range k.rec.Tasks {
		if t.Direct {
			out = append(out, t.Name)
		}
	}
	return out
}

// WhyLeft says why task is left to Nomad ("" for a Direct one).
func (k *gatedKiller) WhyLeft(task string) string {
	for _, t := range k.rec.Tasks {
		if t.Name == task && !t.Direct {
			return t.Why
		}
	}
	return ""
}

// LeftToNomad describes the tasks left to Nomad, with why.
func (k *gatedKiller) LeftToNomad() []string {
	var out []string
	for _, t := range k.rec.Tasks {
		if !t.Direct {
			out = append(out, fmt.Sprintf("%s (%s: %s)", t.Name, t.Driver, t.Why))
		}
	}
	return out
}

// KillAll kills every Direct task at once and returns nil once each is
// proven gone.
func (k *gatedKiller) KillAll(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, gatedKillDeadline)
		defer cancel()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(k.rec.Tasks))
	for i, t := range k.rec.Tasks {
		if !t.Direct {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if t.Driver == "docker" {
				err = k.killContainer(ctx, t.Name)
			} else {
				err = k.killCgroup(ctx, t.Name)
			}
			if err != nil {
				errs[i] = fmt.Errorf("gated task %q (%s): %w", t.Name, t.Driver, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stop stops every Direct task as Nomad would, in less time where it
// must: each that runs gets its kill_signal (where the job sets none, a
// docker task its image's STOPSIGNAL or SIGTERM, as the docker driver
// does; exec, raw_exec and java SIGINT, as Nomad's executor does), and
// then KillAll once it has exited, or has had its kill_timeout or grace,
// whichever is shorter. grace <= 0 is KillAll at once. It returns nil only
// once each is proven gone.
func (k *gatedKiller) Stop(ctx context.Context, grace time.Duration) error {
	if grace > 0 {
		var wg sync.WaitGroup
		for _, t := range k.rec.Tasks {
			wait := min(grace, t.KillTimeout)
			if !t.Direct || wait <= 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				gctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				if t.Driver == "docker" {
					k.stopContainers(gctx, t)
				} else {
					k.stopCgroup(gctx, t)
				}
			}()
		}
		wg.Wait()
	}
	return k.KillAll(ctx)
}

// stopContainers sends the task's stop signal to each of its running
// containers and waits, until ctx ends, for them to stop. Errors are left
// to the KillAll that follows.
func (k *gatedKiller) stopContainers(ctx context.Context, t gatedTaskRecord) {
	cs, err := k.containersOf(ctx, t.Name)
	if err != nil {
		return
	}
	for _, c := range cs {
		id := c.ID
		in, err := k.docker.Inspect(ctx, id)
		if err != nil || !in.State.Running || in.State.Paused {
			continue
		}
		sig := cmp.Or(t.KillSignal, in.Config.StopSignal, "SIGTERM")
		if err := k.docker.Kill(ctx, id, sig); err != nil {
			continue
		}
		for ctx.Err() == nil {
			if in, err := k.docker.Inspect(ctx, id); err != nil || !in.State.Running {
				break
			}
			_ = ctxsleep.Sleep(ctx, 50*time.Millisecond)
		}
	}
}

// stopCgroup sends the task's stop signal to every process of its cgroup
// and waits, until ctx ends, for the cgroup to be empty.
func (k *gatedKiller) stopCgroup(ctx context.Context, t gatedTaskRecord) {
	sig, err := shim.ParseSignal(cmp.Or(t.KillSignal, "SIGINT"))
	if err != nil {
		return
	}
	for _, cg := range k.taskCgroupOf(t.Name) {
		if alive, err := cg.Alive(); err != nil || !alive {
			continue
		}
		if err := cg.Signal(sig); err != nil {
			continue
		}
		for ctx.Err() == nil {
			if alive, err := cg.Alive(); err != nil || !alive {
				break
			}
			_ = ctxsleep.Sleep(ctx, 20*time.Millisecond)
		}
	}
}

// containerName is the docker driver's name for a task's container.
func containerName(task, allocID string) string {
	return "/" + strings.ReplaceAll(task, "/", "_") + "-" + allocID
}

// containersOf lists the task's containers: those that carry the
// allocation's label and the task's name.
func (k *gatedKiller) containersOf(ctx context.Context, task string) ([]dockerengine.Container, error) {
	if k.docker == nil {
		return nil, errors.New("no docker endpoint")
	}
	list, err := k.docker.ListByLabel(ctx, nomadAllocLabel, k.rec.AllocID)
	if err != nil {
		return nil, err
	}
	want := containerName(task, k.rec.AllocID)
	var out []dockerengine.Container
	for _, c := range list {
		if c.Labels[nomadAllocLabel] == k.rec.AllocID && slices.Contains(c.Names, want) {
			out = append(out, c)
		}
	}
	return out, nil
}

// Running names the Direct tasks that have a process, or a container
// that runs (or is paused).
func (k *gatedKiller) Running(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	for _, t := range k.rec.Tasks {
		if !t.Direct {
			continue
		}
		alive := false
		if t.Driver == "docker" {
			cs, err := k.containersOf(ctx, t.Name)
			errs = append(errs, err)
			alive = slices.ContainsFunc(cs, func(c dockerengine.Container) bool { return c.State == "running" || c.State == "paused" })
		} else {
			for _, cg := range k.taskCgroupOf(t.Name) {
				a, err := cg.Alive()
				errs = append(errs, err)
				alive = alive || a
			}
		}
		if alive {
			out = append(out, t.Name)
		}
	}
	return out, errors.Join(errs...)
}

// killContainer pauses, SIGKILLs and waits out the task's container, if
// there is one.
func (k *gatedKiller) killContainer(ctx context.Context, task string) error {
	cs, err := k.containersOf(ctx, task)
	if err != nil {
		return err
	}
	want := containerName(task, k.rec.AllocID)
	for _, c := range cs {
		if err := k.killOneContainer(ctx, c.ID, want); err != nil {
			return err
		}
	}
	return nil
}

func (k *gatedKiller) killOneContainer(ctx context.Context, id, name string) error {
	for {
		in, err := k.docker.Inspect(ctx, id)
		switch {
		case errors.Is(err, dockerengine.ErrNotFound):
			return nil
		case err != nil:
			return err
		case in.Name != name || in.Config.Labels[nomadAllocLabel] != k.rec.AllocID:
			return nil // not the container listed: that one is gone
		case !in.State.Running:
			return nil
		}
		if !in.State.Paused {
			if err := k.docker.Pause(ctx, id); err != nil && !dockerengine.IsConflict(err) && !errors.Is(err, dockerengine.ErrNotFound) {
				return fmt.Errorf("pause container %s: %w", id[:min(12, len(id))], err)
			}
		}
		if err := k.docker.Kill(ctx, id, "SIGKILL"); err != nil && !dockerengine.IsConflict(err) && !errors.Is(err, dockerengine.ErrNotFound) {
			return fmt.Errorf("kill container %s: %w", id[:min(12, len(id))], err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %s still running after SIGKILL: %w", id[:min(12, len(id))], ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// taskCgroupOf is the cgroup Nomad's executor puts a task of the allocation in.
func (k *gatedKiller) taskCgroupOf(task string) []*taskCgroup {
	if k.env.CgroupMode == cgroupslib.CG1 {
		return []*taskCgroup{{mode: cgroupslib.CG1, path: filepath.Join(filepath.Dir(k.env.GateCgroup), cgroupslib.ScopeCG1(k.rec.AllocID, task))}}
	}
	parent := filepath.Dir(filepath.Dir(k.env.GateCgroup))
	scope := cgroupslib.ScopeCG1(k.rec.AllocID, task) + ".scope"
	return []*taskCgroup{
		{mode: k.env.CgroupMode, path: filepath.Join(parent, "share.slice", scope)},
		{mode: k.env.CgroupMode, path: filepath.Join(parent, "reserve.slice", scope)},
	}
}

func (k *gatedKiller) killCgroup(ctx context.Context, task string) error {
	within := gatedKillDeadline
	if dl, ok := ctx.Deadline(); ok {
		within = time.Until(dl)
	}
	var errs []error
	for _, cg := range k.taskCgroupOf(task) {
		errs = append(errs, cg.KillAll(within))
	}
	return errors.Join(errs...)
}
