package shim

import (
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Tests of a run that Nomad sees start only once it holds the lock (the
// driver's start = "on_lock"): Spec.WatchAlloc over the in-memory lease
// and the in-memory servers' view of its allocation.

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

// A holder's run is as without the watch: it takes the lock and runs the
// workload.
func TestWatchAllocHolderRuns(t *testing.T) {
	r := newWatchRig(t, api.AllocDesiredStatusRun)
	r.run()
	if pid := r.holding(); pid <= 0 {
		t.Fatalf("no workload PID in the holding event")
	}
}

// A standby waiting for the lock gives up when its allocation is being
// stopped (Nomad cannot stop a task whose start has not returned), and
// never runs the workload.
func TestWatchAllocWaitingAllocationStopped(t *testing.T) {
	for _, stop := range []struct {
		name   string
		change func(r *runRig)
	}{
		{"desired stop", func(r *runRig) {
			r.srv.SetAllocation(&api.Allocation{ID: "alloc-self", DesiredStatus: api.AllocDesiredStatusStop})
		}},
		{"evicted", func(r *runRig) {
			r.srv.SetAllocation(&api.Allocation{ID: "alloc-self", DesiredStatus: api.AllocDesiredStatusEvict})
		}},
		{"gone", func(r *runRig) { r.srv.RemoveAllocation("alloc-self") }},
	} {
		t.Run(stop.name, func(t *testing.T) {
			r := newWatchRig(t, api.AllocDesiredStatusRun)
			r.srv.TakeOver(ceiling)
			r.run()
			r.event("waiting", func(ev Event) bool { return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc })
			stop.change(r)
			if code := r.exit(); code != 128+int(syscall.SIGTERM) {
				t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
			}
			if _, ok := r.find(func(ev Event) bool { return ev.State.Holds() }); ok {
				t.Errorf("the standby held the lock; events:\n%s", r.eventLog())
			}
			if _, ok := r.find(func(ev Event) bool {
				return strings.Contains(ev.Message, "Allocation stopped while waiting for the lock")
			}); !ok {
				t.Errorf("no event says why it stopped waiting; events:\n%s", r.eventLog())
			}
			if strings.Contains(r.out.String(), "started") {
				t.Errorf("the workload ran: %q", r.out.String())
			}
		})
	}
}

// Without read-job the run could not notice a stop while it waits: it
// refuses to start, with an error that names the capability, the policy
// and what reads the allocation, and never asks for the lock.
func TestWatchAllocWithoutReadJob(t *testing.T) {
	r := newWatchRig(t, "")
	r.run()
	if code := r.exit(); code != ExitPermission {
		t.Errorf("exit %d, want ExitPermission (%d)", code, ExitPermission)
	}
	ev, ok := r.find(func(ev Event) bool { return strings.HasPrefix(ev.Message, evWatchNotStarted.Prefix) })
	if !ok {
		t.Fatalf("no event says why; events:\n%s", r.eventLog())
	}
	for _, want := range []string{`"read-job"`, "nomad acl policy apply", "A task that starts on lock watches its allocation"} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("the event does not say %q: %s", want, ev.Message)
		}
	}
	if n := r.srv.Calls(locktest.OpAcquire); n != 0 {
		t.Errorf("%d acquire requests without read-job", n)
	}
}
