package shim

import (
	"cmp"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
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

// message reports whether an event's message contains sub.
func (r *gateRig) message(sub string) bool {
	_, ok := r.find(func(ev Event) bool { return strings.Contains(ev.Message, sub) })
	return ok
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

// The endings of a gate that holds the lock, and what each does with it:
// only Nomad's own stop of the allocation (its desired status stop, or the
// allocation gone) releases it, marked clean; every other ending keeps it
// for the server to expire, so that the gated tasks, which Nomad kills
// only after the gate failed, are dead first.
func TestGateEndings(t *testing.T) {
	tests := []struct {
		name string
		// end ends the gate's hold.
		end      func(r *gateRig)
		code     int
		released bool   // the lock was released, marked clean
		event    string // an event says so
	}{
		{"stop request, allocation being stopped", func(r *gateRig) {
			r.setAlloc(gateJob{desired: api.AllocDesiredStatusStop, gatedState: "dead"})
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, true, "Released lock"},
		{"stop request, allocation evicted", func(r *gateRig) {
			r.setAlloc(gateJob{desired: api.AllocDesiredStatusEvict, gatedState: "dead"})
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, true, "Released lock"},
		{"stop request, allocation gone", func(r *gateRig) {
			r.srv.RemoveAllocation(gateAlloc)
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, true, "Released lock"},
		{"stop request, allocation runs on (a restart of the gate)", func(r *gateRig) {
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, false, "Lock kept for the restarted gate: Nomad stopped the gate while its allocation keeps running"},
		{"SIGTERM to the supervisor: the gate fails, so Nomad kills the gated tasks", func(r *gateRig) {
			r.sigs <- syscall.SIGTERM
		}, 1, false, "Lock kept: the gate stopped by itself"},
		{"lock taken by another holder (409)", func(r *gateRig) {
			r.srv.TakeOver(time.Second)
		}, ExitLost, false, "Gate lost the lock"},
		{"lock released behind its back", func(r *gateRig) {
			r.srv.Free()
		}, ExitLost, false, "Gate lost the lock"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: "running"})
			if strings.HasPrefix(tc.name, "stop request, allocation") {
				// Marked clean whether the watch saw the stop first (the
				// gate proves its task dead itself) or a read at the stop
				// did (the servers report it dead).
				r.withKiller("app")
			}
			r.run()
			r.holding()
			tc.end(r)
			if code := r.exit(); code != tc.code {
				t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
			}
			clean := r.srv.Items()["released_clean"] == "true"
			released := r.srv.Calls(locktest.OpRelease) > 0
			if released != tc.released || clean != tc.released {
				t.Errorf("released %v, marked clean %v; want %v (%s); events:\n%s", released, clean, tc.released, r.srv, r.eventLog())
			}
			if !r.message(tc.event) {
				t.Errorf("no event says %q; events:\n%s", tc.event, r.eventLog())
			}
		})
	}
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

// A gate that waits for the lock gives up when its allocation is being
// stopped (Nomad cannot kill a task that it has not seen start).
func TestGateWaitingAllocationStopped(t *testing.T) {
	r := newGateRig(t, gateJob{})
	r.srv.TakeOver(time.Second)
	r.run()
	r.event("waiting", func(ev Event) bool { return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc })
	r.setAlloc(gateJob{desired: api.AllocDesiredStatusStop})
	if code := r.exit(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if _, ok := r.find(func(ev Event) bool { return ev.State.Holds() }); ok {
		t.Errorf("the gate held the lock; events:\n%s", r.eventLog())
	}
	if !r.message("Allocation stopped while waiting for the lock") {
		t.Errorf("no event says why it stopped waiting; events:\n%s", r.eventLog())
	}
}

// The next holder: after a clean release it starts at once; after an
// unclean one it waits until Nomad reports the previous holder's gated
// tasks dead (or its allocation gone or finished).
func TestGateAwaitPrevious(t *testing.T) {
	prevItems := func(clean bool) map[string]string {
		m := map[string]string{"holder_alloc_id": locktest.OtherAlloc, "holder_node": locktest.OtherNode}
		if clean {
			m["released_clean"] = "true"
		}
		return m
	}
	other := func(gated string, cs string) *api.Allocation {
		return gateJob{id: locktest.OtherAlloc, gatedState: gated, gateRunning: true, clientStatus: cs}.alloc()
	}
	tests := []struct {
		name  string
		clean bool
		prev  *api.Allocation // nil: gone
		// then, once the gate waits, the servers' view of prev changes to
		// it (nil: no change needed, the gate must not wait).
		then *api.Allocation
	}{
		{"released clean", true, other("running", ""), nil},
		{"unclean, previous allocation gone", false, nil, nil},
		{"unclean, previous gated tasks dead", false, other("dead", ""), nil},
		{"unclean, previous allocation complete", false, other("running", api.AllocClientStatusComplete), nil},
		{"unclean, previous gated tasks running until reported dead", false, other("running", ""), other("dead", "")},
		{"unclean, previous node lost, gated tasks reported dead later", false, other("running", api.AllocClientStatusLost), other("dead", api.AllocClientStatusLost)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{})
			if tc.prev != nil {
				r.srv.SetAllocation(tc.prev)
			}
			r.srv.SetItems(prevItems(tc.clean))
			r.run()
			if tc.then == nil {
				r.holding()
				if r.message("waiting until Nomad reports them dead") {
					t.Errorf("the gate waited; events:\n%s", r.eventLog())
				}
				return
			}
			r.event("waiting for the previous holder", func(ev Event) bool {
				return ev.State == StateWaiting && strings.Contains(ev.Message, "waiting until Nomad reports them dead")
			})
			if _, held := r.find(inState(StateHolding)); held {
				t.Fatalf("the gate let its tasks start before the previous holder's were reported dead; events:\n%s", r.eventLog())
			}
			r.srv.SetAllocation(tc.then)
			r.holding()
		})
	}
}

// A restarted gate takes its previous run's lease over and holds it; one
// whose lease is gone fails (Nomad then kills the gated tasks).
func TestGateAdopt(t *testing.T) {
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "lease still held", false: "lease gone"}[held], func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: "running"})
			r.srv.TakeOver(time.Second) // locktest-lock-1: the previous run's
			if !held {
				r.srv.Free()
			}
			fence, _ := r.srv.LastGrant()
			r.spec.Gate.Adopt = &AdoptLease{LockID: "locktest-lock-1", Fence: fence}
			r.run()
			if !held {
				if code := r.exit(); code != ExitLost {
					t.Errorf("exit %d, want ExitLost", code)
				}
				if !r.message("could not take over its lease") {
					t.Errorf("no event says the lease could not be taken over; events:\n%s", r.eventLog())
				}
				return
			}
			r.event("took over", func(ev Event) bool { return strings.HasPrefix(ev.Message, "Took over lock") })
			if n := r.srv.Calls(locktest.OpAcquire); n != 0 {
				t.Errorf("%d acquires: the restarted gate waited for the lock", n)
			}
		})
	}
}

