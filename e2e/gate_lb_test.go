package e2e

// A gate with a load_balancer block carries its gated task's registration:
// the reference LB API (examples/lbapi, over real HTTP) lists the live
// holder's upstream alone, across every way a holder ends.

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// gateLBRequest waits until the LB holds a request of the service whose id
// starts with prefix in state SUCCESS, and returns the first such one.
func gateLBRequest(t *testing.T, lb *harness.LB, service, prefix string, timeout time.Duration) lbapi.RequestRecord {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range lbRequestsWithPrefix(lb, service, prefix) {
			if r.Done() && r.State == "SUCCESS" {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful LB request %s* of service %s within %s; requests:\n%s",
				prefix, service, timeout, lbFormatRequests(lb.Requests(service)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testGateLB runs a docker gated app (PID 1 ignores SIGTERM; a 2 s
// shutdown_delay) behind a gate with a load_balancer block, through a
// restart of the app (docker kill), a graceful stop of the holder's
// allocation and a SIGKILL of the holder's gate supervisor. After each the
// LB lists exactly the live holder's upstream; a holder's upstream is gone
// before its app is dead, and never listed after the next holder's ADD,
// which swaps it out; the LB never lists two at once; and the app never
// runs in two allocations at once.
func testGateLB(t *testing.T, a *harness.Agent, records string, d *harness.Docker) {
	lb := lbStartServer(t)
	j := newGateJobID(t, "gate-docker-lb", "docker", records)
	j.image = d.Image
	service := fmt.Sprintf("svc-gate-%d", time.Now().UnixNano()%1e6)
	j.lb = gateLB(lb, service, lbGroup)
	// Nomad waits this long between the stop and the kill signal: the
	// gate's REMOVE lands meanwhile.
	j.appExtra = "\n      shutdown_delay = \"2s\""

	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	ups := lbSampleState(t, lb, service)
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })

	first := j.start(t, "", 0, 90*time.Second)
	holder := first.AllocID
	j.standby(t, a, holder)
	up := lbUpstreamOf(t, a, holder)
	add := gateLBRequest(t, lb, service, holder+"-ADD-", 60*time.Second)
	lbWaitUpstreams(t, lb, service, 10*time.Second, up)
	t.Logf("MEASURE gate_lb first_add_after_app_start=%s (holder %s, upstream %s)", harness.Millis(lbMonoDur(first.Mono, add.Finished)), drvShort(holder), up)

	events := func(allocs ...string) {
		for _, al := range allocs {
			evs, _ := a.TaskEvents(al, "gate")
			t.Logf("gate events of %s:\n%s", drvShort(al), drvFormatEvents(evs))
		}
	}
	var known []harness.KnownEnd

	// The gated app is killed (docker kill) and restarts in the holder,
	// which keeps the lock and its registration.
	app := j.appProc(t, holder)
	pid := j.lastStart(t, holder).PID
	t0 := harness.MonoNow()
	cs := d.TaskContainers(t, holder, "app")
	if len(cs) == 0 || cs[0].State != "running" {
		t.Fatalf("no running app container in %s: %+v", drvShort(holder), cs)
	}
	d.CLI(t, "kill", cs[0].ID)
	died := drvWaitGone(t, app.PID, 30*time.Second)
	known = append(known, harness.KnownEnd{PID: pid, Mono: died})
	again := harness.WaitRecord(t, j.record, 60*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > t0
	})
	if again.AllocID != holder {
		t.Fatalf("after the gated app of %s was killed, the app started in %s: want a restart in the holder", drvShort(holder), drvShort(again.AllocID))
	}
	lbWaitUpstreams(t, lb, service, 30*time.Second, up)
	t.Logf("MEASURE gate_lb docker_kill_app_down=%s (the upstream stays listed while the app restarts in the holder)",
		harness.Millis(lbMonoDur(died, again.Mono)))

	// A graceful stop of the holder's allocation: the gate sees it on the
	// servers and REMOVEs while Nomad waits out the app's shutdown_delay.
	app = j.appProc(t, holder)
	pid = j.lastStart(t, holder).PID
	t0 = harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	died = drvWaitGone(t, app.PID, 60*time.Second)
	known = append(known, harness.KnownEnd{PID: pid, Mono: died})
	rm := gateLBRequest(t, lb, service, holder+"-REMOVE-", 30*time.Second)
	if rm.Finished >= died || ups.seen(up) >= died {
		t.Errorf("graceful stop: %s was removed at %d (last listed %d), not before its app died at %d", up, rm.Finished, ups.seen(up), died)
	}
	sigterm := "none seen"
	for _, r := range j.records(t) {
		if r.AllocID == holder && r.Event == harness.EventSignal && r.Mono > t0 {
			sigterm = harness.Millis(lbMonoDur(rm.Finished, r.Mono))
			break
		}
	}
	next := j.start(t, holder, t0, 60*time.Second)
	nextUp := gateLBHandover(t, a, lb, ups, service, holder, up, next)
	t.Logf("MEASURE gate_lb alloc_stop remove_after_stop=%s remove_before_kill_signal=%s remove_before_app_dead=%s new_add_after_stop=%s",
		harness.Millis(lbMonoDur(t0, rm.Finished)), sigterm, harness.Millis(lbMonoDur(rm.Finished, died)),
		harness.Millis(lbMonoDur(t0, gateLBRequest(t, lb, service, next.AllocID+"-ADD-", time.Second).Finished)))
	events(holder, next.AllocID)
	holder, up = next.AllocID, nextUp

	// The gate's supervisor is SIGKILLed: the plugin REMOVEs the app's
	// upstream, then kills the app itself, proves it dead and releases the
	// lock marked clean: the next gate takes over at once.
	j.standby(t, a, holder)
	app = j.appProc(t, holder)
	pid = j.lastStart(t, holder).PID
	sup := drvSupervisor(t, holder)
	t0 = harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died = drvWaitGone(t, app.PID, 60*time.Second)
	known = append(known, harness.KnownEnd{PID: pid, Mono: died})
	rm = gateLBRequest(t, lb, service, holder+"-REMOVE-", 30*time.Second)
	if rm.Finished >= died || ups.seen(up) >= died {
		t.Errorf("gate supervisor killed: %s was removed at %d (last listed %d), not before its app died at %d", up, rm.Finished, ups.seen(up), died)
	}
	next = j.start(t, holder, t0, 90*time.Second)
	nextUp = gateLBHandover(t, a, lb, ups, service, holder, up, next)
	t.Logf("MEASURE gate_lb supervisor_killed remove_after_kill=%s remove_before_app_dead=%s takeover_app_start=%s new_add=%s",
		harness.Millis(lbMonoDur(t0, rm.Finished)), harness.Millis(lbMonoDur(rm.Finished, died)), harness.Millis(lbMonoDur(t0, next.Mono)),
		harness.Millis(lbMonoDur(t0, gateLBRequest(t, lb, service, next.AllocID+"-ADD-", time.Second).Finished)))
	events(holder, next.AllocID)

	// The job is stopped: the last holder's upstream goes too.
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	lbWaitUpstreams(t, lb, service, 60*time.Second)
	ups.check(t, "gate failovers")
	if ups.samples < 100 {
		t.Errorf("LB sampler: only %d samples", ups.samples)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0, known...)
	t.Logf("LB requests:\n%s", lbFormatRequests(lb.Requests(service)))
}

// gateLBHandover checks the LB once next holds the lock after prev: its ADD
// swapped prev's upstream out in the same request, the service lists its
// upstream alone, and prev's was never listed after that ADD. It returns
// next's upstream.
func gateLBHandover(t *testing.T, a *harness.Agent, lb *harness.LB, ups *lbStateSampler, service, prev, prevUp string, next harness.Record) string {
	t.Helper()
	nextUp := lbUpstreamOf(t, a, next.AllocID)
	add := gateLBRequest(t, lb, service, next.AllocID+"-ADD-", 60*time.Second)
	lbWaitUpstreams(t, lb, service, 10*time.Second, nextUp)
	if !slices.Contains(add.RemoveUpstreams, prevUp) {
		t.Errorf("the ADD of %s (%s) removes %q, want the previous holder's %s swapped out", drvShort(next.AllocID), add.ID, add.RemoveUpstreams, prevUp)
	}
	if nextUp == prevUp {
		t.Logf("%s reuses %s's upstream %s: not checking when it was last listed", drvShort(next.AllocID), drvShort(prev), prevUp)
	} else if seen := ups.seen(prevUp); seen >= add.Finished {
		t.Errorf("%s's upstream %s listed at %d, after the ADD of %s finished at %d", drvShort(prev), prevUp, seen, drvShort(next.AllocID), add.Finished)
	}
	return nextUp
}

// gateLB is a gate's load_balancer (and health_check) for service in groups.
func gateLB(lb *harness.LB, service string, groups ...string) *lbSpec {
	return &lbSpec{URI: lb.URI, ServiceID: service, BasePath: "/" + service, Groups: groups, Recheck: lbRecheckHCL}
}

// testGateLBAddRefused: an ADD that the LB refuses for good
// (INVALID_REQUEST_NOOP: no such group) fails the gate with an event that
// quotes the LB and names the field; Nomad kills the gated app, and no
// REMOVE follows (Baragon applied nothing).
func testGateLBAddRefused(t *testing.T, a *harness.Agent, records string) {
	lb := lbStartServer(t)
	j := newGateJobID(t, "gate-lb-refused", "raw_exec", records)
	service := fmt.Sprintf("svc-gate-refused-%d", time.Now().UnixNano()%1e6)
	j.lb = gateLB(lb, service, "no-such-group")
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })

	first := j.start(t, "", 0, 90*time.Second)
	ev := gateWaitEvent(t, a, j.id, 60*time.Second, "LB add failed: ", "INVALID_REQUEST_NOOP", "load_balancer.groups", "the gate fails now")
	t.Logf("gate event: %s", drvEventText(ev))
	deadline := time.Now().Add(60 * time.Second)
	for {
		al, _, err := a.API().Allocations().Info(first.AllocID, nil)
		if err == nil && al.ClientStatus == api.AllocClientStatusFailed {
			if st := al.TaskStates["app"]; st == nil || st.State != "dead" {
				t.Fatalf("alloc %s failed with its app %+v, want the app dead", drvShort(first.AllocID), st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s not failed within 60s after its gate's ADD was refused: %s", drvShort(first.AllocID), a.Nomad(t, "alloc", "status", first.AllocID))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("MEASURE gate_lb add_refused_alloc_failed=%s after the app started", harness.Millis(lbMonoDur(first.Mono, harness.MonoNow())))
	if rms := lbRequestsWithPrefix(lb, service, first.AllocID+"-REMOVE-"); len(rms) > 0 {
		t.Errorf("a REMOVE followed the refused ADD: %s", lbFormatRequests(rms))
	}
	lbCheckUpstreams(t, lb, service)

	// Purge, and wait for every gate's supervisor to be gone before the
	// agent may stop.
	allocs, _ := a.Allocs(j.id)
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	purged := time.Now()
	// A standby gate waiting for the lock outlives a purge until the lock
	// is free (the holder's, kept after its failure, expires: ~20 s).
	defer func() { t.Logf("supervisors gone %s after the purge", time.Since(purged).Round(time.Millisecond)) }()
	deadline = time.Now().Add(60 * time.Second)
	for _, al := range allocs {
		for procs, _ := harness.SupervisorProcs(al.ID); len(procs) > 0; procs, _ = harness.SupervisorProcs(al.ID) {
			if time.Now().After(deadline) {
				t.Fatalf("supervisors of alloc %s alive 60s after the purge: %v", drvShort(al.ID), procs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
