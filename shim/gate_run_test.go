package shim

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Tests of a gate's decisions (Supervisor.Run with Config.Gate and no
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
	r.sup = &Supervisor{
		Config:  Config{Path: cfg.Path, KillSignal: syscall.SIGTERM, KillTimeout: time.Second, Gate: &Gate{AllocID: gateAlloc, Task: gateTask}},
		Locker:  r.srv.Locker(t, cfg),
		Observe: r.observe,
		Stop:    r.stop,
	}
	return &gateRig{runRig: r, sigs: make(chan os.Signal, 1)}
}

// run starts Run; at cleanup a Run still going is stopped.
func (r *gateRig) run() {
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

// fakeGated is a GatedTasks that records KillAll calls and what was
// alive at each release request.
type fakeGated struct {
	direct  []string
	killErr error

	mu     sync.Mutex
	kills  int
	killed bool
}

func (f *fakeGated) Direct() []string { return f.direct }

func (f *fakeGated) KillAll(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kills++
	if f.killErr != nil {
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
			r.setAlloc(gateJob{desired: api.AllocDesiredStatusEvict})
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, true, "Released lock"},
		{"stop request, allocation gone", func(r *gateRig) {
			r.srv.RemoveAllocation(gateAlloc)
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, true, "Released lock"},
		{"stop request, allocation runs on (a restart of the gate)", func(r *gateRig) {
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		}, 0, false, "Lock kept: Nomad stopped the gate while its allocation keeps running"},
		{"SIGTERM to the supervisor", func(r *gateRig) {
			r.sigs <- syscall.SIGTERM
		}, 0, false, "Lock kept: the gate stopped by itself"},
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
			r.sup.Config.Gate.Adopt = &AdoptLease{LockID: "locktest-lock-1", Fence: fence}
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
