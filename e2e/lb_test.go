package e2e

// End-to-end tests of the load balancer registration: the singleton driver
// (and bin/lock) against a real Nomad dev agent and the reference LB API
// (examples/lbapi) running in the test process. The LB stamps when each
// request was enqueued and when it reached its final state with
// CLOCK_MONOTONIC, the clock of the testworkload records, so orderings such
// as "the REMOVE succeeded before the workload got its stop signal" are
// checked exactly.
//
// Measured numbers are logged as `MEASURE name=value` lines:
//
//	go -C e2e test . -run 'TestLB' -count=1 -v | grep MEASURE

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// TestLB runs every LB scenario concurrently on one dev agent. They share
// one LB server, each with its own service; the fault scenario has an LB
// server of its own, since its faults would hit every client.
func TestLB(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	// Started before the agent, so it closes after the agent's cleanup has
	// stopped every job (and their REMOVEs have landed).
	lb := lbStartServer(t)
	began := time.Now()
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	harness.Measure(t, "lb_dev_agent_ready", time.Since(began))

	runConcurrently(t, []subtest{
		{"holder_registered", func(t *testing.T) { testLBHolderRegistered(t, a, lb) }},
		{"stop_removes_before_signal", func(t *testing.T) { testLBStopRemovesFirst(t, a, lb) }},
		{"crash_swaps_upstream", func(t *testing.T) { testLBCrashSwap(t, a, lb) }},
		{"lb_5xx_converges", func(t *testing.T) { testLB5xxConverges(t, a) }},
		{"invalid_request_stops_task", func(t *testing.T) { testLBInvalidRequestStopsTask(t, a, lb) }},
		{"out_of_band_removal_repaired", func(t *testing.T) { testLBOutOfBandRemovalRepaired(t, a, lb) }},
		{"plain_lock_binary", func(t *testing.T) { testLBPlainLock(t, a, lb) }},
		{"baragon_fields", func(t *testing.T) { testLBBaragonFields(t, a, lb) }},
	})
}

// testLBHolderRegistered: with three allocations, the LB
// service holds exactly the holder's upstream (its "http" port as Nomad
// allocated it, which answers "alloc <holder>"), registered by one ADD
// with the holder's request id, and it stays so over three re-check
// intervals; the standbys send nothing.
func testLBHolderRegistered(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j := newLBJob(t, lb, "holder", 3)
	j.run(t, a)
	first := j.lbHolder(t, a)
	holder, fence := first.AllocID, drvFence(t, first)
	up := lbUpstreamOf(t, a, holder)
	if !slices.Contains(first.Argv, up) {
		t.Errorf("holder's workload argv %q does not serve on its allocated port %s", first.Argv, up)
	}

	add := lbWaitSuccess(t, lb, lbAddID(holder, fence), 30*time.Second)
	harness.Measure(t, "lb_acquired_to_success", lbMonoDur(first.Mono, add.Finished))
	harness.Measure(t, "lb_start_to_add_enqueued", lbMonoDur(first.Mono, add.Enqueued))
	harness.Measure(t, "lb_add_enqueued_to_success", lbMonoDur(add.Enqueued, add.Finished))
	if !slices.Equal(add.AddUpstreams, []string{up}) || len(add.RemoveUpstreams) != 0 {
		t.Errorf("first ADD adds %q and removes %q, want add [%s] and remove nothing (no previous holder)",
			add.AddUpstreams, add.RemoveUpstreams, up)
	}
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up)
	drvWaitEvent(t, a, holder, 10*time.Second, "Health check passed on "+up)
	reg := drvWaitEvent(t, a, holder, 10*time.Second, fmt.Sprintf("Registered %s with load balancer service %s", up, j.service))
	// As the supervisor saw it: from its "Acquired lock" event to its
	// "Registered" event (both stamped by the plugin as it relays them).
	if acq := drvMatching(drvEvents(t, a, holder), fmt.Sprintf("Acquired lock (fence %d)", fence)); len(acq) == 1 {
		harness.Measure(t, "lb_acquired_event_to_registered_event", time.Duration(reg.Time-acq[0].Time))
	}

	// What a Baragon consumer sees, and that the upstream is the holder.
	_, _, names := lbHTTPState(t, lb, j.service)
	if !slices.Equal(names, []string{up}) {
		t.Errorf("GET /state/%s lists %q, want exactly [%s]", j.service, names, up)
	}
	resp, err := http.Get("http://" + up + "/")
	if err != nil {
		t.Fatalf("GET the registered upstream: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "alloc " + holder; resp.StatusCode != 200 || strings.TrimSpace(string(body)) != want {
		t.Errorf("the registered upstream answers %d %q, want 200 %q", resp.StatusCode, body, want)
	}

	// Three re-check intervals: always exactly the holder, never re-added.
	watch := 3*lbRecheck + 500*time.Millisecond
	samples, bad := 0, 0
	for end := time.Now().Add(watch); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		samples++
		if got := lb.Upstreams(j.service); !slices.Equal(got, []string{up}) {
			if bad < 5 {
				t.Errorf("LB service %s had upstreams %q, want exactly [%s]", j.service, got, up)
			}
			bad++
		}
	}
	t.Logf("%d state samples over %s, %d wrong", samples, watch, bad)
	if recs := lb.Requests(j.service); len(recs) != 1 || recs[0].ID != add.ID {
		t.Errorf("LB requests of %s, want only %s:\n%s", j.service, add.ID, lbFormatRequests(recs))
	}
	for _, id := range drvRunning(t, a, j.id) {
		if id == holder {
			continue
		}
		if evs := drvMatching(drvEvents(t, a, id), "load balancer"); len(evs) > 0 {
			t.Errorf("standby %s has LB events:\n%s", drvShort(id), drvFormatEvents(evs))
		}
	}
}

