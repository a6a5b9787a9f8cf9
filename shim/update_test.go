package shim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

func versioned(id, group string, v uint64, desired string) *api.Allocation {
	return &api.Allocation{ID: id, TaskGroup: group, DesiredStatus: desired, Job: &api.Job{Version: &v}}
}

func stub(id, group string, v uint64, desired, client, task string) *api.AllocationListStub {
	s := &api.AllocationListStub{ID: id, TaskGroup: group, JobVersion: v, DesiredStatus: desired, ClientStatus: client}
	if task != "" {
		s.TaskStates = map[string]*api.TaskState{"app": {State: task}}
	}
	return s
}

// A standby gives way only to an allocation of its own group, of a newer
// job version, that the servers want running and that is on its way to
// the lock (placed, or running its task); never to itself, an older or
// equal version, one being stopped, one whose task is dead, or one on a
// node that is down (lost, unknown).
func TestStandbyGivesWayOnlyToANewerVersionOnItsWay(t *testing.T) {
	self := versioned("self", "web", 3, "run")
	cases := []struct {
		name  string
		stubs []*api.AllocationListStub
		want  string
	}{
		{"none", nil, ""},
		{"itself", []*api.AllocationListStub{stub("self", "web", 4, "run", "running", "running")}, ""},
		{"same version", []*api.AllocationListStub{stub("b", "web", 3, "run", "running", "running")}, ""},
		{"older version", []*api.AllocationListStub{stub("b", "web", 2, "run", "running", "running")}, ""},
		{"other group", []*api.AllocationListStub{stub("b", "db", 4, "run", "running", "running")}, ""},
		{"being stopped", []*api.AllocationListStub{stub("b", "web", 4, "stop", "running", "running")}, ""},
		{"task dead", []*api.AllocationListStub{stub("b", "web", 4, "run", "running", "dead")}, ""},
		{"node down: lost", []*api.AllocationListStub{stub("b", "web", 4, "run", "lost", "running")}, ""},
		{"node down: unknown", []*api.AllocationListStub{stub("b", "web", 4, "run", "unknown", "running")}, ""},
		{"failed", []*api.AllocationListStub{stub("b", "web", 4, "run", "failed", "dead")}, ""},
		{"waiting for the lock", []*api.AllocationListStub{stub("b", "web", 4, "run", "running", "running")}, "b"},
		{"task starting", []*api.AllocationListStub{stub("b", "web", 4, "run", "running", "pending")}, "b"},
		{"placed, waiting for the allocation it replaces", []*api.AllocationListStub{stub("b", "web", 4, "run", "pending", "")}, "b"},
		{"the newest wins", []*api.AllocationListStub{
			stub("b", "web", 4, "run", "running", "running"), stub("c", "web", 5, "run", "pending", ""),
			stub("d", "web", 2, "run", "running", "running")}, "c"},
	}
	for _, tc := range cases {
		got := standbySuccessor(self, tc.stubs, "app")
		if id := func() string {
			if got == nil {
				return ""
			}
			return got.ID
		}(); id != tc.want {
			t.Errorf("%s: successor %q, want %q", tc.name, id, tc.want)
		}
	}
	if got := standbySuccessor(&api.Allocation{ID: "self", TaskGroup: "web"}, []*api.AllocationListStub{stub("b", "web", 4, "run", "running", "running")}, "app"); got != nil {
		t.Errorf("an allocation whose version is unknown gave way to %s", got.ID)
	}
}

// A standby that the servers want stopped (an update, a scale-down, a
// drain) never takes the lock; one they want running does.
func TestStandbyBeingStoppedNeverAcquires(t *testing.T) {
	for desired, want := range map[string]bool{"run": false, "": false, "stop": true, "evict": true} {
		if got := standbyStopping(versioned("a", "web", 1, desired)); got != want {
			t.Errorf("desired %q: stopping %v, want %v", desired, got, want)
		}
	}
}

// updateRigT is a standby's update hook (job web, group web, task app,
// job version 1) and its lock, over a locktest.Server that serves its
// allocations.
type updateRigT struct {
	h *updateHook
	l *lockclient.Locker
}

