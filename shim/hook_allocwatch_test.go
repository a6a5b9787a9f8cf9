package shim

import (
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Table tests of the allocation watch (hook_allocwatch.go): a run that
// Nomad sees start only once it holds the lock (the driver's start =
// "on_lock") over the in-memory lease and the in-memory servers' view of
// its allocation. Its one phase is PreAcquire.

// newWatchRig is a runRig running sleeper whose supervisor watches
// allocation "alloc-self", which the servers show with desired status
// desired ("" for none: the identity cannot read it).
func newWatchRig(t *testing.T, desired string) *runRig {
	r := newRunRig(t, sleeper, ceiling)
	if desired != "" {
		r.srv.SetAllocation(&api.Allocation{ID: "alloc-self", DesiredStatus: desired})
	}
	r.spec.WatchAlloc = &AllocWatch{AllocID: "alloc-self", Who: "A task that starts on lock watches its allocation"}
	return r
}

// PreAcquire: a run that cannot watch its allocation refuses to wait for
// the lock (a stop of the allocation could not end the wait); one that
// can takes the lock as without the watch, and gives up the wait, never
// running its workload, once its allocation is being stopped (Nomad
// cannot stop a task whose start has not returned).
func TestAllocWatchHookPreAcquire(t *testing.T) {
	stop := func(desired string) func(r *runRig) {
		return func(r *runRig) { r.srv.SetAllocation(&api.Allocation{ID: "alloc-self", DesiredStatus: desired}) }
	}
	for _, tc := range []struct {
		name    string
		desired string // the allocation's desired status ("": not shown to the identity)
		// otherHolds: another holder has the lock; waiting, once the run
		// waits for it, changes the servers' view; then frees the lock.
		otherHolds bool
		waiting    func(r *runRig)
		thenFree   bool
		code       int // 0: the run holds and runs its workload
		// acquires: an acquire was sent (a standby waits on blocking reads
		// while it sees the lock held: its deferrals never try it).
		acquires bool
		says     []string
	}{
		{name: "the allocation runs: the holder runs its workload", desired: api.AllocDesiredStatusRun, acquires: true},
		{name: "waiting, the allocation runs on: still waiting, then holds once the lock is free", desired: api.AllocDesiredStatusRun,
			otherHolds: true, waiting: func(r *runRig) { r.poke() }, thenFree: true, acquires: true},
		{name: "waiting, the allocation being stopped: the wait ends, the workload never runs", desired: api.AllocDesiredStatusRun,
			otherHolds: true, waiting: stop(api.AllocDesiredStatusStop), code: 128 + int(syscall.SIGTERM),
			says: []string{"Allocation stopped while waiting for the lock"}},
		{name: "waiting, the allocation evicted: the wait ends", desired: api.AllocDesiredStatusRun,
			otherHolds: true, waiting: stop(api.AllocDesiredStatusEvict), code: 128 + int(syscall.SIGTERM),
			says: []string{"Allocation stopped while waiting for the lock"}},
		{name: "waiting, the allocation gone: the wait ends", desired: api.AllocDesiredStatusRun,
			otherHolds: true, waiting: func(r *runRig) { r.srv.RemoveAllocation("alloc-self") }, code: 128 + int(syscall.SIGTERM),
			says: []string{"Allocation stopped while waiting for the lock"}},
		{name: "an identity without read-job: refused, ExitPermission, no acquire", code: ExitPermission,
			says: []string{evWatchNotStarted.Prefix, `"read-job"`, "nomad acl policy apply", "A task that starts on lock watches its allocation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newWatchRig(t, tc.desired)
			if tc.otherHolds {
				r.srv.TakeOver(ceiling)
			}
			r.run()
			if tc.waiting != nil {
				r.event("waiting", func(ev Event) bool { return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc })
				tc.waiting(r)
			}
			if tc.thenFree {
				if _, ok := r.find(func(ev Event) bool { return ev.State.Holds() }); ok {
					t.Fatalf("held while another holder has the lock; events:\n%s", r.eventLog())
				}
				r.srv.Free()
			}
			if tc.code == 0 {
				if pid := r.holding(); pid <= 0 {
					t.Fatalf("no workload PID in the holding event")
				}
			} else {
				if code := r.exit(); code != tc.code {
					t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
				}
				if _, ok := r.find(func(ev Event) bool { return ev.State.Holds() }); ok {
					t.Errorf("the run held the lock; events:\n%s", r.eventLog())
				}
				if strings.Contains(r.out.String(), "started") {
					t.Errorf("the workload ran: %q", r.out.String())
				}
			}
			if n := r.srv.Calls(locktest.OpAcquire); (n > 0) != tc.acquires {
				t.Errorf("%d acquires, want any: %v", n, tc.acquires)
			}
			for _, want := range tc.says {
				if !r.message(want) {
					t.Errorf("no event says %q; events:\n%s", want, r.eventLog())
				}
			}
		})
	}
}

// message reports whether an event's message contains sub.
func (r *runRig) message(sub string) bool {
	_, ok := r.find(func(ev Event) bool { return strings.Contains(ev.Message, sub) })
	return ok
}