// testLBStopRemovesFirst: stopping the holder's allocation
// REMOVEs its upstream, and the REMOVE reached SUCCESS on the LB before the
// workload received its stop signal (LB finish stamp < the workload's stop
// record, both CLOCK_MONOTONIC). Then the standby takes over, its ADD (which
// also removes the previous holder's upstream, read from the lock) lands,
// and the service holds exactly the new holder. The two are never
// registered at once.
func testLBStopRemovesFirst(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j, first, fence1, up1 := lbRegisteredHolder(t, a, lb, "stop")
	holder := first.AllocID
	drvWaitEvent(t, a, holder, 10*time.Second, "Registered "+up1)

	state := lbSampleState(t, lb, j.service)
	stopAt := harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	rm := lbWaitSuccess(t, lb, lbRemoveID(holder, fence1), 20*time.Second)
	end := j.waitEnd(t, first.Instance, 20*time.Second)
	if end.Event != harness.EventStop || end.Signal != "SIGINT" {
		t.Errorf("old workload ended with %s %s, want a stop on SIGINT", end.Event, end.Signal)
	}
	if !slices.Equal(rm.RemoveUpstreams, []string{up1}) || len(rm.AddUpstreams) != 0 {
		t.Errorf("REMOVE removes %q and adds %q, want remove [%s] only", rm.RemoveUpstreams, rm.AddUpstreams, up1)
	}
	if rm.Enqueued < stopAt {
		t.Errorf("REMOVE enqueued %s before the alloc stop", lbMonoDur(rm.Enqueued, stopAt))
	}
	lead := lbMonoDur(rm.Finished, end.Mono)
	harness.Measure(t, "lb_stopalloc_to_remove_enqueued", lbMonoDur(stopAt, rm.Enqueued))
	harness.Measure(t, "lb_remove_enqueued_to_success", lbMonoDur(rm.Enqueued, rm.Finished))
	harness.Measure(t, "lb_remove_success_to_stop_signal", lead)
	if lead <= 0 {
		t.Errorf("the workload recorded its stop signal %s BEFORE the LB finished the REMOVE", -lead)
	}
	// The task events say the same, in that order.
	drvWaitEvent(t, a, holder, 15*time.Second, "Released lock")
	evs := drvEvents(t, a, holder)
	removed := slices.IndexFunc(evs, func(ev *api.TaskEvent) bool {
		return strings.Contains(drvEventText(ev), fmt.Sprintf("Removed %s from load balancer service %s", up1, j.service))
	})
	stopping := slices.IndexFunc(evs, func(ev *api.TaskEvent) bool {
		return strings.Contains(drvEventText(ev), "Stopping workload with SIGINT")
	})
	if removed < 0 || stopping < 0 || removed > stopping {
		t.Errorf("want a \"Removed %s\" event before \"Stopping workload with SIGINT\":\n%s", up1, drvFormatEvents(evs))
	}

	next := j.waitStart(t, 30*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	fence2 := drvFence(t, next)
	if next.AllocID == holder || fence2 <= fence1 {
		t.Errorf("new holder %s fence %d after %s fence %d", drvShort(next.AllocID), fence2, drvShort(holder), fence1)
	}
	up2 := lbUpstreamOf(t, a, next.AllocID)
	add2 := lbWaitSuccess(t, lb, lbAddID(next.AllocID, fence2), 30*time.Second)
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up2)
	if !slices.Equal(add2.AddUpstreams, []string{up2}) || !slices.Equal(add2.RemoveUpstreams, []string{up1}) {
		t.Errorf("new holder's ADD adds %q and removes %q, want add [%s] remove [%s] (the previous holder, from the lock)",
			add2.AddUpstreams, add2.RemoveUpstreams, up2, up1)
	}
	harness.Measure(t, "lb_stopalloc_to_new_success", lbMonoDur(stopAt, add2.Finished))
	harness.Measure(t, "lb_service_without_upstream", lbMonoDur(rm.Finished, add2.Finished))
	harness.Measure(t, "lb_new_start_to_success", lbMonoDur(next.Mono, add2.Finished))
	drvWaitEvent(t, a, next.AllocID, 10*time.Second, fmt.Sprintf("Registered %s with load balancer service %s", up2, j.service))
	state.check(t, "stop handover")
}