func updateRig(t *testing.T, grace time.Duration) (*updateRigT, *locktest.Server) {
	srv := locktest.New()
	cfg := lockclient.Config{Path: "locks/web", Timing: locktest.Timing(),
		Holder: lockclient.Holder{AllocID: "standby", JobID: "web", Group: "web", Task: "app"}}
	h := newUpdateHook(Config{UpdateGrace: grace}, cfg.Holder, true, func(string) string { return "" })
	if h != nil {
		h.allocs, h.emit, h.log = srv.Allocs(t, allocs.Config{Holder: cfg.Holder}), discard{}, hclog.NewNullLogger()
	}
	return &updateRigT{h: h, l: srv.Locker(t, cfg)}, srv
}

// updateAcquire acquires as the run does with the update hook.
func (s *updateRigT) updateAcquire(ctx context.Context) (*lockclient.Lease, error) {
	var pre PreAcquireResponse
	if err := s.h.PreAcquire(ctx, &pre); err != nil {
		return nil, err
	}
	return s.l.Acquire(ctx, lockclient.AcquireOptions{Defer: pre.Defer})
}

// discard is an Emitter that publishes nothing.
type discard struct{}

func (discard) Emit(Event)   {}
func (discard) Notice(Event) {}

func jobAlloc(id string, v uint64, desired, client string) *api.Allocation {
	a := versioned(id, "web", v, desired)
	a.JobID, a.ClientStatus = "web", client
	a.TaskStates = map[string]*api.TaskState{"app": {State: "running"}}
	return a
}

