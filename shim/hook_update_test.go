package shim

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Table tests of the update rule (hook_update.go), one per phase it takes
// part in, over the in-memory servers' view of the job's allocations
// (locktest). The standby or holder is allocation "standby" of job web,
// group web, task app, job version 1 (update_test.go's updateRig).

// emitted is an Emitter that keeps what a hook publishes.
type emitted struct {
	mu     sync.Mutex
	events []Event
}

func (e *emitted) Emit(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
}

func (e *emitted) Notice(ev Event) {
	ev.Notice = true
	e.Emit(ev)
}

// messages are the published events' messages that begin with prefix.
func (e *emitted) messages(prefix string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		if strings.HasPrefix(ev.Message, prefix) {
			out = append(out, ev.Message)
		}
	}
	return out
}

// PreAcquire: while the lock looks free, the acquire asks the rule (its
// Defer) whether to take it. A standby of an older version gives way, for
// update_grace, to a newer version of its group on its way to the lock,
// and says so once; one the servers want stopped never takes it; and one
// that cannot read the allocations takes it at once.
func TestUpdateHookPreAcquire(t *testing.T) {
	pending := func(id string, v uint64) *api.Allocation {
		a := jobAlloc(id, v, "run", "pending")
		a.TaskStates = nil
		return a
	}
	with := func(a *api.Allocation, f func(*api.Allocation)) *api.Allocation { f(a); return a }
	for _, tc := range []struct {
		name   string
		self   *api.Allocation // nil: not shown
		others []*api.Allocation
		grace  time.Duration // update_grace (0: the default)
		// wantGrace and wantHold are the rule's answer; jobRead: it read
		// the job's allocations; says: its one notice (prefix and words).
		wantGrace time.Duration
		wantHold  bool
		jobRead   bool
		says      []string
	}{
		{name: "no newer version on its way: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"), jobRead: true},
		{name: "a newer version placed: gives way for the grace, said once", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{pending("successor", 2)}, wantGrace: DefaultUpdateGrace, jobRead: true,
			says: []string{evUpdateGivingWay.Prefix + "10s to allocation successo of job version 2"}},
		{name: "a newer version running its task: gives way", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{jobAlloc("successor", 2, "run", "running")}, wantGrace: DefaultUpdateGrace, jobRead: true,
			says: []string{evUpdateGivingWay.Prefix}},
		{name: "update_grace = 3s: gives way for 3s", self: jobAlloc("standby", 1, "run", "running"), grace: 3 * time.Second,
			others: []*api.Allocation{pending("successor", 2)}, wantGrace: 3 * time.Second, jobRead: true,
			says: []string{evUpdateGivingWay.Prefix + "3s to allocation"}},
		{name: "the newest of two newer versions is named", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{pending("second", 2), pending("third", 3)}, wantGrace: DefaultUpdateGrace, jobRead: true,
			says: []string{evUpdateGivingWay.Prefix + "10s to allocation third of job version 3"}},
		{name: "a newer version of another group: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{with(pending("db", 2), func(a *api.Allocation) { a.TaskGroup = "db" })}, jobRead: true},
		{name: "a newer version being stopped: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{jobAlloc("successor", 2, "stop", "running")}, jobRead: true},
		{name: "a newer version on a lost node: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{jobAlloc("successor", 2, "run", "lost")}, jobRead: true},
		{name: "a newer version whose task is dead: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"),
			others:  []*api.Allocation{with(jobAlloc("successor", 2, "run", "running"), func(a *api.Allocation) { a.TaskStates["app"].State = "dead" })},
			jobRead: true},
		{name: "the same version: takes the lock at once", self: jobAlloc("standby", 1, "run", "running"),
			others: []*api.Allocation{jobAlloc("peer", 1, "run", "running")}, jobRead: true},
		{name: "this allocation being stopped: holds, without reading the job's", self: jobAlloc("standby", 1, "stop", "running"),
			others: []*api.Allocation{pending("successor", 2)}, wantHold: true},
		{name: "this allocation evicted: holds", self: jobAlloc("standby", 1, "evict", "running"), wantHold: true},
		{name: "this allocation not shown: takes the lock at once, and asks again next time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, srv := updateRig(t, tc.grace)
			ev := &emitted{}
			s.h.emit = ev
			for _, a := range append([]*api.Allocation{tc.self}, tc.others...) {
				if a != nil {
					srv.SetAllocation(a)
				}
			}
			var pre PreAcquireResponse
			if err := s.h.PreAcquire(context.Background(), &pre); err != nil || pre.Defer == nil {
				t.Fatalf("PreAcquire: %v, Defer %v", err, pre.Defer != nil)
			}
			for i := range 2 {
				reads := srv.Calls(locktest.OpAlloc)
				grace, hold := pre.Defer(context.Background(), lockclient.Holder{})
				if grace != tc.wantGrace || hold != tc.wantHold {
					t.Errorf("ask %d: grace %s, hold %v; want %s, %v", i+1, grace, hold, tc.wantGrace, tc.wantHold)
				}
				if srv.Calls(locktest.OpAlloc) == reads {
					t.Errorf("ask %d: this allocation not read", i+1)
				}
			}
			if read := srv.Calls(locktest.OpJobAllocs) > 0; read != tc.jobRead {
				t.Errorf("read the job's allocations: %v, want %v", read, tc.jobRead)
			}
			got := ev.messages("")
			if len(got) != len(tc.says) {
				t.Fatalf("events %q, want %d", got, len(tc.says))
			}
			for i, want := range tc.says {
				if !strings.HasPrefix(got[i], want) {
					t.Errorf("event %q, want one that begins %q", got[i], want)
				}
			}
		})
	}
}