// testLBCrashSwap: the holder's supervisor and workload are
// both SIGKILLed. The standby's single ADD adds its upstream and removes
// the dead holder's (read from the lock); the plugin's REMOVE on behalf of
// the crashed supervisor lands before the lock is released, so the two are
// never registered at once; the end state is exactly the new holder.
func testLBCrashSwap(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j, first, fence1, up1 := lbRegisteredHolder(t, a, lb, "crash")
	holder := first.AllocID
	sup := drvSupervisor(t, holder)

	state := lbSampleState(t, lb, j.service)
	mains := j.sampler(t)
	mains.WaitSeen(t, 30*time.Second, first.PID)
	killAt := harness.MonoNow()
	sigkillTogether(t, sup.PID, first.PID)
	goneAt := drvWaitGone(t, first.PID, 5*time.Second)

	next := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	fence2 := drvFence(t, next)
	if next.AllocID == holder || fence2 <= fence1 {
		t.Errorf("new holder %s fence %d after %s fence %d", drvShort(next.AllocID), fence2, drvShort(holder), fence1)
	}
	up2 := lbUpstreamOf(t, a, next.AllocID)
	add2 := lbWaitSuccess(t, lb, lbAddID(next.AllocID, fence2), 30*time.Second)
	if !slices.Equal(add2.AddUpstreams, []string{up2}) || !slices.Contains(add2.RemoveUpstreams, up1) {
		t.Errorf("new holder's ADD adds %q and removes %q, want add [%s] and a remove of the dead holder's %s; body %s",
			add2.AddUpstreams, add2.RemoveUpstreams, up2, up1, add2.Body)
	}
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up2)
	harness.Measure(t, "lb_crash_to_new_start", lbMonoDur(killAt, next.Mono))
	harness.Measure(t, "lb_crash_to_new_success", lbMonoDur(killAt, add2.Finished))

	// The plugin took the dead supervisor's upstream out first.
	if rm, ok := lb.Request(lbRemoveID(holder, fence1)); ok {
		harness.Measure(t, "lb_crash_to_plugin_remove_success", lbMonoDur(killAt, rm.Finished))
		if rm.State != "SUCCESS" || !slices.Equal(rm.RemoveUpstreams, []string{up1}) {
			t.Errorf("plugin REMOVE %s ended %s removing %q, want SUCCESS removing [%s]", rm.ID, rm.State, rm.RemoveUpstreams, up1)
		}
		if !rm.Done() || rm.Finished > add2.Enqueued {
			t.Errorf("plugin REMOVE finished at %d, after the new holder's ADD was enqueued at %d", rm.Finished, add2.Enqueued)
		}
		drvWaitEvent(t, a, holder, 10*time.Second, fmt.Sprintf("Removed %s from load balancer on behalf of crashed supervisor", up1))
	} else {
		t.Logf("no REMOVE on behalf of the crashed supervisor; the new holder's ADD removed %s", up1)
	}
	drvWaitEvent(t, a, holder, 10*time.Second, "Released lock on behalf of crashed supervisor")

	// Settle for a re-check interval: nothing else arrives.
	time.Sleep(lbRecheck + 500*time.Millisecond)
	if adds := lbRequestsWithPrefix(lb, j.service, next.AllocID+"-ADD-"); len(adds) != 1 {
		t.Errorf("new holder sent %d ADD requests, want 1:\n%s", len(adds), lbFormatRequests(adds))
	}
	lbCheckUpstreams(t, lb, j.service, up2)
	state.check(t, "crash handover")
	// The killed workload wrote no stop record: it ended when drvWaitGone
	// saw it gone (an upper bound). The sampler may not have scanned while
	// it lived, when /proc is large and the machine busy.
	harness.CheckNoOverlap(t, j.records(t), mains.Stop(), harness.KnownEnd{PID: first.PID, Mono: goneAt})
}

