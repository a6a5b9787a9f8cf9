package shim

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Table tests of the gate's hook (hook_gate.go), one per phase it takes
// part in, over the in-memory lock and the in-memory servers' view of the
// allocations (locktest; the rig is gate_run_test.go's). Each row says
// what a user would notice: whether the gate takes the lock or refuses
// (with its exit code and event), when its gated tasks may start, whether
// it drains, and whether the lock is released, kept, or marked clean.

// maybe is an expectation a row may leave open.
type maybe int

const (
	unchecked maybe = iota
	yes
	no
)

// check fails t if got is not what m expects.
func (m maybe) check(t *testing.T, what string, got bool) {
	t.Helper()
	if m != unchecked && got != (m == yes) {
		t.Errorf("%s: %v, want %v", what, got, m == yes)
	}
}

// PreAcquire: the gate checks its job, records whether it kills every
// gated task itself, takes a restarted gate's lease over, and gives up the
// wait for the lock once its allocation is being stopped.
func TestGateHookPreAcquire(t *testing.T) {
	badJob := func(r *gateRig) {
		bad := gateJob{id: gateAlloc}.alloc()
		bad.Job.TaskGroups[0].Tasks[0].Lifecycle = nil
		r.srv.SetAllocation(bad)
	}
	adopt := func(free bool, fenceBoot time.Duration) func(r *gateRig) {
		return func(r *gateRig) {
			r.srv.TakeOver(time.Second) // locktest-lock-1: the previous run's
			if free {
				r.srv.Free()
			}
			fence, _ := r.srv.LastGrant()
			r.spec.Gate.Adopt = &AdoptLease{LockID: "locktest-lock-1", Fence: fence}
			if fenceBoot != 0 {
				r.spec.Gate.Adopt.FenceBoot = lockclient.BootNanos(lockclient.BootNow().Add(fenceBoot))
			}
		}
	}
	otherHolds := func(r *gateRig) { r.srv.TakeOver(time.Second) }
	for _, tc := range []struct {
		name   string
		direct []string // the gated tasks the gate kills itself (nil: no killer)
		// before changes the servers or the spec before the run; waiting,
		// once the gate waits for another holder.
		before, waiting func(r *gateRig)
		code            int // 0: the gate holds
		adopted         bool
		// acquires: an acquire was sent (a standby waits on blocking reads
		// while it sees the lock held: its deferrals never try it).
		acquires    bool
		gatedDirect string // the holder record's gated_direct
		says        []string
	}{
		{name: "a job it can gate, no direct kill on this client: takes the lock", acquires: true,
			says: []string{"Gate leaves to Nomad (no direct kill on this client): app (docker), db (podman)"}},
		{name: "every gated task killed directly: the holder's record says so", direct: []string{"app", "db"}, acquires: true, gatedDirect: "true",
			says: []string{"kills and proves dead itself, whenever it stops other than by Nomad's stop of the allocation: app (docker), db (podman)"}},
		{name: "one gated task left to Nomad: not recorded", direct: []string{"app"}, acquires: true,
			says: []string{"itself, whenever it stops other than by Nomad's stop of the allocation: app (docker)",
				"Gate leaves to Nomad (no driver kill for them): db (podman)"}},
		{name: "a job it cannot gate: refused, ExitConfig, no acquire", before: badJob, code: ExitConfig,
			says: []string{"Gate not started: ", "sidecar = true"}},
		{name: "an identity that may not read the allocation: refused, ExitPermission, no acquire",
			before: func(r *gateRig) { r.srv.RemoveAllocation(gateAlloc) }, code: ExitPermission,
			says: []string{"Gate not started: ", `"read-job"`, gateWho}},
		{name: "a restarted gate whose lease is held: taken over, no acquire", before: adopt(false, 0), adopted: true,
			says: []string{"Took over lock (fence "}},
		{name: "a restarted gate whose lease is gone: ExitLost", before: adopt(true, 0), code: ExitLost,
			says: []string{"could not take over its lease"}},
		{name: "a restarted gate past its lease's fence deadline: ExitLost", before: adopt(false, -time.Second), code: ExitLost,
			says: []string{"could not take over its lease", "passed its fence deadline"}},
		{name: "waiting, the allocation being stopped: the wait ends", before: otherHolds,
			waiting: func(r *gateRig) { r.setAlloc(gateJob{desired: api.AllocDesiredStatusStop, apps: twoApps}) },
			code:    128 + int(syscall.SIGTERM), says: []string{"Allocation stopped while waiting for the lock"}},
		{name: "waiting, the allocation evicted: the wait ends", before: otherHolds,
			waiting: func(r *gateRig) { r.setAlloc(gateJob{desired: api.AllocDesiredStatusEvict, apps: twoApps}) },
			code:    128 + int(syscall.SIGTERM), says: []string{"Allocation stopped while waiting for the lock"}},
		{name: "waiting, the allocation gone: the wait ends", before: otherHolds,
			waiting: func(r *gateRig) { r.srv.RemoveAllocation(gateAlloc) },
			code:    128 + int(syscall.SIGTERM), says: []string{"Allocation stopped while waiting for the lock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newGateRig(t, gateJob{gatedState: "running", apps: twoApps})
			if tc.direct != nil {
				r.withKiller(tc.direct...)
			}
			if tc.before != nil {
				tc.before(r)
			}
			r.run()
			if tc.waiting != nil {
				r.event("waiting on the other holder", func(ev Event) bool {
					return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc
				})
				tc.waiting(r)
			}
			if tc.code == 0 {
				ev := r.holding()
				if fence, _ := r.srv.LastGrant(); tc.adopted && ev.Fence != fence {
					t.Errorf("holding fence %d, want the adopted lease's %d", ev.Fence, fence)
				}
				if got := r.srv.Items()["gated_direct"]; got != tc.gatedDirect {
					t.Errorf("gated_direct = %q, want %q", got, tc.gatedDirect)
				}
			} else {
				if code := r.exit(); code != tc.code {
					t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
				}
				if _, ok := r.find(func(ev Event) bool { return ev.State.Holds() }); ok {
					t.Errorf("the gate held the lock; events:\n%s", r.eventLog())
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

// Held: the gated tasks may start (the gate holding) only once the
// previous holder's are dead: at once after a clean release, else once
// Nomad reports them dead for good, or their client out of the servers'
// reach when that gate killed them itself (gated_direct). A lease lost
// meanwhile fails the gate before its gated tasks start.
func TestGateHookHeld(t *testing.T) {
	record := func(alloc string, clean, direct bool) map[string]string {
		m := map[string]string{"holder_alloc_id": alloc, "holder_node": locktest.OtherNode}
		if clean {
			m["released_clean"] = "true"
		}
		if direct {
			m["gated_direct"] = "true"
		}
		return m
	}
	prev := func(gated, clientStatus string, gateState string) *api.Allocation {
		a := gateJob{id: locktest.OtherAlloc, gatedState: gated, clientStatus: clientStatus}.alloc()
		if gateState != "" {
			a.TaskStates[gateTask] = &api.TaskState{State: gateState}
		}
		return a
	}
	for _, tc := range []struct {
		name string
		// items is the previous holder's record; expires: it holds the
		// lock until the server expires it (else the lock is free).
		items   map[string]string
		expires bool
		prev    *api.Allocation // the previous holder's allocation (nil: gone)
		// then, once the gate waits, changes the servers' view so that
		// the wait ends (nil: the gate must not wait).
		then func(r *gateRig)
		lost bool // then takes the lock away: the gate fails, ExitLost
	}{
		{name: "released clean: at once", items: record(locktest.OtherAlloc, true, false), prev: prev("running", "", "running")},
		{name: "unclean, the previous allocation gone: at once", items: record(locktest.OtherAlloc, false, false)},
		{name: "unclean, the previous gated tasks dead: at once", items: record(locktest.OtherAlloc, false, false), prev: prev("dead", "", "running")},
		{name: "unclean, the previous allocation complete: at once", items: record(locktest.OtherAlloc, false, false),
			prev: prev("running", api.AllocClientStatusComplete, "running")},
		{name: "the previous holder was this allocation: at once", items: record(gateAlloc, false, false)},
		{name: "unclean, the previous gated tasks running: until reported dead", items: record(locktest.OtherAlloc, false, false),
			prev: prev("running", "", "running"),
			then: func(r *gateRig) { r.srv.SetAllocation(prev("dead", "", "running")) }},
		{name: "unclean, the previous node lost: until its gated tasks are reported dead", items: record(locktest.OtherAlloc, false, false),
			prev: prev("running", api.AllocClientStatusLost, "running"),
			then: func(r *gateRig) { r.srv.SetAllocation(prev("dead", api.AllocClientStatusLost, "running")) }},
		{name: "gated_direct, its client lost: at once", items: record(locktest.OtherAlloc, false, true), expires: true,
			prev: prev("running", api.AllocClientStatusLost, "running")},
		{name: "gated_direct, its client unknown: at once", items: record(locktest.OtherAlloc, false, true), expires: true,
			prev: prev("running", api.AllocClientStatusUnknown, "running")},
		{name: "gated_direct, released behind its back, its gate dead, its gated task running: until reported dead",
			items: record(locktest.OtherAlloc, false, true), prev: prev("running", "", "dead"),
			then: func(r *gateRig) { r.srv.SetAllocation(prev("dead", "", "dead")) }},
		{name: "gated_direct, its gate dead, its gated task pending a restart: until reported dead",
			items: record(locktest.OtherAlloc, false, true), prev: prev("pending", "", "dead"),
			then: func(r *gateRig) { r.srv.SetAllocation(prev("dead", "", "dead")) }},
		{name: "gated_direct, its gate running, its gated task pending: until the allocation failed",
			items: record(locktest.OtherAlloc, false, true), prev: prev("pending", "", "running"),
			then: func(r *gateRig) { r.srv.SetAllocation(prev("pending", api.AllocClientStatusFailed, "dead")) }},
		{name: "unclean, the lock lost while it waits: ExitLost, its gated tasks never start",
			items: record(locktest.OtherAlloc, false, false), prev: prev("running", "", "running"),
			then: func(r *gateRig) { r.srv.TakeOver(time.Second) }, lost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Its own allocation shows its gated tasks running: a previous
			// holder that is this allocation is no previous holder.
			r := newGateRig(t, gateJob{gatedState: "running"})
			if tc.prev != nil {
				r.srv.SetAllocation(tc.prev)
			}
			if tc.expires {
				r.srv.TakeOver(300 * time.Millisecond)
			}
			r.srv.SetItems(tc.items)
			r.run()
			if tc.expires {
				r.event("waiting on the other holder", func(ev Event) bool { return ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc })
				r.srv.Expire()
			}
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
			// The servers' view changes, twice: the gate looked again,
			// and still waits.
			r.poke()
			if _, held := r.find(inState(StateHolding)); held {
				t.Fatalf("the gate let its tasks start before the previous holder's were reported dead; events:\n%s", r.eventLog())
			}
			tc.then(r)
			if tc.lost {
				if code := r.exit(); code != ExitLost {
					t.Errorf("exit %d, want ExitLost; events:\n%s", code, r.eventLog())
				}
				if _, held := r.find(inState(StateHolding)); held || !r.message("Lock lost: ") {
					t.Errorf("held %v; want no holding and a lost event; events:\n%s", held, r.eventLog())
				}
				return
			}
			r.holding()
		})
	}
}

// Holding: once the servers want the gate's allocation stopped (or it is
// gone), the gate drains the run (the PreKill hooks, the LB REMOVE, run
// then, before Nomad kills the gated tasks); while it runs on, nothing.
func TestGateHookHolding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *gateRig) // nil: the allocation runs on
	}{
		{"the allocation runs on: no drain", nil},
		{"the allocation being stopped: drained", func(r *gateRig) { r.setAlloc(gateJob{desired: api.AllocDesiredStatusStop, gatedState: "running"}) }},
		{"the allocation evicted: drained", func(r *gateRig) { r.setAlloc(gateJob{desired: api.AllocDesiredStatusEvict, gatedState: "running"}) }},
		{"the allocation gone: drained", func(r *gateRig) { r.srv.RemoveAllocation(gateAlloc) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newGateRig(t, gateJob{gatedState: "running"})
			lease := r.checkedAndHeld()
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			events, err := r.gate().Holding(ctx, lease)
			if err != nil {
				t.Fatalf("Holding: %v", err)
			}
			if tc.change == nil {
				r.poke()
				select {
				case ev := <-events:
					t.Fatalf("event %+v while the allocation runs on", ev)
				default:
				}
				return
			}
			tc.change(r)
			select {
			case ev := <-events:
				if !ev.Drain || ev.Fail != nil || ev.Message != "" {
					t.Errorf("event %+v, want a drain alone", ev)
				}
			case <-time.After(ceiling):
				t.Fatalf("no drain within %s of the allocation's stop", ceiling)
			}
		})
	}
}

// Stopping: what the gate knew of its allocation when Nomad's stop arrived
// decides the release, not what is true by then. A stop its watch had seen
// coming is Nomad's stop of the allocation; one it had not is decided by a
// read made at once (N9: a restart of the gate that raced a stop of the
// allocation releases only if the servers report every gated task dead or
// the gate killed them all itself). The gate never holds a stop back.
func TestGateHookStopping(t *testing.T) {
	stopped := func(gated string) gateJob {
		return gateJob{desired: api.AllocDesiredStatusStop, gatedState: gated, apps: twoApps}
	}
	runsOn := gateJob{gatedState: "running", apps: twoApps}
	for _, tc := range []struct {
		name   string
		direct []string
		end    Ending // "" is EndStopRequest
		// own is the gated tasks' state on the servers before the stop
		// ("" running); seen: the watch saw the allocation stopped before
		// the stop arrived; atStop, else, is the servers' view then (nil:
		// unchanged), and afterStop their view by the release (nil: the
		// same).
		own              string
		seen             bool
		atStop           *gateJob
		gone             bool // the allocation is gone when the stop arrives
		afterStop        *gateJob
		released, clean  bool
		kills, readAtEnd maybe // the gate killed its gated tasks; read the allocation as the stop arrived
	}{
		// L3: a restart of the gate racing the stop comes while the gated
		// tasks run (in the group's shutdown_delay): what the gate cannot
		// prove dead itself, the next gate learns from Nomad.
		{name: "seen by the watch before the stop, no killer", seen: true, released: true, readAtEnd: no},
		{name: "seen by the watch before the stop, all killed directly", direct: []string{"app", "db"}, seen: true,
			released: true, clean: true, kills: yes, readAtEnd: no},
		{name: "seen, all killed directly, one shown pending (Nomad's kill cancels its restart)", direct: []string{"app", "db"}, own: "pending",
			seen: true, released: true, clean: true, kills: yes},
		{name: "read at the stop: gated tasks reported dead", atStop: ptr(stopped("dead")), released: true, clean: true, kills: no, readAtEnd: yes},
		{name: "read at the stop: gated tasks running, no killer", atStop: ptr(stopped("running"))},
		{name: "read at the stop: gated tasks running, one left to Nomad", direct: []string{"app"}, atStop: ptr(stopped("running")), kills: yes},
		{name: "read at the stop: gated tasks running, all killed directly", direct: []string{"app", "db"}, atStop: ptr(stopped("running")),
			released: true, clean: true, kills: yes},
		{name: "read at the stop: the allocation runs on (a restart): kept, nothing killed", direct: []string{"app", "db"}, atStop: &runsOn, kills: no},
		{name: "read at the stop: the allocation gone: released clean, nothing killed", direct: []string{"app", "db"}, gone: true,
			released: true, clean: true, kills: no},
		{name: "read at the stop: it runs on, stopped by the release: still kept for the restarted gate", direct: []string{"app", "db"},
			atStop: &runsOn, afterStop: ptr(stopped("dead")), kills: no},
		{name: "a signal: nothing read; the gate kills its gated tasks and releases clean", direct: []string{"app", "db"}, end: EndSignal,
			released: true, clean: true, kills: yes, readAtEnd: no},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newGateRig(t, gateJob{gatedState: cmp.Or(tc.own, "running"), apps: twoApps})
			var f *fakeGated
			if tc.direct != nil {
				f = r.withKiller(tc.direct...)
			}
			lease := r.checkedAndHeld()
			g := r.gate()
			if tc.seen {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				events, err := g.Holding(ctx, lease)
				if err != nil {
					t.Fatal(err)
				}
				r.setAlloc(stopped(cmp.Or(tc.own, "running")))
				select {
				case <-events:
				case <-time.After(ceiling):
					t.Fatal("the watch did not see the allocation stopped")
				}
			}
			switch {
			case tc.gone:
				r.srv.RemoveAllocation(gateAlloc)
			case tc.atStop != nil:
				r.setAlloc(*tc.atStop)
			}
			end := cmp.Or(tc.end, EndStopRequest)
			reads := r.srv.Calls(locktest.OpAlloc)
			var resp StoppingResponse
			if g.Stopping(context.Background(), StoppingRequest{End: end, Budget: time.Minute}, &resp); resp.Delay != nil {
				t.Errorf("the gate held the stop back")
			}
			tc.readAtEnd.check(t, "read the allocation as the stop arrived", r.srv.Calls(locktest.OpAlloc) > reads)
			if tc.afterStop != nil {
				r.setAlloc(*tc.afterStop)
			}
			r.finish(lease, end)
			released, clean := r.srv.Calls(locktest.OpRelease) > 0, r.srv.Items()["released_clean"] == "true"
			if released != tc.released || clean != tc.clean {
				t.Errorf("released %v, marked clean %v; want %v, %v; events:\n%s", released, clean, tc.released, tc.clean, r.eventLog())
			}
			if !released && !r.srv.Held() {
				t.Errorf("the lock is free, but not released by the gate (%s)", r.srv)
			}
			kills := 0
			if f != nil {
				kills, _ = f.calls()
			}
			tc.kills.check(t, "the gate killed its gated tasks", kills > 0)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Release: every ending of a gate that holds the lock, and what it does
// with the lock and the gated tasks. Only Nomad's own stop of the
// allocation releases without the gate's own kill; a gate that kills every
// gated task itself and proves them dead releases clean, before the lock
// can pass and while it is still ours; every other ending keeps the lock
// for the server to expire, so that the gated tasks, which Nomad kills
// only once the gate failed, are dead first. A gate exits 0 only when
// Nomad stopped it.
func TestGateHookRelease(t *testing.T) {
	retry := gateKillRetryFor
	gateKillRetryFor = time.Second
	t.Cleanup(func() { gateKillRetryFor = retry })
	stopRequest := func(r *gateRig) { r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second} }
	allocStop := func(desired string) func(r *gateRig) {
		return func(r *gateRig) {
			r.setAlloc(gateJob{desired: desired, gatedState: "dead", apps: r.apps})
			stopRequest(r)
		}
	}
	signal := func(r *gateRig) { r.sigs <- syscall.SIGTERM }
	oneApp := []GatedTask{{Name: "app", Driver: "docker"}}
	for _, tc := range []struct {
		name    string
		apps    []GatedTask // nil: twoApps
		direct  []string    // nil: no killer
		killErr error
		lease   bool   // lease mode
		command string // the gate's own command ("": none)
		// pending makes db pending a restart Nomad scheduled before the
		// gate's kill.
		pending bool
		end     func(r *gateRig) // nil: the command ends
		lost    bool             // the ending takes the lock away
		code    int
		kills   maybe
		// released: the gate released the lock; clean: marked clean.
		released, clean bool
		event           string
	}{
		{name: "stop request, allocation being stopped", apps: oneApp, direct: []string{"app"}, end: allocStop(api.AllocDesiredStatusStop),
			released: true, clean: true, event: "Released lock"},
		{name: "stop request, allocation evicted", apps: oneApp, direct: []string{"app"}, end: allocStop(api.AllocDesiredStatusEvict),
			released: true, clean: true, event: "Released lock"},
		{name: "stop request, allocation gone", apps: oneApp, direct: []string{"app"},
			end:      func(r *gateRig) { r.srv.RemoveAllocation(gateAlloc); stopRequest(r) },
			released: true, clean: true, event: "Released lock"},
		{name: "stop request, allocation runs on (a restart of the gate)", apps: oneApp, end: stopRequest,
			event: "Lock kept for the restarted gate: Nomad stopped the gate while its allocation keeps running"},
		{name: "SIGTERM to the supervisor: the gate fails, so Nomad kills the gated tasks", apps: oneApp, end: signal, code: 1,
			event: "Lock kept: the gate stopped by itself"},
		{name: "lock taken by another holder (409)", apps: oneApp, end: func(r *gateRig) { r.srv.TakeOver(time.Second) }, lost: true,
			code: ExitLost, event: "Gate lost the lock"},
		{name: "lock released behind its back", apps: oneApp, end: func(r *gateRig) { r.srv.Free() }, lost: true,
			code: ExitLost, event: "Gate lost the lock"},
		{name: "lock lost (409), all direct: killed, not released", direct: []string{"app", "db"}, end: func(r *gateRig) { r.srv.TakeOver(time.Second) },
			lost: true, code: ExitLost, kills: yes, event: "it killed app, db itself, proven dead"},
		{name: "lock lost, one task left to Nomad", direct: []string{"app"}, end: func(r *gateRig) { r.srv.Free() },
			lost: true, code: ExitLost, kills: yes, event: "Nomad kills the gated tasks (db)"},
		{name: "signal, all direct: killed, released clean", direct: []string{"app", "db"}, end: signal,
			code: 1, kills: yes, released: true, clean: true, event: "Gate killed app, db itself"},
		{name: "signal, all direct, a restart pending from before the kill: killed, released, not marked clean", direct: []string{"app", "db"},
			pending: true, end: signal, code: 1, kills: yes, released: true, event: "Gate killed app, db itself"},
		{name: "signal, one task left to Nomad: killed, lock kept", direct: []string{"app"}, end: signal,
			code: 1, kills: yes, event: "Lock kept: the gate stopped by itself"},
		{name: "signal, the kill fails: lock kept, no longer marked direct", direct: []string{"app", "db"}, killErr: errors.New("docker: no answer"),
			end: signal, code: 1, kills: yes, event: "Gate could not prove app, db dead"},
		{name: "Nomad's stop of the allocation, all direct: Nomad's kill, released clean", direct: []string{"app", "db"},
			end: allocStop(api.AllocDesiredStatusStop), released: true, clean: true, event: "Released lock"},
		{name: "a restart of the gate, all direct: no kill, lock kept for the restarted gate", direct: []string{"app", "db"}, end: stopRequest,
			kills: no, event: "Lock kept for the restarted gate: Nomad stopped the gate while its allocation keeps running"},
		{name: "lease mode, a restart of the gate: no kill, lease kept for the restarted gate (C1)", direct: []string{"app", "db"}, lease: true,
			end: stopRequest, kills: no, event: "Lock kept for the restarted gate"},
		{name: "its command exits 0, all killed directly: released clean, exit 1", direct: []string{"app", "db"}, command: "exit 0",
			code: 1, kills: yes, released: true, clean: true},
		{name: "its command exits 0, one left to Nomad: lock kept, exit 1", direct: []string{"app"}, command: "exit 0",
			code: 1, kills: yes},
		{name: "its command exits 3, no killer: lock kept, exit 3", command: "exit 3", code: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			apps := tc.apps
			if apps == nil {
				apps = twoApps
			}
			job := gateJob{gatedState: "running", apps: apps}
			r := newGateRig(t, job)
			r.apps = apps
			if tc.pending {
				a := job.alloc()
				a.ID = gateAlloc
				a.TaskStates["db"] = &api.TaskState{State: "pending", Events: []*api.TaskEvent{
					{Type: api.TaskTerminated, Time: time.Now().Add(-5 * time.Second).UnixNano()},
					{Type: api.TaskRestarting, Time: time.Now().Add(-5 * time.Second).UnixNano()}}}
				r.srv.SetAllocation(a)
			}
			if tc.lease {
				r.spec.Mode = ModeLease
			}
			if tc.command != "" {
				r.spec.Command = []string{"/bin/sh", "-c", "sleep 0.2; " + tc.command}
				r.env.Process.Env = []string{"PATH=/usr/bin:/bin"}
			}
			var f *fakeGated
			if tc.direct != nil {
				f = r.withKiller(tc.direct...)
				f.killErr = tc.killErr
			}
			r.run()
			if tc.end != nil {
				r.holding()
				tc.end(r)
			}
			if code := r.exit(); code != tc.code {
				t.Errorf("exit %d, want %d; events:\n%s", code, tc.code, r.eventLog())
			}
			released, clean := r.srv.Calls(locktest.OpRelease) > 0, r.srv.Items()["released_clean"] == "true"
			if released != tc.released || clean != tc.clean {
				t.Errorf("released %v, marked clean %v; want %v, %v (%s); events:\n%s", released, clean, tc.released, tc.clean, r.srv, r.eventLog())
			}
			if !tc.lost && !released && !r.srv.Held() {
				t.Errorf("the lock is free, but not released by the gate (%s)", r.srv)
			}
			if f != nil {
				kills, _ := f.calls()
				tc.kills.check(t, "the gate killed its gated tasks", kills > 0)
				if kills > 0 && !tc.lost && !f.heldAtKill {
					t.Errorf("the lock was free when the gate killed its gated tasks")
				}
				if kills > 0 {
					r.checkReleasesAfterDeath(0)
				}
			}
			if tc.killErr != nil && r.srv.Items()["gated_direct"] != "" {
				t.Errorf("the lock still says the gate kills its tasks itself after a kill that failed")
			}
			if tc.event != "" && !r.message(tc.event) {
				t.Errorf("no event says %q; events:\n%s", tc.event, r.eventLog())
			}
		})
	}
}

// finish runs the core's release (heldRun.finish) of lease for a run that
// ends by end: the Release hooks, then the release as they allow.
func (r *gateRig) finish(lease *lockclient.Lease, end Ending) {
	r.t.Helper()
	if r.sup.Logger == nil {
		r.sup.Logger = hclog.NewNullLogger()
	}
	run := &heldRun{s: r.sup, lease: lease, w: r.sup.Workload, log: r.sup.Logger}
	run.finish(end)
}

// poke changes the servers' view of an allocation of no concern to the
// run, twice, and waits each time for a read of an allocation, which it
// wakes: once the second read is answered, the run has weighed what the
// first one showed.
func (r *runRig) poke() {
	r.t.Helper()
	for i := range 2 {
		n := r.srv.Calls(locktest.OpAlloc)
		r.srv.SetAllocation(&api.Allocation{ID: "unrelated-" + string(rune('a'+i))})
		for deadline := time.Now().Add(ceiling); r.srv.Calls(locktest.OpAlloc) <= n; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				r.t.Fatalf("no read of an allocation within %s of a change; events:\n%s", ceiling, r.eventLog())
			}
		}
	}
}
