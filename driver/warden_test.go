package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// runDir writes a gate run's state dir below root: its spec (adopting
// adopt, if set), its status (none if st is nil), its exit (none if es
// is nil) and, if lease, the lease it held.
func runDir(t *testing.T, root *securefs.Dir, alloc, id string, adopt *shim.AdoptLease, st *supervisorStatus, es *exitStatus, lease bool) {
	t.Helper()
	cfg := &drivers.TaskConfig{ID: alloc + "/gate/" + id, AllocID: alloc, Name: "gate"}
	dir, err := openTaskState(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	files := map[string]any{specFile: gateSpecFile(shim.GateSpec{AllocID: alloc, Task: "gate", Adopt: adopt})}
	if st != nil {
		files[statusFile] = *st
	}
	if es != nil {
		files[exitFile] = *es
	}
	if lease {
		files[leaseFile] = heldLease{LockID: "lock-1", Fence: 7}
	}
	for name, v := range files {
		if err := writeJSON(dir, name, v); err != nil {
			t.Fatal(err)
		}
	}
}

// Who holds, as the warden reads the gate's runs from their state dirs
// (a restarted plugin knows nothing else).
func TestRunHolds(t *testing.T) {
	now := bootNow()
	soon, past := now+int64(3*time.Second), now-int64(time.Millisecond)
	self := func(state shim.State) *supervisorStatus {
		return &supervisorStatus{State: string(state), Fence: 7, SupervisorPID: os.Getpid(), SupervisorTicks: selfTicks(),
			FenceDeadlineBoot: soon, StopDeadlineBoot: soon + int64(time.Second)}
	}
	dead := func(fence int64) *supervisorStatus {
		st := self(shim.StateStopping)
		st.SupervisorTicks++ // not this process: the supervisor is gone
		st.FenceDeadlineBoot = fence
		return st
	}
	adopt := &shim.AdoptLease{LockID: "lock-1", Fence: 7, FenceBoot: soon, StopBoot: soon + 1}
	for _, tc := range []struct {
		name  string
		adopt *shim.AdoptLease
		st    *supervisorStatus
		es    *exitStatus
		lease bool
		held  bool
		by    int64
	}{
		{"supervisor holding", nil, self(shim.StateHolding), nil, true, true, 0},
		{"supervisor stopping (its own kill)", nil, self(shim.StateStopping), nil, true, true, 0},
		{"supervisor lost (its own kill)", nil, self(shim.StateLost), nil, true, true, 0},
		{"supervisor waiting, first run", nil, self(shim.StateWaiting), nil, false, false, 0},
		{"supervisor released", nil, self(shim.StateReleased), nil, false, false, 0},
		{"supervisor adopting a kept lease", adopt, self(shim.StateWaiting), nil, false, true, adopt.StopBoot},
		{"supervisor adopting a kept lease past its fence deadline", &shim.AdoptLease{FenceBoot: past}, self(shim.StateWaiting), nil, false, false, 0},
		{"not started yet, to adopt", adopt, nil, nil, false, true, adopt.StopBoot},
		{"not started yet, nothing to adopt", nil, nil, nil, false, false, 0},
		{"exited 0 holding (a restart), before its fence deadline", nil, dead(soon), &exitStatus{}, true, true, soon + int64(time.Second)},
		{"exited 0 holding, past its fence deadline", nil, dead(past), &exitStatus{}, true, false, 0},
		{"exited 0 after a release", nil, dead(soon), &exitStatus{}, false, false, 0},
		{"failed holding (lost, signal)", nil, dead(soon), &exitStatus{ExitCode: 76}, true, false, 0},
		{"crashed holding: the crash clean-up is under way", nil, dead(soon), nil, true, true, 0},
		{"crashed holding, past its fence deadline", nil, dead(past), nil, true, false, 0},
		{"crashed after a release", nil, dead(soon), nil, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			const alloc = "5d171c8d-1421-633e-e44a-52cb9501d563"
			runDir(t, root, alloc, "r1", tc.adopt, tc.st, tc.es, tc.lease)
			a, err := root.Sub(alloc, false)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			dir, err := a.Sub("gate%2Fr1", false)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			held, by, _ := runHolds(dir, now)
			if held != tc.held || by != tc.by {
				t.Errorf("runHolds = %v (kill by %d), want %v (%d)", held, by, tc.held, tc.by)
			}
		})
	}
}