// testLB5xxConverges: the LB answers 503 to everything for a few
// seconds (before the request takes effect), then 503 after the request took
// effect (the answer is lost), then recovers. Registration converges with
// one request id reused across every retry, and the service holds the
// holder's upstream exactly once.
func testLB5xxConverges(t *testing.T, a *harness.Agent) {
	lb := lbStartServer(t)
	if err := lb.SetFaults(lbapi.Faults{ErrorRate: 1, ErrorStatus: 503}); err != nil {
		t.Fatal(err)
	}
	j := newLBJob(t, lb, "faults", 2)
	j.run(t, a)
	first := j.lbHolder(t, a)
	holder, fence := first.AllocID, drvFence(t, first)
	up := lbUpstreamOf(t, a, holder)
	id := lbAddID(holder, fence)
	drvWaitEvent(t, a, holder, 10*time.Second, "Health check passed on "+up)

	// Phase 1: every call fails before it reaches the API. Wait until the
	// supervisor has retried under it (not for a time that usually suffices).
	lbWaitLogCount(t, a, holder, "result unknown; will POST the same id again", 2, 60*time.Second)
	if rec, ok := lb.Request(id); ok {
		t.Errorf("request stored while every call was refused: %+v", rec)
	}
	// Phase 2: the calls take effect but their answers are lost.
	if err := lb.SetFaults(lbapi.Faults{ErrorRate: 1, ErrorStatus: 503, AfterHandle: true}); err != nil {
		t.Fatal(err)
	}
	committed := lbWaitSuccess(t, lb, id, 15*time.Second)
	time.Sleep(2 * time.Second)
	if evs := drvMatching(drvEvents(t, a, holder), "Registered "); len(evs) > 0 {
		t.Errorf("registered while every answer was a 503:\n%s", drvFormatEvents(evs))
	}
	clearAt, clearWall := harness.MonoNow(), time.Now()
	if err := lb.SetFaults(lbapi.Faults{}); err != nil {
		t.Fatal(err)
	}
	drvWaitEvent(t, a, holder, 30*time.Second, fmt.Sprintf("Registered %s with load balancer service %s", up, j.service))
	harness.Measure(t, "lb_faults_clear_to_registered_event", time.Since(clearWall))
	harness.Measure(t, "lb_faults_committed_before_clear", lbMonoDur(committed.Finished, clearAt))

	lbCheckUpstreams(t, lb, j.service, up)
	if recs := lb.Requests(j.service); len(recs) != 1 || recs[0].ID != id {
		t.Errorf("want every retry under the one id %s, LB holds:\n%s", id, lbFormatRequests(recs))
	}
	logs := a.AllocLogs(t, holder, drvTask, "stderr")
	retries := strings.Count(logs, "result unknown; will POST the same id again")
	harness.Measure(t, "lb_faults_client_retries", retries)
	if retries < 2 {
		t.Errorf("supervisor logged %d unknown results under faults, want several:\n%s", retries, logs)
	}
	evs := drvEvents(t, a, holder)
	if n := len(drvMatching(evs, "Registered ")); n != 1 {
		t.Errorf("%d Registered events, want 1:\n%s", n, drvFormatEvents(evs))
	}
	if m := drvMatching(evs, "LB add failed"); len(m) > 0 {
		t.Errorf("the ADD failed under transient faults:\n%s", drvFormatEvents(m))
	}
	// Healthy again: a re-check interval later, still exactly one upstream
	// and no re-add.
	time.Sleep(lbRecheck + time.Second)
	lbCheckUpstreams(t, lb, j.service, up)
	if n := len(lb.Requests(j.service)); n != 1 {
		t.Errorf("%d requests after recovery, want 1:\n%s", n, lbFormatRequests(lb.Requests(j.service)))
	}
}

