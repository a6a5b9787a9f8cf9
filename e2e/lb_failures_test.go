package e2e

// What an operator reads when the load balancer fails (docs/load-balancer.md,
// "When the load balancer fails"): the singleton driver on a real agent against the
// reference LB API that is down, answers FAILED, or is slow. Each scenario
// asserts the task events a user sees in `nomad alloc status`.
//
//	go -C e2e test . -run 'TestLBFailures' -count=1 -v | grep MEASURE

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// restartNote is the end of every event of a failure that stops the task.
const lbRestartNote = "Nomad will restart the task per its restart policy"

// TestLBFailures runs the failure scenarios concurrently on one dev agent,
// each with an LB server of its own.
func TestLBFailures(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"lb_down_then_back", func(t *testing.T) { testLBDownThenBack(t, a) }},
		{"lb_answers_failed", func(t *testing.T) { testLBAnswersFailed(t, a) }},
		{"lb_slow_worker", func(t *testing.T) { testLBSlowWorker(t, a) }},
		{"lb_down_for_good", func(t *testing.T) { testLBDownForGood(t, a) }},
	})
}

// testLBDownThenBack: the LB API's port has no listener when the holder
// becomes healthy. Within 10 s a task event says the holder is not yet in
// the load balancer, with the LB's URL (never its auth key), the cause and
// the field to check. The LB then comes up on that port: the holder is
// registered within one recheck interval. The LB goes down again: the next
// re-check says so. The holder is stopped: the event says the REMOVE failed
// and why, nothing speaks of a crash, and Nomad hears of the exit right
// after the release.
func testLBDownThenBack(t *testing.T, a *harness.Agent) {
	key := fmt.Sprintf("down-key-%d", time.Now().UnixNano())
	port := harness.FreePort(t)
	srv, err := lbapi.NewServer(lbapi.Options{
		Groups: []lbapi.Group{{Name: lbGroup}}, WorkerInterval: lbWorkerInterval,
		AuthKeys: []string{key}, Clock: harness.MonoNow,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	lb := &harness.LB{Server: srv, Base: "http://" + addr, URI: srv.RequestURL("http://" + addr)}

	j := newLBJob(t, lb, "down", 1)
	j.authkey = key
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	holder := first.AllocID
	up := lbUpstreamOf(t, a, holder)
	healthy := drvWaitEvent(t, a, holder, 20*time.Second, "Health check passed on "+up)

	notYet := drvWaitEvent(t, a, holder, 15*time.Second, "Holding the lock; not yet in the load balancer: ",
		lb.URI, "connection refused", "load_balancer.uri")
	seen := time.Duration(notYet.Time - healthy.Time)
	harness.Measure(t, "lb_down_healthy_to_first_event", seen)
	if seen > 10*time.Second {
		t.Errorf("the LB that is down was reported %s after the health check passed, want within 10s", seen)
	}
	if ts := drvTaskState(t, a, holder); ts != "running" {
		t.Errorf("task state %q while the holder waits for the LB, want running", ts)
	}

	// Let the retries back off to their cap (the recheck interval) before
	// the LB comes up on its port: the bound below is then the real one.
	time.Sleep(3 * lbRecheck)
	if _, err := srv.Start(addr); err != nil {
		t.Fatal(err)
	}
	upAt := harness.MonoNow()
	add := lbWaitSuccess(t, lb, lbAddID(holder, drvFence(t, first)), 30*time.Second)
	back := lbMonoDur(upAt, add.Finished)
	harness.Measure(t, "lb_back_to_registered", back)
	// The retries back off to one recheck interval, with ±20% jitter;
	// then the POST, the LB's worker and our polls.
	if bound := lbRecheck*6/5 + 1500*time.Millisecond; back > bound {
		t.Errorf("registered %s after the LB came back, want within one recheck interval (%s, +20%% jitter) and the request's own time (%s in all)",
			back, lbRecheck, bound)
	}
	drvWaitEvent(t, a, holder, 10*time.Second, fmt.Sprintf("Registered %s with load balancer service %s", up, j.service))

	// Down again: the next re-check says so; then a normal stop.
	if err := srv.Close(); err != nil {
		t.Logf("close the LB: %v", err)
	}
	drvWaitEvent(t, a, holder, lbRecheck+10*time.Second, "Registered, but the load balancer's state cannot be read",
		"connection refused", "load_balancer.uri")
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	drvWaitEvent(t, a, holder, 40*time.Second, "LB remove failed: ", lb.URI, "connection refused", "load_balancer.uri", up)
	released := drvWaitEvent(t, a, holder, 30*time.Second, "Released lock")
	terminated := drvWaitEvent(t, a, holder, 30*time.Second, api.TaskTerminated)
	gap := time.Duration(terminated.Time - released.Time)
	harness.Measure(t, "lb_down_released_to_terminated", gap)
	if gap > 2*time.Second {
		t.Errorf("Terminated %s after \"Released lock\", want at once: the plugin must not retry a normal exit's REMOVE", gap)
	}

	evs := drvEvents(t, a, holder)
	t.Logf("events:\n%s", drvFormatEvents(evs))
	lbAssertNoCrashWording(t, evs)
	for _, ev := range evs {
		if strings.Contains(drvEventText(ev), key) {
			t.Errorf("a task event shows the LB auth key: %s", drvEventText(ev))
		}
	}
}

// testLBDownForGood: the LB API never answers. The first event comes
// within 10 s; at add_deadline the task stops (exit 74) with an event that
// says the LB API is down, names the URL, the cause and the field, and that
// Nomad restarts the task. Since no call ever connected, neither a cancel
// nor a REMOVE holds the unrouted workload longer; no event speaks of a
// crash.
func testLBDownForGood(t *testing.T, a *harness.Agent) {
	uri := fmt.Sprintf("http://127.0.0.1:%d/baragon/v2/request", harness.FreePort(t))
	j := newLBJob(t, &harness.LB{URI: uri}, "gone", 1)
	j.lbExtra = "          add_deadline     = \"6s\""
	j.restart = "      attempts = 0\n      mode     = \"fail\""
	j.noReschedule = true
	j.run(t, a)
	_, evs := lbCollectEvents(t, a, j.id, api.AllocClientStatusFailed, 90*time.Second)
	t.Logf("events:\n%s", drvFormatEvents(evs))

	healthy := drvMatching(evs, "Health check passed")
	notYet := drvMatching(evs, "Holding the lock; not yet in the load balancer: ", uri, "connection refused", "load_balancer.uri")
	if len(healthy) != 1 || len(notYet) == 0 {
		t.Fatalf("want a health check event and a \"not yet in the load balancer\" event naming the URL, the cause and the field")
	}
	seen := time.Duration(notYet[0].Time - healthy[0].Time)
	harness.Measure(t, "lb_gone_healthy_to_first_event", seen)
	if seen > 10*time.Second {
		t.Errorf("the LB that is down was reported %s after the health check passed, want within 10s", seen)
	}
	failed := drvMatching(evs, "LB add failed: ", "connection refused", "add_deadline (6s)", "the LB API at "+uri+" is down", "load_balancer.uri", lbRestartNote)
	if len(failed) != 1 {
		t.Errorf("%d events say the ADD failed because the LB API is down, with the URL, cause, field and restart; want 1", len(failed))
	} else {
		took := time.Duration(failed[0].Time - healthy[0].Time)
		harness.Measure(t, "lb_gone_healthy_to_add_failed", took)
		// No call ever connected: no cancel wait, and no REMOVE after it.
		if took > 6*time.Second+3*time.Second {
			t.Errorf("the ADD failed %s after the health check, want about its 6s add_deadline", took)
		}
	}
	if m := drvMatching(evs, "LB remove"); len(m) > 0 {
		t.Errorf("a REMOVE followed an ADD that never reached the LB API:\n%s", drvFormatEvents(m))
	}
	lbAssertNoCrashWording(t, evs)
	var codes []int
	for _, ev := range evs {
		if ev.Type == api.TaskTerminated {
			codes = append(codes, ev.ExitCode)
		}
	}
	if !slices.Equal(codes, []int{74}) {
		t.Errorf("Terminated exit codes %v, want [74]", codes)
	}
}

// testLBAnswersFailed: the LB's agents fail every apply, so the ADD ends
// FAILED after Baragon's revert. The event quotes the LB, names what to
// check and says Nomad restarts the task; no REMOVE follows; exit 74.
func testLBAnswersFailed(t *testing.T, a *harness.Agent) {
	lb := lbStartServer(t)
	if err := lb.SetApplyFailure(lbGroup, true); err != nil {
		t.Fatal(err)
	}
	j := newLBJob(t, lb, "failed", 1)
	j.restart = "      attempts = 0\n      mode     = \"fail\""
	j.noReschedule = true
	j.run(t, a)
	allocID, evs := lbCollectEvents(t, a, j.id, api.AllocClientStatusFailed, 90*time.Second)
	t.Logf("events:\n%s", drvFormatEvents(evs))

	if m := drvMatching(evs, "LB add failed: ", "ended FAILED", "Apply failed", "LB agents", lbRestartNote); len(m) != 1 {
		t.Errorf("%d events say the ADD ended FAILED with the LB's message, the fix and the restart, want 1", len(m))
	}
	if m := drvMatching(evs, "LB remove"); len(m) > 0 {
		t.Errorf("a REMOVE followed an ADD that ended FAILED:\n%s", drvFormatEvents(m))
	}
	if rms := lbRequestsWithPrefix(lb, j.service, allocID+"-REMOVE-"); len(rms) > 0 {
		t.Errorf("REMOVE requests after a FAILED ADD:\n%s", lbFormatRequests(rms))
	}
	lbAssertNoCrashWording(t, evs)
	var codes []int
	for _, ev := range evs {
		if ev.Type == api.TaskTerminated {
			codes = append(codes, ev.ExitCode)
		}
	}
	if !slices.Equal(codes, []int{74}) {
		t.Errorf("Terminated exit codes %v, want [74]", codes)
	}
}

// testLBSlowWorker: an LB whose worker runs once a second, as Baragon's
// does. The holder registers; a stop's REMOVE fits the default budget and
// its event says so; no REMOVE fails and nothing speaks of a crash.
func testLBSlowWorker(t *testing.T, a *harness.Agent) {
	lb := harness.StartLB(t, lbapi.Options{Groups: []lbapi.Group{{Name: lbGroup}}, WorkerInterval: time.Second})
	j, first, fence, up := lbRegisteredHolder(t, a, lb, "slow")
	holder := first.AllocID
	add, _ := lb.Request(lbAddID(holder, fence))
	harness.Measure(t, "lb_slow_add_enqueued_to_success", lbMonoDur(add.Enqueued, add.Finished))
	drvWaitEvent(t, a, holder, 10*time.Second, "Registered "+up)

	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	rm := lbWaitSuccess(t, lb, lbRemoveID(holder, fence), 30*time.Second)
	harness.Measure(t, "lb_slow_remove_enqueued_to_success", lbMonoDur(rm.Enqueued, rm.Finished))
	drvWaitEvent(t, a, holder, 30*time.Second, fmt.Sprintf("Removed %s from load balancer service %s", up, j.service))
	drvWaitEvent(t, a, holder, 30*time.Second, api.TaskTerminated)
	evs := drvEvents(t, a, holder)
	if m := drvMatching(evs, "LB remove failed"); len(m) > 0 {
		t.Errorf("the REMOVE failed against a 1 s worker:\n%s", drvFormatEvents(m))
	}
	lbAssertNoCrashWording(t, evs)

	next := j.waitStart(t, 30*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	lbWaitSuccess(t, lb, lbAddID(next.AllocID, drvFence(t, next)), 30*time.Second)
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, lbUpstreamOf(t, a, next.AllocID))
}

// lbAssertNoCrashWording fails if an event of a task whose supervisor
// exited normally speaks of a crash.
func lbAssertNoCrashWording(t *testing.T, evs []*api.TaskEvent) {
	t.Helper()
	if m := drvMatching(evs, "crash"); len(m) > 0 {
		t.Errorf("events speak of a supervisor crash after a normal exit:\n%s", drvFormatEvents(m))
	}
}

// drvTaskState is the task's state as `nomad alloc status` shows it.
func drvTaskState(t *testing.T, a *harness.Agent, allocID string) string {
	t.Helper()
	al, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("alloc %s: %v", drvShort(allocID), err)
	}
	if ts := al.TaskStates[drvTask]; ts != nil {
		return ts.State
	}
	return ""
}