// A gate whose job cannot be gated safely never takes the lock.
func TestGateRefusesBadJob(t *testing.T) {
	r := newGateRig(t, gateJob{})
	bad := gateJob{id: gateAlloc}.alloc()
	bad.Job.TaskGroups[0].Tasks[0].Lifecycle = nil
	r.srv.SetAllocation(bad)
	r.run()
	if code := r.exit(); code != ExitConfig {
		t.Errorf("exit %d, want ExitConfig", code)
	}
	if n := r.srv.Calls(locktest.OpAcquire); n != 0 {
		t.Errorf("%d acquires by a refused gate", n)
	}
	if !r.message("Gate not started") {
		t.Errorf("no event says the gate was not started; events:\n%s", r.eventLog())
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

// With a Killer, every ending but Nomad's own stop of the allocation kills
// the gated tasks the gate can kill, before the lock can pass; the lock is
// released, clean, only when every gated task is proven dead and the lease
// is still ours.
func TestGateKillsDirectly(t *testing.T) {
	defer func(d time.Duration) { gateKillRetryFor = d }(gateKillRetryFor)
	gateKillRetryFor = time.Second
	tests := []struct {
		name    string
		direct  []string
		killErr error
		end     func(r *gateRig)
		code    int
		kills   bool // KillAll was called
		release bool // released, marked clean
		event   string
	}{
		{"lock lost (409): killed, not released", []string{"app", "db"}, nil, func(r *gateRig) { r.srv.TakeOver(time.Second) },
			ExitLost, true, false, "it killed app, db itself, proven dead"},
		{"lock lost, one task left to Nomad", []string{"app"}, nil, func(r *gateRig) { r.srv.Free() },
			ExitLost, true, false, "Nomad kills the gated tasks (db)"},
		{"signal, all direct: killed, released clean", []string{"app", "db"}, nil, func(r *gateRig) { r.sigs <- syscall.SIGTERM },
			1, true, true, "Gate killed app, db itself"},
		{"signal, one task left to Nomad: killed, lock kept", []string{"app"}, nil, func(r *gateRig) { r.sigs <- syscall.SIGTERM },
			1, true, false, "Lock kept: the gate stopped by itself"},
		{"signal, the kill fails: lock kept, no longer marked direct", []string{"app", "db"}, errors.New("docker: no answer"), func(r *gateRig) { r.sigs <- syscall.SIGTERM },
			1, true, false, "Gate could not prove app, db dead"},
		{"Nomad's stop of the allocation: Nomad's kill, released clean", []string{"app", "db"}, nil, func(r *gateRig) {
			// Nomad killed the gated tasks before it stopped the gate.
			r.setAlloc(gateJob{desired: api.AllocDesiredStatusStop, gatedState: "dead", apps: twoApps})
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, false, true, "Released lock"},
		{"a restart of the gate: no kill, lock kept for the restarted gate", []string{"app", "db"}, nil, func(r *gateRig) {
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, false, false, "Lock kept for the restarted gate: Nomad stopped the gate while its allocation keeps running"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
			f := r.withKiller(tc.direct...)
			f.killErr = tc.killErr
			r.run()
			r.holding()
			tc.end(r)
			if code := r.exit(); code != tc.code {
				t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
			}
			kills, _ := f.calls()
			if (kills > 0) != tc.kills {
				t.Errorf("%d KillAll calls, want any: %v; events:\n%s", kills, tc.kills, r.eventLog())
			}
			if kills > 0 && !f.heldAtKill && tc.name[:4] != "lock" {
				t.Errorf("the lock was free when the gate killed its gated tasks")
			}
			clean := r.srv.Items()["released_clean"] == "true"
			released := r.srv.Calls(locktest.OpRelease) > 0
			if released != tc.release || clean != tc.release {
				t.Errorf("released %v, marked clean %v; want %v; events:\n%s", released, clean, tc.release, r.eventLog())
			}
			if tc.kills {
				r.checkReleasesAfterDeath(0)
			}
			if tc.killErr != nil && r.srv.Items()["gated_direct"] != "" {
				t.Errorf("the lock still says the gate kills its tasks itself after a kill that failed")
			}
			if !r.message(tc.event) {
				t.Errorf("no event says %q; events:\n%s", tc.event, r.eventLog())
			}
		})
	}
}

// At start the gate says which gated tasks it kills itself and which it
// leaves to Nomad, and records in the lock whether it kills them all.
func TestGateSaysWhoKills(t *testing.T) {
	for _, tc := range []struct {
		name   string
		direct []string
		says   []string
		items  string // gated_direct in the holder's record
	}{
		{"all direct", []string{"app", "db"}, []string{"kills and proves dead itself, whenever it stops other than by Nomad's stop of the allocation: app (docker), db (podman)"}, "true"},
		{"one left to Nomad", []string{"app"}, []string{"itself, whenever it stops other than by Nomad's stop of the allocation: app (docker)",
			"Gate leaves to Nomad (no driver kill for them): db (podman)"}, ""},
		{"no killer", nil, []string{"Gate leaves to Nomad (no direct kill on this client): app (docker), db (podman)"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
			if tc.direct != nil {
				r.withKiller(tc.direct...)
			}
			r.run()
			r.holding()
			for _, want := range tc.says {
				if !r.message(want) {
					t.Errorf("no event says %q; events:\n%s", want, r.eventLog())
				}
			}
			if got := r.srv.Items()["gated_direct"]; got != tc.items {
				t.Errorf("gated_direct = %q, want %q", got, tc.items)
			}
		})
	}
}

// N9: a stop whose allocation the gate's watch had not seen stopped when it
// arrived, but that a read then shows stopped (a restart of the gate that
// raced a stop of the allocation), releases only if the servers report
// every gated task dead or the gate killed them all itself.
func TestGateStopRacingAllocationStop(t *testing.T) {
	stopped := func(gatedState string) stopArrival {
		return stopArrival{alloc: gateJob{id: gateAlloc, desired: api.AllocDesiredStatusStop, gatedState: gatedState, apps: twoApps}.alloc()}
	}
	for _, tc := range []struct {
		name           string
		direct         []string
		at             stopArrival
		release, clean bool
		kills          bool
		// own is the servers' view of the gated tasks' state ("" running).
		own string
	}{
		// L3: a restart of the gate racing the stop comes while the gated
		// tasks run (in the group's shutdown_delay): what the gate cannot
		// prove dead itself, the next gate learns from Nomad.
		{"seen by the watch before the stop, no killer", nil, stopArrival{seen: true}, true, false, false, ""},
		{"seen by the watch before the stop, all killed directly", []string{"app", "db"}, stopArrival{seen: true}, true, true, true, ""},
		{"seen, all killed directly, one shown pending (Nomad's kill cancels its restart)", []string{"app", "db"}, stopArrival{seen: true}, true, true, true, "pending"},
		{"read after: gated tasks reported dead", nil, stopped("dead"), true, true, false, ""},
		{"read after: gated tasks running, no killer", nil, stopped("running"), false, false, false, ""},
		{"read after: gated tasks running, one left to Nomad", []string{"app"}, stopped("running"), false, false, true, ""},
		{"read after: gated tasks running, all killed directly", []string{"app", "db"}, stopped("running"), true, true, true, ""},
		{"read after: the allocation runs on (restart)", []string{"app", "db"},
			stopArrival{alloc: gateJob{id: gateAlloc, gatedState: "running", apps: twoApps}.alloc()}, false, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: cmp.Or(tc.own, "running"), apps: twoApps})
			var f *fakeGated
			if tc.direct != nil {
				f = r.withKiller(tc.direct...)
			}
			lease := r.checkedAndHeld()
			if release, clean, _ := r.gate().mayRelease(lease, EndStopRequest, tc.at); release != tc.release || clean != tc.clean {
				t.Errorf("may release %v clean %v, want %v %v; events:\n%s", release, clean, tc.release, tc.clean, r.eventLog())
			}
			kills := 0
			if f != nil {
				kills, _ = f.calls()
			}
			if (kills > 0) != tc.kills {
				t.Errorf("%d KillAll calls, want any: %v", kills, tc.kills)
			}
		})
	}
}