// testLBInvalidRequestStopsTask: the service names a group the LB does not
// have, so the ADD ends INVALID_REQUEST_NOOP. The task stops with an event
// quoting the LB's message and exit code 74; the restart policy (one
// restart, then fail) applies: two runs, one restart, then failed.
func testLBInvalidRequestStopsTask(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j := newLBJob(t, lb, "invalid", 1)
	j.groups = []string{"no-such-group"}
	j.restart = "      attempts = 1\n      delay    = \"1s\"\n      mode     = \"fail\""
	j.noReschedule = true
	j.run(t, a)
	allocID, evs := lbCollectEvents(t, a, j.id, api.AllocClientStatusFailed, 90*time.Second)
	t.Logf("events:\n%s", drvFormatEvents(evs))

	quoted := drvMatching(evs, "INVALID_REQUEST_NOOP", "Invalid request due to non-existent load balancer groups: [no-such-group]")
	if len(quoted) != 2 {
		t.Errorf("%d events quote the LB's INVALID_REQUEST_NOOP message, want one per run (2)", len(quoted))
	}
	for _, ev := range quoted {
		// It names the field to fix and what Nomad does next.
		for _, want := range []string{"LB add failed: ", "load_balancer.groups", lbRestartNote} {
			if !strings.Contains(drvEventText(ev), want) {
				t.Errorf("event quoting the LB does not say %q: %s", want, drvEventText(ev))
			}
		}
	}
	lbAssertNoCrashWording(t, evs)
	if m := drvMatching(evs, "LB remove"); len(m) > 0 {
		t.Errorf("a REMOVE was attempted although the ADD was refused as invalid:\n%s", drvFormatEvents(m))
	}
	var codes []int
	restarts, notRestarting := 0, 0
	for _, ev := range evs {
		switch ev.Type {
		case api.TaskTerminated:
			codes = append(codes, ev.ExitCode)
		case api.TaskRestarting:
			restarts++
		case api.TaskNotRestarting:
			notRestarting++
		}
	}
	if !slices.Equal(codes, []int{74, 74}) {
		t.Errorf("Terminated exit codes %v, want [74 74]", codes)
	}
	if restarts != 1 || notRestarting != 1 {
		t.Errorf("%d Restarting and %d Not Restarting events, want 1 and 1", restarts, notRestarting)
	}
	info, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ts := info.TaskStates[drvTask]; ts == nil || !ts.Failed || ts.Restarts != 1 {
		t.Errorf("task state %+v, want failed after 1 restart", ts)
	}

	// Each run's workload was started, then stopped by the supervisor.
	recs := j.records(t)
	starts := drvStarts(recs)
	if len(starts) != 2 {
		t.Fatalf("%d workload starts, want 2:\n%+v", len(starts), recs)
	}
	for _, s := range starts {
		end := j.waitEnd(t, s.Instance, 5*time.Second)
		if end.Event != harness.EventStop {
			t.Errorf("workload %s ended by %s, want a stop signal", s.Instance, end.Event)
		}
		add, ok := lb.Request(lbAddID(allocID, drvFence(t, s)))
		if !ok || add.State != "INVALID_REQUEST_NOOP" {
			t.Errorf("ADD of fence %s: %+v (known %v), want INVALID_REQUEST_NOOP", s.Fence, add, ok)
			continue
		}
		harness.Measure(t, "lb_invalid_start_to_stop_signal", lbMonoDur(s.Mono, end.Mono))
		if add.Finished > end.Mono {
			t.Errorf("workload stopped before its ADD ended")
		}
	}
	if ups := lb.Upstreams(j.service); len(ups) != 0 {
		t.Errorf("service %s has upstreams %q after INVALID ADDs", j.service, ups)
	}
	if rms := lbRequestsWithPrefix(lb, j.service, allocID+"-REMOVE-"); len(rms) > 0 {
		t.Errorf("REMOVE requests after INVALID ADDs:\n%s", lbFormatRequests(rms))
	}
}