// wardenRig is a plugin with a state root and the warden of gate "gate" of
// a test allocation whose gated task "app" (raw_exec) runs in a real v1
// freezer cgroup.
type wardenRig struct {
	d     *Driver
	root  *securefs.Dir
	alloc string
	cg    *taskCgroup
	w     wardenState
}

func newWardenRig(t *testing.T, script string, procs int) *wardenRig {
	t.Helper()
	alloc, cg := cgroupRunning(t, script, procs)
	root, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := &Driver{ctx: ctx, logger: hclog.NewNullLogger(), tasks: newTaskStore(), stateRoot: root}
	env := gatedEnv{CgroupMode: cgroupslib.CG1, GateCgroup: cgroupslib.PathCG1(alloc, "gate", "freezer")}
	kt := 5 * time.Second
	rec := planGated(alloc, []shim.GatedTask{{Name: "app", Driver: "raw_exec"}}, gatedAlloc(&api.Task{Name: "app", Driver: "raw_exec", KillTimeout: &kt}), env)
	w := wardenState{AllocID: alloc, Task: "gate", Record: rec, Env: env, TTL: 10 * time.Second, LockDelay: time.Second}
	a, err := root.Sub(alloc, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(a, wardenName("gate"), w); err != nil {
		t.Fatal(err)
	}
	a.Close()
	return &wardenRig{d: d, root: root, alloc: alloc, cg: cg, w: w}
}

// aliveFor reports whether the gated task still runs after d.
func (r *wardenRig) aliveFor(d time.Duration) bool {
	time.Sleep(d)
	alive, _ := r.cg.Alive()
	return alive
}

// R1: the warden leaves the gated tasks alone while a run of the gate
// holds, and kills them as soon as none does; a restarted plugin resumes
// it from the state dir.
func TestWardenKillsWhileTheGateDoesNotHold(t *testing.T) {
	r := newWardenRig(t, `trap '' INT TERM; while :; do sleep 0.1; done`, 2)
	holding := &supervisorStatus{State: string(shim.StateHolding), Fence: 7, SupervisorPID: os.Getpid(), SupervisorTicks: selfTicks()}
	runDir(t, r.root, r.alloc, "r1", nil, holding, nil, true)
	r.d.resumeWardens(r.root) // as a restarted plugin would
	if !r.aliveFor(time.Second) {
		t.Fatal("the warden killed the gated task while its gate held the lock")
	}
	released := *holding
	released.State = string(shim.StateReleased)
	runDir(t, r.root, r.alloc, "r1", nil, &released, nil, false)
	waitEmpty(t, r.cg, 5*time.Second)
}

// R3: a kept lease that runs out unadopted: the warden gives the gated
// task its kill_signal (SIGINT for raw_exec) and lets it exit by itself
// within what the lease's stop deadline leaves.
func TestWardenStopsGracefullyWhenAKeptLeaseRunsOut(t *testing.T) {
	out := filepath.Join(t.TempDir(), "signal")
	r := newWardenRig(t, `trap 'echo int > `+out+`; exit 0' INT; while :; do sleep 0.1; done`, 2)
	now := bootNow()
	a, err := r.root.Sub(r.alloc, false)
	if err != nil {
		t.Fatal(err)
	}
	kept := keptLease{Lease: shim.AdoptLease{LockID: "lock-1", Fence: 7, FenceBoot: now + int64(500*time.Millisecond), StopBoot: now + int64(4*time.Second)}}
	if err := writeJSON(a, keptName("gate"), kept); err != nil {
		t.Fatal(err)
	}
	a.Close()
	r.d.startWarden(r.w)
	if !r.aliveFor(300 * time.Millisecond) {
		t.Fatal("the warden killed the gated task while a kept lease was still good")
	}
	waitEmpty(t, r.cg, 5*time.Second)
	if b, err := os.ReadFile(out); err != nil || strings.TrimSpace(string(b)) != "int" {
		t.Errorf("the gated task did not get its kill_signal before it died (%q, %v)", b, err)
	}
}

// The warden is done once Nomad's kill has ended the gated tasks for good,
// or the allocation is gone.
func TestWardenDone(t *testing.T) {
	w := wardenState{Record: gatedRecord{Tasks: []gatedTaskRecord{{Name: "app"}, {Name: "db"}}}}
	alloc := func(cs string, states map[string]string) *api.Allocation {
		ts := map[string]*api.TaskState{}
		for k, v := range states {
			ts[k] = &api.TaskState{State: v}
		}
		return &api.Allocation{ClientStatus: cs, TaskStates: ts}
	}
	for _, tc := range []struct {
		name  string
		alloc *api.Allocation
		done  bool
	}{
		{"running", alloc("running", map[string]string{"app": "running", "db": "running"}), false},
		{"one pending a restart", alloc("running", map[string]string{"app": "pending", "db": "dead"}), false},
		{"every gated task dead", alloc("running", map[string]string{"app": "dead", "db": "dead", "gate": "running"}), true},
		{"client lost: it may still run them", alloc("lost", map[string]string{"app": "running", "db": "running"}), false},
		{"allocation failed", alloc("failed", nil), true},
		{"allocation complete", alloc("complete", nil), true},
	} {
		if got := wardenDone(tc.alloc, w) != ""; got != tc.done {
			t.Errorf("%s: done %v, want %v", tc.name, got, tc.done)
		}
	}
}

// R3 and the lock-mode kept-lease deadlock (audit L5): a gate restarted in
// an allocation whose gated tasks may run again (its warden armed) and
// that has no lease to take over is refused at once, rather than wait for
// the lock while they run beside the next holder; with a kept lease it
// takes it over.
func TestRestartedGateWithoutALeaseIsRefused(t *testing.T) {
	root, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger(), tasks: newTaskStore(), stateRoot: root}
	const alloc = "5d171c8d-1421-633e-e44a-52cb9501d563"
	cfg := &drivers.TaskConfig{ID: alloc + "/gate/2", AllocID: alloc, Name: "gate"}
	tc := TaskConfig{Gate: true}
	spec := func() *supervisorSpec { s := gateSpecFile(shim.GateSpec{AllocID: alloc, Task: "gate"}); return &s }
	if err := d.takeOver(cfg, root, tc, spec()); err != nil {
		t.Fatalf("first start: %v", err)
	}
	a, err := root.Sub(alloc, true)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := writeJSON(a, wardenName("gate"), wardenState{AllocID: alloc, Task: "gate"}); err != nil {
		t.Fatal(err)
	}
	err = d.takeOver(cfg, root, tc, spec())
	if err == nil || !strings.Contains(err.Error(), "Gate not restarted") {
		t.Fatalf("restart with no lease to take over: err = %v, want it refused", err)
	}
	now := lockclient.BootNanos(lockclient.BootNow())
	if err := writeJSON(a, keptName("gate"), keptLease{Lease: shim.AdoptLease{LockID: "lock-1", Fence: 7, FenceBoot: now + int64(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	s := spec()
	if err := d.takeOver(cfg, root, tc, s); err != nil || s.Run.Gate.Adopt == nil || s.Run.Gate.Adopt.LockID != "lock-1" {
		t.Fatalf("restart with a kept lease: err %v, adopt %+v; want it taken over", err, s.Run.Gate.Adopt)
	}
}