// The next holder trusts a previous gate that killed its gated tasks
// itself (gated_direct) only for a client out of the servers' reach (cut
// off, it fenced itself and killed them, and its node's warden keeps them
// dead). While the servers report that client in touch, it waits until
// they report the gated tasks dead for good: neither that gate's death
// (its kill may have failed, H1(c)) nor a pending task (a restart due,
// H1(d)) is proof. (Before: the previous gate reported dead sufficed.)
func TestGateAwaitPreviousDirect(t *testing.T) {
	items := map[string]string{"holder_alloc_id": locktest.OtherAlloc, "holder_node": locktest.OtherNode, "gated_direct": "true"}
	for _, cs := range []string{api.AllocClientStatusLost, api.AllocClientStatusUnknown} {
		t.Run("its client out of reach ("+cs+"): at once", func(t *testing.T) {
			r := newGateRig(t, gateJob{})
			r.srv.SetAllocation(gateJob{id: locktest.OtherAlloc, gatedState: "running", gateRunning: true, clientStatus: cs}.alloc())
			r.srv.TakeOver(300 * time.Millisecond)
			r.srv.SetItems(items)
			r.run()
			r.event("waiting on the other holder", func(ev Event) bool { return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc })
			r.srv.Expire()
			r.holding()
			if r.message("waiting until Nomad reports them dead") {
				t.Errorf("the gate waited; events:\n%s", r.eventLog())
			}
		})
	}
	for _, tc := range []struct {
		name string
		// prev is the previous holder's allocation while the gate waits;
		// then lets the wait end.
		prev, then *api.Allocation
	}{
		{"released behind its back, its gate dead, its gated task running",
			gateJob{id: locktest.OtherAlloc, gatedState: "running"}.alloc(), gateJob{id: locktest.OtherAlloc, gatedState: "dead"}.alloc()},
		{"its gate dead, its gated task pending a restart",
			gateJob{id: locktest.OtherAlloc, gatedState: "pending"}.alloc(), gateJob{id: locktest.OtherAlloc, gatedState: "dead"}.alloc()},
		{"its gate running, its gated task pending, until the allocation failed",
			gateJob{id: locktest.OtherAlloc, gatedState: "pending", gateRunning: true}.alloc(),
			gateJob{id: locktest.OtherAlloc, gatedState: "pending", clientStatus: api.AllocClientStatusFailed}.alloc()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{})
			gateDead := tc.prev
			if gateDead.TaskStates[gateTask] == nil {
				gateDead.TaskStates[gateTask] = &api.TaskState{State: "dead"}
			}
			r.srv.SetAllocation(gateDead)
			r.srv.SetItems(items)
			r.run()
			r.event("waiting for the previous holder", func(ev Event) bool {
				return ev.State == StateWaiting && strings.Contains(ev.Message, "waiting until Nomad reports them dead for good")
			})
			time.Sleep(300 * time.Millisecond) // a while for a wrong start
			if _, held := r.find(inState(StateHolding)); held {
				t.Fatalf("the gate let its tasks start before the previous gated tasks were reported dead for good; events:\n%s", r.eventLog())
			}
			r.srv.SetAllocation(tc.then)
			r.holding()
		})
	}
}