// testLBOutOfBandRemovalRepaired: someone removes our upstream through the LB
// API under their own request id. Within one re-check interval (+ slack)
// the holder re-adds it under the next attempt id (<alloc>-ADD-<fence>-2),
// says so in a "Re-registered" event; a second removal gets a second re-add
// and a second event, counted; then it stays put.
func testLBOutOfBandRemovalRepaired(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j := newLBJob(t, lb, "oob", 1)
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	holder, fence := first.AllocID, drvFence(t, first)
	up := lbUpstreamOf(t, a, holder)
	add := lbWaitSuccess(t, lb, lbAddID(holder, fence), 30*time.Second)
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up)
	drvWaitEvent(t, a, holder, 10*time.Second, "Registered "+up)

	// Remove it behind the holder's back, with the service as stored.
	svc, ups, _ := lbHTTPState(t, lb, j.service)
	oobID := fmt.Sprintf("operator-%s-REMOVE-%d", j.service, time.Now().UnixNano())
	remove := make([]any, len(ups))
	for i, u := range ups {
		remove[i] = u
	}
	oob := lbOperatorPost(t, lb, oobID, svc, []any{}, remove)
	if !slices.Equal(oob.RemoveUpstreams, []string{up}) {
		t.Fatalf("out-of-band request removes %q, want [%s]", oob.RemoveUpstreams, up)
	}

	readd := lbWaitSuccess(t, lb, add.ID+"-2", lbRecheck+15*time.Second)
	repair := lbMonoDur(oob.Finished, readd.Finished)
	harness.Measure(t, "lb_out_of_band_repair", repair)
	if bound := lbRecheck + 3*time.Second; repair > bound {
		t.Errorf("re-added %s after the out-of-band removal, want within one re-check interval + slack (%s)", repair, bound)
	}
	if !slices.Equal(readd.AddUpstreams, []string{up}) || len(readd.RemoveUpstreams) != 0 {
		t.Errorf("re-add adds %q and removes %q, want add [%s] only", readd.AddUpstreams, readd.RemoveUpstreams, up)
	}
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up)
	drvWaitEvent(t, a, holder, 10*time.Second, fmt.Sprintf("Re-registered %s with load balancer service %s (it had vanished; re-add 1)", up, j.service))

	// Again: a second re-add is an event of its own, with its count, so
	// an LB that keeps losing the upstream shows.
	svc, ups, _ = lbHTTPState(t, lb, j.service)
	remove = make([]any, len(ups))
	for i, u := range ups {
		remove[i] = u
	}
	lbOperatorPost(t, lb, oobID+"-again", svc, []any{}, remove)
	lbWaitSuccess(t, lb, add.ID+"-3", lbRecheck+15*time.Second)
	drvWaitEvent(t, a, holder, 10*time.Second, fmt.Sprintf("Re-registered %s with load balancer service %s (it had vanished; re-add 2)", up, j.service))
	if m := drvMatching(drvEvents(t, a, holder), "Re-registered "+up); len(m) != 2 {
		t.Errorf("%d re-add events, want one per re-add (2):\n%s", len(m), drvFormatEvents(m))
	}

	// A re-check interval later: still there, no fourth attempt.
	time.Sleep(lbRecheck + time.Second)
	lbCheckUpstreams(t, lb, j.service, up)
	if adds := lbRequestsWithPrefix(lb, j.service, holder+"-ADD-"); len(adds) != 3 {
		t.Errorf("holder sent %d ADD requests, want the first and two re-adds:\n%s", len(adds), lbFormatRequests(adds))
	}
}

