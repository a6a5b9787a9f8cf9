package shim

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Tests of a gate's decisions (Supervisor.Run with a Gate and no
// command) over the in-memory lease and the in-memory servers' view of the
// allocations (locktest): when it takes the lock, whether it waits for the
// previous holder's gated tasks, whether it releases and marks the release
// clean, whether it kills its gated tasks itself, and its exit code.

const (
	gateAlloc = "alloc-self"
	gateTask  = "gate"
)

// gateRig is a gate's Supervisor over a locktest.Server that also serves
// the gate's allocation.
type gateRig struct {
	*runRig
	sigs chan os.Signal
	// apps are the gated tasks, for a test that changes the allocation.
	apps []GatedTask
}

// gateJob is the gate's allocation: its group "web" has the gate and the
// gated tasks apps (name → driver), desired status desired, each gated task
// in state gatedState ("" for none reported).
type gateJob struct {
	id, desired, gatedState string
	apps                    []GatedTask
	// groupDelay is the group's shutdown_delay; restart the gated tasks'
	// restart policy (nil: none set).
	groupDelay *time.Duration
	restart    *api.RestartPolicy
	// gateRunning adds the gate's own task state, running.
	gateRunning  bool
	clientStatus string
}

func (j gateJob) alloc() *api.Allocation {
	dur := func(d time.Duration) *time.Duration { return &d }
	zero, fail := 0, "fail"
	group := "web"
	tasks := []*api.Task{{Name: gateTask, Driver: "singleton",
		Lifecycle:     &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
		RestartPolicy: &api.RestartPolicy{Attempts: &zero, Mode: &fail}}}
	states := map[string]*api.TaskState{}
	if j.gateRunning {
		states[gateTask] = &api.TaskState{State: "running"}
	}
	apps := j.apps
	if apps == nil {
		apps = []GatedTask{{Name: "app", Driver: "docker"}}
	}
	for _, a := range apps {
		tasks = append(tasks, &api.Task{Name: a.Name, Driver: a.Driver, KillTimeout: dur(time.Second), RestartPolicy: j.restart})
		if j.gatedState != "" {
			states[a.Name] = &api.TaskState{State: j.gatedState}
		}
	}
	desired := j.desired
	if desired == "" {
		desired = api.AllocDesiredStatusRun
	}
	cs := j.clientStatus
	if cs == "" {
		cs = api.AllocClientStatusRunning
	}
	return &api.Allocation{ID: j.id, TaskGroup: group, DesiredStatus: desired, ClientStatus: cs, TaskStates: states,
		Job: &api.Job{TaskGroups: []*api.TaskGroup{{Name: &group, Tasks: tasks, ShutdownDelay: j.groupDelay}}}}
}

func newGateRig(t *testing.T, job gateJob) *gateRig {
	t.Helper()
	r := &runRig{t: t, srv: locktest.New(), out: nil, stop: make(chan StopRequest, 1), code: make(chan int, 1)}
	cfg := lockclient.Config{Path: "locks/web", Timing: locktest.Timing(),
		Holder: lockclient.Holder{AllocID: gateAlloc, Task: gateTask}}
	job.id = gateAlloc
	r.srv.SetAllocation(job.alloc())
	r.spec = Spec{Config: Config{Path: cfg.Path, KillSignal: syscall.SIGTERM, KillTimeout: time.Second},
		Gate: &GateSpec{AllocID: gateAlloc, Task: gateTask}, Holder: cfg.Holder}
	r.sup = &Supervisor{Locker: r.srv.Locker(t, cfg), Observe: r.observe, Stop: r.stop}
	r.env = Env{Allocs: r.srv.Allocs(t, allocs.Config{Holder: cfg.Holder})}
	return &gateRig{runRig: r, sigs: make(chan os.Signal, 1)}
}

// run starts Run; at cleanup a Run still going is stopped.
func (r *gateRig) run() {
	r.attach()
	go func() { r.code <- r.sup.Run(context.Background(), r.sigs) }()
	r.t.Cleanup(func() {
		select {
		case code := <-r.code:
			r.code <- code
		default:
			r.stop <- StopRequest{Signal: syscall.SIGKILL}
			select {
			case <-r.code:
			case <-time.After(4 * ceiling):
				r.t.Errorf("Run did not end after a stop request")
			}
		}
	})
}