// A gate with a command of its own whose command ends, even with 0: the
// gate kills its gated tasks, releases clean when it killed them all, and
// exits non-zero, so that Nomad fails it and kills what is left (a
// prestart sidecar that exits 0 is done, and its siblings would run on).
func TestGateCommandEnds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		direct []string
		code   int
		clean  bool
	}{
		{"exit 0, all killed directly", []string{"app", "db"}, 1, true},
		{"exit 0, one left to Nomad", []string{"app"}, 1, false},
		{"exit 3, no killer", nil, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
			code := 0
			if tc.code != 1 {
				code = tc.code
			}
			r.spec.Command = []string{"/bin/sh", "-c", "sleep 0.2; exit " + strconv.Itoa(code)}
			r.env.Process.Env = []string{"PATH=/usr/bin:/bin"}
			var f *fakeGated
			if tc.direct != nil {
				f = r.withKiller(tc.direct...)
			}
			r.run()
			if got := r.exit(); got != tc.code {
				t.Errorf("exit %d, want %d; events:\n%s", got, tc.code, r.eventLog())
			}
			if f != nil {
				if kills, _ := f.calls(); kills == 0 {
					t.Errorf("the gated tasks were not killed")
				}
			}
			if clean := r.srv.Items()["released_clean"] == "true"; clean != tc.clean || r.srv.Held() == tc.clean {
				t.Errorf("released clean %v, held %v; want clean %v; events:\n%s", clean, r.srv.Held(), tc.clean, r.eventLog())
			}
		})
	}
}