// testLBPlainLock: bin/lock outside Nomad with -lb-* and -health-* flags
// registers the workload's NOMAD_HOST_ADDR_http under request ids keyed by
// its PID, and on SIGTERM removes it before the workload is signalled.
func testLBPlainLock(t *testing.T, a *harness.Agent, lb *harness.LB) {
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	service := fmt.Sprintf("svc-plain-%d", time.Now().UnixNano()%1e6)
	record := filepath.Join(t.TempDir(), "records.jsonl")
	marker := fmt.Sprintf("lb-plain-%d", time.Now().UnixNano())
	flags := lockArgs("nomad/jobs/lb-plain/lock",
		"-lb-uri", lb.URI, "-lb-service-id", service, "-lb-base-path", "/"+service,
		"-lb-groups", lbGroup, "-lb-port", "http", "-lb-recheck-interval", lbRecheckHCL,
		"-health-type", "http", "-health-interval", "200ms")
	argv := []string{harness.BuildTestWorkload(t), "-record", record, "-marker", marker, "-http", addr}
	cmd := exec.Command(harness.LockBin(t), append(flags, argv...)...)
	cmd.Env = append(harness.WithoutNomadEnv(os.Environ()), a.Env()...)
	cmd.Env = append(cmd.Env, "NOMAD_HOST_ADDR_http="+addr)
	p := harness.StartProcess(t, cmd)

	start := harness.WaitRecord(t, record, 30*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain
	})
	fence := drvFence(t, start)
	owner := fmt.Sprintf("pid%d", p.PID())
	add := lbWaitSuccess(t, lb, lbAddID(owner, fence), 30*time.Second)
	harness.Measure(t, "lb_plain_start_to_success", lbMonoDur(start.Mono, add.Finished))
	lbWaitUpstreams(t, lb, service, 5*time.Second, addr)

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Errorf("lock exited %d, want 0 (the workload's own code)\nstderr:\n%s", code, p.Stderr())
	}
	rm := lbWaitSuccess(t, lb, lbRemoveID(owner, fence), 5*time.Second)
	end := harness.WaitRecord(t, record, 5*time.Second, func(r harness.Record) bool {
		return r.Instance == start.Instance && r.Event == harness.EventStop
	})
	lead := lbMonoDur(rm.Finished, end.Mono)
	harness.Measure(t, "lb_plain_remove_success_to_stop_signal", lead)
	if lead <= 0 {
		t.Errorf("the workload recorded its stop signal %s before the LB finished the REMOVE", -lead)
	}
	lbCheckUpstreams(t, lb, service)
	if !strings.Contains(p.Stderr(), "removed from the load balancer") {
		t.Errorf("lock's log does not mention the removal:\n%s", p.Stderr())
	}
}

// testLBBaragonFields: a jobspec's load_balancer block with options of
// every JSON type (a list such as nginxExtraConfigs, a number, a map),
// template_name, domains, additional_paths, the upstream's group and
// rack_id, run through a real agent (HCL2 jobspec → the driver's hclspec →
// the plugin → the supervisor), reaches the LB as Baragon's fields.
func testLBBaragonFields(t *testing.T, a *harness.Agent, lb *harness.LB) {
	j := newLBJob(t, lb, "fields", 1)
	j.lbExtra = `          options = {
            nginxExtraConfigs = ["proxy_read_timeout 5s;"]
            workers           = 4
            nested            = { a = "b" }
          }
          template_name    = "custom"
          domains          = ["example.com"]
          additional_paths = ["/extra"]
          group            = "blue"
          rack_id          = "us_east_1a"`
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	up := lbUpstreamOf(t, a, first.AllocID)
	add := lbWaitSuccess(t, lb, lbAddID(first.AllocID, drvFence(t, first)), 30*time.Second)
	var body struct {
		Service struct {
			Options         map[string]any `json:"options"`
			TemplateName    string         `json:"templateName"`
			Domains         []string       `json:"domains"`
			AdditionalPaths []string       `json:"additionalPaths"`
		} `json:"loadBalancerService"`
		Add []struct {
			Upstream, Group, RackID string
		} `json:"addUpstreams"`
	}
	if err := json.Unmarshal(add.Body, &body); err != nil {
		t.Fatalf("ADD body %s: %v", add.Body, err)
	}
	want := map[string]any{"nginxExtraConfigs": []any{"proxy_read_timeout 5s;"}, "workers": float64(4), "nested": map[string]any{"a": "b"}}
	if !reflect.DeepEqual(body.Service.Options, want) {
		t.Errorf("options %#v, want %#v; body %s", body.Service.Options, want, add.Body)
	}
	if body.Service.TemplateName != "custom" || !slices.Equal(body.Service.Domains, []string{"example.com"}) ||
		!slices.Equal(body.Service.AdditionalPaths, []string{"/extra"}) {
		t.Errorf("service fields %+v; body %s", body.Service, add.Body)
	}
	if len(body.Add) != 1 || body.Add[0].Upstream != up || body.Add[0].Group != "blue" || body.Add[0].RackID != "us_east_1a" {
		t.Errorf("added %+v, want %s in group blue, rack us_east_1a", body.Add, up)
	}
}