// A free lock with a newer version on its way: the old-version standby
// lets it take the lock; if it does not within the grace, the standby
// takes it anyway. Without a newer version it takes the lock at once.
func TestOldStandbyGivesWayForTheGraceThenAcquires(t *testing.T) {
	const grace = 1500 * time.Millisecond
	s, srv := updateRig(t, grace)
	srv.SetAllocation(jobAlloc("standby", 1, "run", "running"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	start := time.Now()
	lease, err := s.updateAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
	if srv.Calls(locktest.OpJobAllocs) == 0 {
		t.Fatal("the standby took the lock without looking for a newer version")
	}

	srv.SetAllocation(jobAlloc("successor", 2, "run", "pending"))
	start = time.Now()
	lease, err = s.updateAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()
	if waited := time.Since(start); waited < grace {
		t.Fatalf("the standby took the lock after %s, before its grace of %s", waited, grace)
	}
}

// The newer version takes the lock within the grace: the standby does not
// get it, and keeps waiting behind it.
func TestOldStandbyWaitsBehindTheNewVersion(t *testing.T) {
	s, srv := updateRig(t, 20*time.Second)
	srv.SetAllocation(jobAlloc("standby", 1, "run", "running"))
	srv.SetAllocation(jobAlloc("successor", 2, "run", "running"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := s.updateAcquire(ctx)
		if err == nil {
			_ = l.Release(context.Background())
		}
		got <- err
	}()
	waitFor(t, func() bool { return srv.Calls(locktest.OpJobAllocs) > 0 })
	time.Sleep(500 * time.Millisecond) // inside the grace of 20s
	if n := srv.Calls(locktest.OpAcquire); n != 0 {
		t.Fatalf("the standby sent %d acquires during its grace", n)
	}
	srv.TakeOver(time.Second)
	select {
	case err := <-got:
		t.Fatalf("the standby's acquire ended (%v) while the new version holds", err)
	case <-time.After(3 * time.Second):
	}
	cancel()
	<-got
}

// A standby that the servers want stopped never takes the lock, free or not.
func TestStandbyBeingStoppedNeverTakesAFreeLock(t *testing.T) {
	s, srv := updateRig(t, time.Second)
	srv.SetAllocation(jobAlloc("standby", 1, "stop", "running"))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if l, err := s.updateAcquire(ctx); err == nil {
		_ = l.Release(context.Background())
		t.Fatal("a standby being stopped took the lock")
	}
	if n := srv.Calls(locktest.OpAcquire); n != 0 {
		t.Fatalf("a standby being stopped sent %d acquires", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 20s")
		}
	}
}

// A standby shown the lock held sends no acquire: it waits for the
// variable to change and asks about newer versions before it takes the
// lock, so a release that follows a holder's last write is never raced.
func TestStandbyAsksBeforeTakingAReleasedLock(t *testing.T) {
	s, srv := updateRig(t, time.Second)
	srv.SetAllocation(jobAlloc("standby", 1, "run", "running"))
	srv.TakeOver(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := s.updateAcquire(ctx)
		if err == nil {
			_ = l.Release(context.Background())
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if n := srv.Calls(locktest.OpAcquire); n != 0 {
		t.Fatalf("the standby sent %d acquires while it was shown the lock held", n)
	}
	asked := srv.Calls(locktest.OpJobAllocs)
	srv.Free()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if srv.Calls(locktest.OpJobAllocs) <= asked {
		t.Fatal("the standby took the released lock without asking about newer versions")
	}
}

// update_grace = 0 turns the rule off (the behaviour before it, which the
// bench's "before" row runs): the setting holds DurationOff, and the
// supervisor attaches no update hook, so a standby takes a free lock at
// once. A positive grace below the minimum is still refused.
func TestUpdateGraceZeroTurnsTheRuleOff(t *testing.T) {
	label := func(s LockSetting) string { return "config.lock." + s.Name }
	for _, v := range []string{"0", "0s"} {
		c := DefaultConfig()
		if err := LockSettings.In(InDriver).Apply(&c, LockValues{"update_grace": v}, label); err != nil {
			t.Fatalf("update_grace = %s: %v", v, err)
		}
		if c.UpdateGrace != DurationOff {
			t.Errorf("update_grace = %s: %s, want off", v, c.UpdateGrace)
		}
	}
	c := DefaultConfig()
	if err := LockSettings.In(InDriver).Apply(&c, LockValues{"update_grace": "500ms"}, label); err == nil {
		t.Error("update_grace = 500ms accepted, below the 1s minimum")
	}
	if s, _ := updateRig(t, DurationOff); s.h != nil {
		t.Error("update_grace = 0: an update hook, want none")
	}
	if s, _ := updateRig(t, time.Second); s.h == nil {
		t.Error("update_grace = 1s: no update hook")
	}
}

// A holder stopped for a rolling update waits only for an allocation of a
// newer version that is on its way and is not its own replacement (which
// Nomad starts only once the holder is terminal); it is waiting once its
// task runs, or once it said it waits for a held lock.
func TestHolderSuccessor(t *testing.T) {
	self := versioned("holder", "web", 1, "stop")
	self.NextAllocation = "mine"
	waitingEv := &api.TaskState{State: "pending", Events: []*api.TaskEvent{{DisplayMessage: waitingHeldMessage("p", lockclient.Holder{AllocID: "holder"})}}}
	for _, tc := range []struct {
		name        string
		stubs       []*api.AllocationListStub
		want        string
		wantWaiting bool
	}{
		{"only its own replacement", []*api.AllocationListStub{stub("mine", "web", 2, "run", "pending", "")}, "", false},
		{"own replacement running", []*api.AllocationListStub{stub("mine", "web", 2, "run", "running", "running")}, "", false},
		{"another replacement pending", []*api.AllocationListStub{stub("mine", "web", 2, "run", "pending", ""), stub("b", "web", 2, "run", "pending", "")}, "b", false},
		{"another replacement just started", []*api.AllocationListStub{stub("b", "web", 2, "run", "running", "running")}, "b", false},
		{"another replacement running a while", []*api.AllocationListStub{settled(stub("b", "web", 2, "run", "running", "running"))}, "b", true},
		{"another replacement said it waits", []*api.AllocationListStub{{ID: "b", TaskGroup: "web", JobVersion: 2, DesiredStatus: "run", ClientStatus: "running",
			TaskStates: map[string]*api.TaskState{"app": {State: "running", StartedAt: time.Now(), Events: waitingEv.Events}}}}, "b", true},
		{"a waiting one wins over a pending one", []*api.AllocationListStub{stub("a", "web", 2, "run", "pending", ""), settled(stub("b", "web", 2, "run", "running", "running"))}, "b", true},
		{"dead task", []*api.AllocationListStub{stub("b", "web", 2, "run", "running", "dead")}, "", false},
		{"same version", []*api.AllocationListStub{settled(stub("b", "web", 1, "run", "running", "running"))}, "", false},
		{"other group", []*api.AllocationListStub{settled(stub("b", "db", 2, "run", "running", "running"))}, "", false},
		{"being stopped", []*api.AllocationListStub{settled(stub("b", "web", 2, "stop", "running", "running"))}, "", false},
		{"lost", []*api.AllocationListStub{settled(stub("b", "web", 2, "run", "lost", "running"))}, "", false},
		{"pending, said it waits (start on_lock)", []*api.AllocationListStub{{ID: "b", TaskGroup: "web", JobVersion: 2, DesiredStatus: "run", ClientStatus: "pending",
			TaskStates: map[string]*api.TaskState{"app": waitingEv}}}, "b", true},
	} {
		got, waiting := holderSuccessor(self, tc.stubs, "app")
		id := ""
		if got != nil {
			id = got.ID
		}
		if id != tc.want || waiting != tc.wantWaiting {
			t.Errorf("%s: successor %q waiting %v, want %q %v", tc.name, id, waiting, tc.want, tc.wantWaiting)
		}
	}
}

// settled makes the stub's task one that started a while ago.
func settled(a *api.AllocationListStub) *api.AllocationListStub {
	for _, st := range a.TaskStates {
		st.StartedAt = time.Now().Add(-time.Minute)
	}
	return a
}

// Only Nomad's update-stop delays: a stop for any other reason (job
// stopped, scale-down, canary promotion's "not needed") does not.
func TestUpdateStopIsOnlyTheRollingUpdate(t *testing.T) {
	for _, tc := range []struct {
		desired, desc string
		want          bool
	}{
		{"stop", "alloc is being updated due to job update", true},
		{"stop", "alloc not needed due to job update", false},
		{"stop", "alloc not needed since job was stopped", false},
		{"run", "alloc is being updated due to job update", false},
		{"evict", "alloc is being updated due to job update", false},
	} {
		a := versioned("a", "web", 1, tc.desired)
		a.DesiredDescription = tc.desc
		if got := updateStop(a); got != tc.want {
			t.Errorf("%s / %q: %v, want %v", tc.desired, tc.desc, got, tc.want)
		}
	}
}

// A gate takes the same rule as a driver task: Attach gives its run the
// update hook, so an old-version gate gives way to a newer version and one
// being stopped never acquires; update_grace = 0 turns it off.
func TestGateHasTheUpdateRule(t *testing.T) {
	srv := locktest.New()
	cfg := lockclient.Config{Path: "locks/web", Timing: locktest.Timing(),
		Holder: lockclient.Holder{AllocID: "standby", JobID: "web", Group: "web", Task: "gate"}}
	spec := Spec{Config: Config{Path: cfg.Path}, Gate: &GateSpec{AllocID: "standby", Task: "gate"}, Holder: cfg.Holder}
	env := Env{Locker: srv.Locker(t, cfg), Emitter: discard{}, Allocs: srv.Allocs(t, allocs.Config{Holder: cfg.Holder}),
		Getenv: func(string) string { return "" }}
	names := func() []string {
		_, hooks, err := Attach(spec, env)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range hooks {
			if _, ok := h.(PreAcquireHook); ok {
				out = append(out, h.Name())
			}
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"step-down", "gate", "update"}) {
		t.Errorf("a gate's PreAcquire hooks are %v, want the step-down's, the gate's and the update rule's", got)
	}
	spec.UpdateGrace = DurationOff
	if got := names(); slices.Contains(got, "update") {
		t.Errorf("update_grace = 0: a gate still has the update hook (%v)", got)
	}
}

// The driver's supervisor reads allocations in the namespace Nomad's task
// config names, never in one the job's env block put in NOMAD_NAMESPACE;
// lock, which runs as the task, takes its environment's.
func TestUpdateHookNamespaceNotFromTheTaskEnv(t *testing.T) {
	env := func(k string) string {
		if k == "NOMAD_NAMESPACE" {
			return "from-env"
		}
		return ""
	}
	for _, tc := range []struct {
		name, rootSecrets, want string
	}{
		{"driver", "/alloc/app/secrets", "default"},
		{"lock", "", "from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := lockclient.Holder{AllocID: "standby", JobID: "web", Group: "web", Task: "app"}
			cfg := Config{Namespace: "default", RootSecretsDir: tc.rootSecrets}
			if h := newUpdateHook(cfg, holder, true, env); h == nil || h.namespace != tc.want {
				t.Fatalf("update hook %+v, want namespace %q", h, tc.want)
			}
		})
	}
}