// C1: in lease mode as in lock mode, a gate that Nomad stops while its
// allocation runs on (a restart: `nomad alloc restart <alloc> gate`, a
// template re-render) keeps its lease for the restarted run and kills
// nothing: a gated task killed from outside would be restarted by Nomad
// after its restart delay, beside the next holder. (Before: it SIGKILLed
// them, released clean, and the next gate started at once.)
func TestGateLeaseModeRestartKeeps(t *testing.T) {
	r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
	r.spec.Mode = ModeLease
	f := r.withKiller("app", "db")
	r.run()
	r.holding()
	r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
	if code := r.exit(); code != 0 {
		t.Errorf("exit %d, want 0; events:\n%s", code, r.eventLog())
	}
	if kills, _ := f.calls(); kills != 0 {
		t.Errorf("%d kills of the gated tasks on a restart of the gate, want none", kills)
	}
	if n := r.srv.Calls(locktest.OpRelease); n != 0 || r.srv.Items()["released_clean"] != "" || !r.srv.Held() {
		t.Errorf("%d releases (released_clean %q, held %v), want the lease kept for the restarted gate; events:\n%s",
			n, r.srv.Items()["released_clean"], r.srv.Held(), r.eventLog())
	}
	if !r.message("Lock kept for the restarted gate") {
		t.Errorf("no event says the lease is kept for the restarted gate; events:\n%s", r.eventLog())
	}
}