// holding waits for the gate to hold the lock.
func (r *gateRig) holding() Event {
	r.t.Helper()
	return r.event("holding", inState(StateHolding))
}

// checkedAndHeld readies the gate's supervisor without running it: its
// check at start passed (or the test fails) and it holds the lock.
func (r *gateRig) checkedAndHeld() *lockclient.Lease {
	r.t.Helper()
	r.attach()
	if err := r.gate().check(context.Background()); err != nil {
		r.t.Fatalf("gate refused: %v; events:\n%s", err, r.eventLog())
	}
	lease, err := r.sup.Locker.Acquire(context.Background(), lockclient.AcquireOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

// gate is the gate's hook, once attached.
func (r *gateRig) gate() *gateHook {
	r.t.Helper()
	for _, h := range r.sup.Hooks {
		if g, ok := h.(*gateHook); ok {
			return g
		}
	}
	r.t.Fatal("no gate hook attached")
	return nil
}

// setAlloc changes the servers' view of the gate's allocation.
func (r *gateRig) setAlloc(job gateJob) {
	job.id = gateAlloc
	r.srv.SetAllocation(job.alloc())
}

// fakeGated is a GatedTasks that records Stop calls: how many, whether
// the lock was still held at the first (it must be: the lock passes only
// once the gated tasks are dead), and the grace and time each was given.
// A kill takes killTakes; it fails with killErr for the first failKills
// calls (all of them when failKills is 0).
type fakeGated struct {
	direct    []string
	killErr   error
	failKills int
	killTakes time.Duration
	srv       *locktest.Server

	mu         sync.Mutex
	kills      int
	killed     bool
	heldAtKill bool
	graces     []time.Duration
	budgets    []time.Duration // the time each call's context left it
}

func (f *fakeGated) Direct() []string { return f.direct }

func (f *fakeGated) WhyLeft(string) string { return "" }

func (f *fakeGated) Stop(ctx context.Context, grace time.Duration) error {
	f.mu.Lock()
	f.kills++
	n := f.kills
	if n == 1 && f.srv != nil {
		f.heldAtKill = f.srv.Held()
	}
	f.graces = append(f.graces, grace)
	budget := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl)
	}
	f.budgets = append(f.budgets, budget)
	f.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.killTakes):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.killErr != nil && (f.failKills == 0 || n <= f.failKills) {
		return f.killErr
	}
	f.killed = true
	return nil
}

func (f *fakeGated) calls() (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kills, f.killed
}

// A gate whose renews fail until its fence deadline gives the lock up as
// lost without releasing it: the server may have begun its expiry.
func TestGateFenceDeadline(t *testing.T) {
	r := newGateRig(t, gateJob{gatedState: "running"})
	r.run()
	r.holding()
	r.srv.FailRenew(locktest.Error(500, "rpc error: no leader"))
	deadline := time.Now().Add(lockclient.MinTTL + 2*ceiling)
	for {
		select {
		case code := <-r.code:
			r.code <- code
			if code != ExitLost {
				t.Errorf("exit %d, want ExitLost", code)
			}
			if n := r.srv.Calls(locktest.OpRelease); n != 0 {
				t.Errorf("%d release requests after the fence deadline", n)
			}
			return
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the gate still runs %s after its renews began to fail; events:\n%s", lockclient.MinTTL+2*ceiling, r.eventLog())
		}
	}
}

// withKiller gives the gate a GatedTasks that kills the tasks named in
// direct, and records at each release whether they were killed first.
func (r *gateRig) withKiller(direct ...string) *fakeGated {
	f := &fakeGated{direct: direct, srv: r.srv}
	r.env.GatedTasks = func(alloc *api.Allocation, tasks []GatedTask) (GatedTasks, error) {
		if alloc.ID != gateAlloc {
			r.t.Errorf("Killer built for allocation %q", alloc.ID)
		}
		return f, nil
	}
	r.srv.OnRelease(func() {
		_, killed := f.calls()
		r.mu.Lock()
		r.releases = append(r.releases, !killed) // "alive" at the release
		r.mu.Unlock()
	})
	return f
}

// Two gated tasks: app (docker, killed by the gate when direct) and db.
var twoApps = []GatedTask{{Name: "app", Driver: "docker"}, {Name: "db", Driver: "podman"}}
