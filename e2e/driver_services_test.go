package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverServices: which allocations of a singleton task Nomad's own
// service catalog lists, for a task-level `service { provider = "nomad" }`
// and count = 3 (docs/services.md). With config.start = "on_lock" only the
// holder, through a graceful stop and a crash of the holder, and a stop of
// a waiting standby ends it within seconds; without it, all three.
func TestDriverServices(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"on_lock_lists_the_holder_alone", func(t *testing.T) { testDrvServiceOnLock(t, a) }},
		{"at_once_lists_every_allocation", func(t *testing.T) { testDrvServiceAtOnce(t, a) }},
	})
}

// drvServiceAllocs lists the allocations the Nomad service name lists,
// sorted.
func drvServiceAllocs(a *harness.Agent, name string) ([]string, error) {
	regs, _, err := a.API().Services().Get(name, nil)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range regs {
		out = append(out, r.AllocID)
	}
	slices.Sort(out)
	return out, nil
}

// drvWaitService waits until the service lists exactly want (sorted) and
// returns when it first did (harness.MonoNow).
func drvWaitService(t *testing.T, a *harness.Agent, name string, timeout time.Duration, want ...string) int64 {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	deadline := time.Now().Add(timeout)
	var got []string
	var err error
	for {
		got, err = drvServiceAllocs(a, name)
		if err == nil && slices.Equal(got, want) {
			return harness.MonoNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s lists allocs %v (err %v) after %s, want %v", name, got, err, timeout, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// drvCheckServiceStays checks, for d, that the service lists exactly want
// at every read.
func drvCheckServiceStays(t *testing.T, a *harness.Agent, name string, d time.Duration, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	reads := 0
	for end := time.Now().Add(d); time.Now().Before(end); reads++ {
		got, err := drvServiceAllocs(a, name)
		if err == nil && !slices.Equal(got, want) {
			t.Errorf("service %s lists allocs %v, want %v", name, got, want)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	if reads == 0 {
		t.Errorf("service %s not read", name)
	}
}

// drvOnLockStandbys waits until n allocations of the job other than holder
// are pending, their task waiting for the lock, and returns them.
func drvOnLockStandbys(t *testing.T, a *harness.Agent, j *drvJob, holder string, n int) []string {
	t.Helper()
	want := "Pending until lock " + j.lockPath() + " is held: the task starts, and Nomad registers its services, then"
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out []string
		allocs, _ := a.Allocs(j.id)
		for _, al := range allocs {
			if al.ID == holder || al.DesiredStatus != api.AllocDesiredStatusRun || al.ClientStatus != api.AllocClientStatusPending {
				continue
			}
			evs, _ := a.TaskEvents(al.ID, drvTask)
			if len(drvMatching(evs, want)) > 0 {
				out = append(out, al.ID)
			}
		}
		if len(out) == n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending allocations waiting for the lock within 60s, want %d: %s", len(out), n, a.Nomad(t, "job", "status", j.id))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// drvWaitTerminal waits until the client reports the allocation complete,
// failed or lost.
func drvWaitTerminal(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		al, _, err := a.API().Allocations().Info(allocID, nil)
		if err == nil && al.ClientTerminalStatus() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("allocation %s not terminal after %s: %s", drvShort(allocID), timeout, a.Nomad(t, "alloc", "status", allocID))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testDrvServiceOnLock(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "svc-onlock", 3)
	j.start, j.service = "on_lock", "drv-svc-onlock"
	j.run(t, a)
	first := j.waitStart(t, 90*time.Second, nil)
	holder := first.AllocID
	standbys := drvOnLockStandbys(t, a, j, holder, 2)
	drvWaitService(t, a, j.service, 60*time.Second, holder)
	drvCheckServiceStays(t, a, j.service, 5*time.Second, holder)
	out := a.Nomad(t, "service", "info", j.service)
	if !strings.Contains(out, drvShort(holder)) || strings.Contains(out, drvShort(standbys[0])) || strings.Contains(out, drvShort(standbys[1])) {
		t.Errorf("nomad service info %s: want the holder %s alone:\n%s", j.service, drvShort(holder), out)
	}
	// `nomad alloc status` shows a standby pending, waiting for the lock.
	st := a.Nomad(t, "alloc", "status", standbys[0])
	if !strings.Contains(st, "Pending until lock "+j.lockPath()) || !strings.Contains(st, "pending") {
		t.Errorf("nomad alloc status of standby %s does not show it pending and waiting for the lock:\n%s", drvShort(standbys[0]), st)
	}
	t.Logf("holder %s, standbys %s %s wait for the lock; the catalog lists the holder alone", drvShort(holder), drvShort(standbys[0]), drvShort(standbys[1]))

	// A stop of a waiting standby ends it within seconds (Nomad alone
	// could not: its StartTask has not returned).
	sup := drvSupervisor(t, standbys[0])
	t0 := harness.MonoNow()
	a.Nomad(t, "alloc", "stop", "-detach", standbys[0])
	gone := drvWaitGone(t, sup.PID, 30*time.Second)
	drvWaitTerminal(t, a, standbys[0], 30*time.Second)
	stopped := time.Duration(harness.MonoNow() - t0)
	harness.Measure(t, "onlock_standby_stop_supervisor_gone", time.Duration(gone-t0))
	harness.Measure(t, "onlock_standby_stop_alloc_terminal", stopped)
	if stopped > 20*time.Second {
		t.Errorf("the waiting standby took %s to stop, want seconds", stopped)
	}
	if evs := drvMatching(drvEvents(t, a, standbys[0]), "Allocation stopped while waiting for the lock"); len(evs) == 0 {
		t.Errorf("standby %s: no event says it stopped waiting:\n%s", drvShort(standbys[0]), drvFormatEvents(drvEvents(t, a, standbys[0])))
	}
	if recs := drvStarts(j.records(t)); len(recs) != 1 {
		t.Errorf("%d workload starts, want the holder's alone: %+v", len(recs), recs)
	}

	// Graceful stop of the holder: the catalog lists the new holder alone.
	t0 = harness.MonoNow()
	a.Nomad(t, "alloc", "stop", "-detach", holder)
	next := j.waitStart(t, 90*time.Second, func(r harness.Record) bool { return r.AllocID != holder && r.Mono > t0 })
	listed := drvWaitService(t, a, j.service, 90*time.Second, next.AllocID)
	harness.Measure(t, "onlock_graceful_stop_to_catalog_new_holder", time.Duration(listed-t0))
	harness.Measure(t, "onlock_graceful_new_start_to_catalog", time.Duration(listed-next.Mono))
	drvCheckServiceStays(t, a, j.service, 3*time.Second, next.AllocID)

	// Crash of the holder (its supervisor SIGKILLed): the catalog lists
	// the next holder alone.
	holder = next.AllocID
	sup = drvSupervisor(t, holder)
	t0 = harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next = j.waitStart(t, 90*time.Second, func(r harness.Record) bool { return r.Mono > t0 })
	listed = drvWaitService(t, a, j.service, 90*time.Second, next.AllocID)
	harness.Measure(t, "onlock_crash_to_catalog_new_holder", time.Duration(listed-t0))
	harness.Measure(t, "onlock_crash_new_start_to_catalog", time.Duration(listed-next.Mono))
	drvCheckServiceStays(t, a, j.service, 3*time.Second, next.AllocID)
	t.Logf("after the crash of %s the catalog lists %s alone", drvShort(holder), drvShort(next.AllocID))
}

// Without start = "on_lock" Nomad registers the task's service on every
// allocation, the standbys too: what docs/services.md warns about.
func testDrvServiceAtOnce(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "svc-atonce", 3)
	j.service = "drv-svc-atonce"
	j.run(t, a)
	allocs := a.WaitAllocs(t, j.id, 3, api.AllocClientStatusRunning, 90*time.Second)
	first := j.waitStart(t, 90*time.Second, nil)
	var ids []string
	for _, al := range allocs {
		ids = append(ids, al.ID)
	}
	drvWaitService(t, a, j.service, 60*time.Second, ids...)
	if n := len(drvStarts(j.records(t))); n != 1 {
		t.Errorf("%d workload starts, want one", n)
	}
	t.Logf("holder %s; the catalog lists all three allocations, standbys included", drvShort(first.AllocID))
}

// TestDriverServicesACL: with ACLs on, a start = "on_lock" task whose
// identity has the gate policy (write on the lock path, read-job) applied
// to it alone waits pending as a standby, and a stop of its allocation ends
// it within seconds. Without read-job it does not wait unwatched: it fails
// at start, naming the capability and config.start, and never runs.
func TestDriverServicesACL(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	opts := drvAgentOptions(t, false)
	opts.ACLs = true
	a := harness.StartAgent(t, opts)

	ok := newDrvJob(t, "onlock-acl", 2)
	ok.start = "on_lock"
	denied := newDrvJob(t, "onlock-acl-denied", 1)
	denied.start, denied.failFast = "on_lock", true
	applyGatePolicyTo(t, a, ok.id, drvGroup, drvTask, ok.lockPath(), true)
	applyGatePolicyTo(t, a, denied.id, drvGroup, drvTask, denied.lockPath(), false)
	ok.run(t, a)
	denied.run(t, a)

	first := ok.waitStart(t, 90*time.Second, nil)
	standby := drvOnLockStandbys(t, a, ok, first.AllocID, 1)[0]
	sup := drvSupervisor(t, standby)
	t0 := harness.MonoNow()
	a.Nomad(t, "alloc", "stop", "-detach", standby)
	drvWaitGone(t, sup.PID, 30*time.Second)
	drvWaitTerminal(t, a, standby, 30*time.Second)
	stopped := time.Duration(harness.MonoNow() - t0)
	harness.Measure(t, "onlock_acl_standby_stop_alloc_terminal", stopped)
	if stopped > 20*time.Second {
		t.Errorf("the waiting standby took %s to stop under ACLs, want seconds", stopped)
	}

	var evs []*api.TaskEvent
	deadline := time.Now().Add(60 * time.Second)
	for {
		allocs, _ := a.Allocs(denied.id)
		evs = evs[:0]
		for _, al := range allocs {
			e, _ := a.TaskEvents(al.ID, drvTask)
			evs = append(evs, e...)
		}
		if m := drvMatching(evs, "permission denied", `capabilities = ["read-job"]`, `config.start = "on_lock"`); len(m) > 0 {
			t.Logf("without read-job: %s", drvEventText(m[0]))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event naming read-job and config.start within 60s; events:\n%s", drvFormatEvents(evs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if recs, _ := harness.ReadRecords(denied.record); len(recs) > 0 {
		t.Errorf("the workload of an on_lock task without read-job ran: %v", recs)
	}
}

// TestDriverServicesClientRestart: the client agent restarts while a
// start = "on_lock" standby waits in StartTask. Nomad keeps no handle for a
// start that has not returned and starts the task again: the plugin ends
// the first start's supervisor, so each allocation has one supervisor, the
// holder keeps the lock, the catalog lists it alone, and after a stop of
// the holder the standby's new start takes over.
// drvOnLockRestartTTL outlasts the client's stop and start with a waiting
// standby.
const drvOnLockRestartTTL = 60 * time.Second

// Slow on purpose (over a minute): the client agent cannot stop while a
// StartTask waits, so the harness kills it after its StopTimeout (30s).
func TestDriverServicesClientRestart(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, false))
	j := newDrvJob(t, "svc-restart", 2)
	j.start, j.service = "on_lock", "drv-svc-restart"
	// The holder lives through the agent's downtime (its Task API is gone
	// meanwhile) only within its fence deadline. A client agent with a
	// StartTask that has not returned does not stop on SIGINT (Nomad's
	// client waits for it): the harness kills it after StopTimeout (30s).
	j.lockBlock = fmt.Sprintf("ttl = %q\n          delay = %q", drvOnLockRestartTTL.String(), drvDelayHCL)
	j.run(t, a)
	first := j.waitStart(t, 90*time.Second, nil)
	holder := first.AllocID
	standby := drvOnLockStandbys(t, a, j, holder, 1)[0]
	drvWaitService(t, a, j.service, 60*time.Second, holder)
	holderSup, standbySup := drvSupervisor(t, holder), drvSupervisor(t, standby)

	drvWaitRenew(t, a, holder, drvOnLockRestartTTL)
	stopAt := harness.MonoNow()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	stoppedAt := harness.MonoNow()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Measure(t, "onlock_client_stop", time.Duration(stoppedAt-stopAt))
	if d := time.Duration(harness.MonoNow() - stopAt); d >= drvOnLockRestartTTL-2*time.Second {
		t.Errorf("the client was down for %s, want less than TTL - margin: fix the test timing", d)
	}
	// The standby's first supervisor ends, superseded by the new start's
	// (or, with a new plugin process, by the allocation watch of nobody:
	// then it would still run, which this test catches).
	drvWaitGone(t, standbySup.PID, 90*time.Second)
	drvOnLockStandbys(t, a, j, holder, 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		procs, err := harness.SupervisorProcs(standby)
		if err == nil && len(procs) == 1 && procs[0].PID != standbySup.PID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby %s: supervisors %v (err %v), want one new one", drvShort(standby), procs, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if procs, err := harness.SupervisorProcs(holder); err != nil || len(procs) != 1 || procs[0].PID != holderSup.PID {
		log, _ := os.ReadFile(a.Client().LogPath())
		var lines []string
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, holder) || strings.Contains(l, "singleton") {
				lines = append(lines, l)
			}
		}
		t.Fatalf("the holder's supervisor %d did not live through the restart: now %v (err %v); events:\n%s\nclient log:\n%s",
			holderSup.PID, procs, err, drvFormatEvents(drvEvents(t, a, holder)), strings.Join(lines, "\n"))
	}
	drvCheckServiceStays(t, a, j.service, 3*time.Second, holder)
	if n := len(drvStarts(j.records(t))); n != 1 {
		t.Errorf("%d workload starts across the restart, want the holder's alone", n)
	}

	t0 := harness.MonoNow()
	a.Nomad(t, "alloc", "stop", "-detach", holder)
	next := j.waitStart(t, 90*time.Second, func(r harness.Record) bool { return r.Mono > t0 })
	if next.AllocID != standby {
		t.Errorf("the new holder is %s, want the standby %s", drvShort(next.AllocID), drvShort(standby))
	}
	listed := drvWaitService(t, a, j.service, 90*time.Second, next.AllocID)
	harness.Measure(t, "onlock_after_client_restart_stop_to_catalog_new_holder", time.Duration(listed-t0))
}