// Stopping: a holder stopped for a rolling update keeps its workload
// serving, the lock held, while another newer allocation is on its way,
// says so, and lets the stop go on once that one waits for the lock, goes
// away, or the budget (kill_timeout less lock.kill_timeout) is spent. Any
// other stop, a signal, a stop without budget and a gate with no command
// of its own go on at once.
func TestUpdateHookStopping(t *testing.T) {
	self := func(desc string) *api.Allocation {
		a := jobAlloc("standby", 1, "stop", "running")
		a.DesiredDescription, a.NextAllocation = desc, "mine"
		return a
	}
	starting := func() *api.Allocation {
		a := jobAlloc("other", 2, "run", "pending")
		a.TaskStates = nil
		return a
	}
	waiting := func() *api.Allocation {
		a := jobAlloc("other", 2, "run", "running")
		a.TaskStates["app"].Events = []*api.TaskEvent{{DisplayMessage: waitingHeldMessage("locks/web", lockclient.Holder{AllocID: "standby"})}}
		return a
	}
	for _, tc := range []struct {
		name   string
		allocs []*api.Allocation // the servers' view when the stop arrives
		end    Ending            // "" is EndStopRequest
		budget time.Duration     // 0: 20s
		serves bool              // false: a gate with no command
		// then changes the servers' view once the holder said it keeps
		// serving (nil: it must not wait).
		then func(srv *locktest.Server)
		// delayed: the stop is held back at all (a channel); says: the
		// notices, in order, by prefix.
		delayed bool
		says    []string
		jobRead maybe
	}{
		{name: "another kind of stop (the job stopped): at once, the job's allocations not read", serves: true, delayed: true,
			allocs: []*api.Allocation{self("alloc not needed since job was stopped"), starting()}, jobRead: no},
		{name: "only its own replacement on its way: at once", serves: true, delayed: true,
			allocs: []*api.Allocation{self(statusAllocUpdating), jobAlloc("mine", 2, "run", "pending")}, jobRead: yes},
		{name: "another newer allocation starting: keeps serving until it waits for the lock", serves: true, delayed: true,
			allocs: []*api.Allocation{self(statusAllocUpdating), jobAlloc("mine", 2, "run", "pending"), starting()},
			then:   func(srv *locktest.Server) { srv.SetAllocation(waiting()) },
			says:   []string{evUpdateKeepServe.Prefix + "20s", evUpdateSuccWait.Prefix + "other of job version 2 waits for the lock"}},
		{name: "a newer allocation already waiting: at once, saying so", serves: true, delayed: true,
			allocs: []*api.Allocation{self(statusAllocUpdating), waiting()}, says: []string{evUpdateSuccWait.Prefix}},
		{name: "the newer allocation goes away: stops then", serves: true, delayed: true,
			allocs: []*api.Allocation{self(statusAllocUpdating), starting()},
			then: func(srv *locktest.Server) {
				a := starting()
				a.DesiredStatus = "stop"
				srv.SetAllocation(a)
			},
			says: []string{evUpdateKeepServe.Prefix, evUpdateSuccGone.Prefix}},
		{name: "it never waits: the budget ends the delay", serves: true, delayed: true, budget: 300 * time.Millisecond,
			allocs: []*api.Allocation{self(statusAllocUpdating), starting()},
			then:   func(*locktest.Server) {},
			says:   []string{evUpdateKeepServe.Prefix + "300ms", evUpdateSuccLate.Prefix + "300ms"}},
		{name: "this allocation cannot be read: at once", serves: true, delayed: true, allocs: []*api.Allocation{starting()}, jobRead: no},
		{name: "a signal: no delay", serves: true, end: EndSignal, allocs: []*api.Allocation{self(statusAllocUpdating), starting()}},
		{name: "no budget (kill_timeout within lock.kill_timeout): no delay", serves: true, budget: -1,
			allocs: []*api.Allocation{self(statusAllocUpdating), starting()}},
		{name: "a gate with no command of its own: no delay", allocs: []*api.Allocation{self(statusAllocUpdating), starting()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, srv := updateRig(t, time.Second)
			s.h.serves = tc.serves
			for _, a := range tc.allocs {
				srv.SetAllocation(a)
			}
			req := StoppingRequest{End: EndStopRequest, Budget: 20 * time.Second}
			if tc.end != "" {
				req.End = tc.end
			}
			switch {
			case tc.budget < 0:
				req.Budget = 0
			case tc.budget > 0:
				req.Budget = tc.budget
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			began := time.Now()
			var resp StoppingResponse
			s.h.Stopping(ctx, req, &resp)
			delay := resp.Delay
			if (delay != nil) != tc.delayed {
				t.Fatalf("the stop held back: %v, want %v", delay != nil, tc.delayed)
			}
			var got []string
			for delay != nil {
				select {
				case msg, ok := <-delay:
					if !ok {
						delay = nil
						break
					}
					got = append(got, msg)
					if len(got) == 1 && tc.then != nil {
						tc.then(srv)
					}
				case <-time.After(ceiling):
					t.Fatalf("the delay did not end within %s (notices %q)", ceiling, got)
				}
			}
			if len(got) != len(tc.says) {
				t.Fatalf("notices %q, want %d", got, len(tc.says))
			}
			for i, want := range tc.says {
				if !strings.HasPrefix(got[i], want) {
					t.Errorf("notice %q, want one that begins %q", got[i], want)
				}
			}
			if took := time.Since(began); tc.budget > 0 && took < tc.budget {
				t.Errorf("the delay ended after %s, before its budget of %s", took, tc.budget)
			}
			tc.jobRead.check(t, "read the job's allocations", srv.Calls(locktest.OpJobAllocs) > 0)
		})
	}
}

// Release: a holder whose workload is proven dead marks its release clean
// (the mark is what tells a standby whose token is not shown the lock's
// state that the lock is free, so that an old-version standby gives way to
// a new version then too); one whose workload is not proven dead keeps
// the lock for the server to expire.
func TestUpdateHookRelease(t *testing.T) {
	for _, tc := range []struct {
		name             string
		proven           bool
		released, marked bool
	}{
		{"workload proven dead: released, marked clean", true, true, true},
		{"workload not proven dead: kept, not marked", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, srv := updateRig(t, time.Second)
			sup := &Supervisor{Locker: s.l, Hooks: []Hook{s.h}, Workload: endedWorkload{proven: tc.proven}, Logger: hclog.NewNullLogger()}
			lease, err := s.l.Acquire(context.Background(), lockclient.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			(&heldRun{s: sup, lease: lease, w: sup.Workload, log: sup.Logger}).finish(EndStopRequest)
			released := srv.Calls(locktest.OpRelease) > 0 && !srv.Held()
			marked := srv.Items()["released_clean"] == "true"
			if released != tc.released || marked != tc.marked {
				t.Errorf("released %v, marked clean %v; want %v, %v (%s)", released, marked, tc.released, tc.marked, srv)
			}
		})
	}
}

// endedWorkload is a workload that has ended, proven dead or not.
type endedWorkload struct{ proven bool }

func (endedWorkload) Start(*lockclient.Lease) (Started, error)   { return Started{}, nil }
func (endedWorkload) Exited() <-chan struct{}                    { return nil }
func (endedWorkload) ExitCode() int                              { return 0 }
func (endedWorkload) Forward(os.Signal)                          {}
func (endedWorkload) Stop(syscall.Signal, Ending) (string, bool) { return "", false }
func (endedWorkload) Gone() bool                                 { return true }
func (endedWorkload) Arm(time.Time)                              {}
func (endedWorkload) KillBound() time.Duration                   { return 0 }
func (w endedWorkload) KillAll() bool                            { return w.proven }
