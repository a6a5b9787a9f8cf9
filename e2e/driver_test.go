package e2e

// End-to-end tests of the `singleton` task driver (bin/plugins/
// nomad-driver-singleton) loaded into real Nomad agents built from the pinned
// module (bin/nomad), with plugin defaults default_ttl = "10s" and
// default_delay = "1s". Every scenario asserts what a user sees: which
// workload runs (processes in /proc, sampled), the records written by
// e2e/testworkload, task events, the lock variable, logs, stats and exec.
//
// Measured numbers are logged as `MEASURE name=value` lines:
//
//	go -C e2e test . -run 'TestDriver' -count=1 -v | grep MEASURE

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDriverDev runs every driver scenario that can share one dev agent,
// concurrently, each with its own job, lock and marker.
func TestDriverDev(t *testing.T) {
	t.Parallel()
	harness.Smoke(t, "singleton_and_handover")
	harness.BuildTestWorkload(t)
	began := time.Now()
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	harness.Measure(t, "driver_dev_agent_ready", time.Since(began))

	runConcurrently(t, []subtest{
		{"singleton_and_handover", func(t *testing.T) { testDrvSingletonHandover(t, a) }},
		{"watchdog_kills_when_supervisor_frozen", func(t *testing.T) { testDrvWatchdogKillsFrozenSupervisorsWorkload(t, a) }},
		{"exec_signal_logs_stats", func(t *testing.T) { testDrvExecSignalLogsStats(t, a) }},
		{"bad_config_fails_fast", func(t *testing.T) { testDrvBadConfigFailsFast(t, a) }},
		{"rolling_update_never_overlaps", func(t *testing.T) { testDrvRollingUpdateNeverOverlaps(t, a) }},
		{"examples_validate", func(t *testing.T) { testDrvExamplesValidate(t, a) }},
	})
}

// TestDriverRecovery runs the scenarios that disturb the client itself, on a
// non-dev cluster (a server and a client with data dirs): the plugin
// process is killed, then the client agent is restarted. The jobs of both
// run from the start, so each fault hits both.
//
// Slow on purpose (about a minute): the client stays stopped past the
// renew interval of a 20 s TTL (drvRestartDown), so that a renew fails and
// must succeed on retry.
func TestDriverRecovery(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	began := time.Now()
	a := harness.StartAgent(t, drvAgentOptions(t, false))
	harness.Measure(t, "driver_cluster_ready", time.Since(began))

	pk := newDrvJob(t, "pluginkill", 2)
	rs := newDrvJob(t, "restart", 2)
	rs.lockBlock = drvRestartLockBlock
	pk.run(t, a)
	rs.run(t, a)

	t.Run("plugin_kill_recovers_task", func(t *testing.T) { testDrvPluginKillRecoversTask(t, a, pk) })
	t.Run("client_restart_keeps_lock", func(t *testing.T) { testDrvClientRestartKeepsLock(t, a, rs) })
}

// testDrvSingletonHandover: three allocations of one
// singleton task. For 30 s exactly one workload runs at every sample; the
// task events show one holder and two waiters naming it. Then the holder's
// allocation is stopped: a standby takes over within 3 s of the old
// workload's exit, the old task reports "Released lock", fences increase,
// and nothing ever overlaps.
func testDrvSingletonHandover(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "single", 3)
	j.run(t, a)
	a.WaitAllocs(t, j.id, 3, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	holder := first.AllocID
	fence1 := drvFence(t, first)

	// Phase 1: 30 s of samples with exactly one workload, counted from
	// the first scan (a busy machine may start scanning late).
	s1 := j.sampler(t)
	s1.WaitSeen(t, 30*time.Second, first.PID)
	time.Sleep(30 * time.Second)
	sum1 := s1.Stop()
	t.Logf("phase 1 samples: %s", sum1)
	span := drvCheckOnlyPID(t, sum1.Samples, first.PID, holder)
	if span < 30*time.Second {
		t.Errorf("samples cover only %s, want >= 30s", span)
	}
	harness.Measure(t, "singleton_samples", len(sum1.Samples))
	harness.Measure(t, "singleton_sampled_for", span)
	if n := len(drvStarts(j.records(t))); n != 1 {
		t.Errorf("%d workload starts during phase 1, want 1:\n%+v", n, j.records(t))
	}

	// One holder, two waiters naming it.
	allocs := drvRunning(t, a, j.id)
	if len(allocs) != 3 {
		t.Fatalf("running allocs %v, want 3", allocs)
	}
	holders, waiters := 0, 0
	for _, id := range allocs {
		evs := drvEvents(t, a, id)
		acq := drvMatching(evs, "Acquired lock (fence ")
		if id == holder {
			want := fmt.Sprintf("Acquired lock (fence %d)", fence1)
			if len(acq) != 1 || !strings.Contains(drvEventText(acq[0]), want) {
				t.Errorf("holder %s: want one %q event, got:\n%s", drvShort(id), want, drvFormatEvents(evs))
			}
			holders += len(acq)
			continue
		}
		if len(acq) != 0 {
			t.Errorf("standby %s has an Acquired event:\n%s", drvShort(id), drvFormatEvents(evs))
			holders += len(acq)
		}
		want := fmt.Sprintf("Waiting for lock %s held by alloc %s on ", j.lockPath(), drvShort(holder))
		if len(drvMatching(evs, want)) == 0 {
			t.Errorf("standby %s: no event %q:\n%s", drvShort(id), want, drvFormatEvents(evs))
		} else {
			waiters++
		}
	}
	if holders != 1 || waiters != 2 {
		t.Errorf("task events show %d holders and %d waiters, want 1 and 2", holders, waiters)
	}
	drvCheckLockHeld(t, a, j.lockPath(), holder, fence1)

	// A standby has no workload to signal, and says so.
	for _, id := range allocs {
		if id == holder {
			continue
		}
		out, err := a.TryNomad(t, "alloc", "signal", "-s", "SIGUSR1", "-task", drvTask, id)
		if err == nil || !strings.Contains(out, "is waiting for lock "+j.lockPath()) {
			t.Errorf("nomad alloc signal on standby %s: err %v, want a refusal naming the lock:\n%s", drvShort(id), err, out)
		}
		break
	}

	// Phase 2: stop the holder's allocation.
	s2 := j.sampler(t)
	stopAt := harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	next := j.waitStart(t, 20*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	end := j.waitEnd(t, first.Instance, 10*time.Second)
	time.Sleep(time.Second)
	sum2 := s2.Stop()
	t.Logf("phase 2 samples: %s", sum2)

	if next.AllocID == holder {
		t.Errorf("the new workload runs in the stopped allocation %s", drvShort(holder))
	}
	if end.Event != harness.EventStop || end.Signal != "SIGINT" {
		t.Errorf("old workload ended with %s %s, want a stop on SIGINT (the task's kill_signal default)", end.Event, end.Signal)
	}
	gap := time.Duration(next.Mono - end.Mono)
	harness.Measure(t, "handover_stop_to_old_exit", time.Duration(end.Mono-stopAt))
	harness.Measure(t, "handover_gap", gap)
	harness.Measure(t, "handover_stopalloc_to_new_start", time.Duration(next.Mono-stopAt))
	if gap < 0 || gap > 3*time.Second {
		t.Errorf("handover gap (old stop record → new start record) %s, want within [0, 3s]", gap)
	}
	fence2 := drvFence(t, next)
	if fence2 <= fence1 {
		t.Errorf("fence did not increase: %d then %d", fence1, fence2)
	}
	drvWaitEvent(t, a, holder, 15*time.Second, "Stopping workload with SIGINT")
	drvWaitEvent(t, a, holder, 15*time.Second, "Released lock")
	drvWaitEvent(t, a, next.AllocID, 15*time.Second, fmt.Sprintf("Acquired lock (fence %d)", fence2))
	harness.CheckNoOverlap(t, j.records(t), sum2)
	drvCheckLockHeld(t, a, j.lockPath(), next.AllocID, fence2)

	starts := drvStarts(j.records(t))
	for i := 1; i < len(starts); i++ {
		if drvFence(t, starts[i]) <= drvFence(t, starts[i-1]) {
			t.Errorf("fences not strictly increasing: %s then %s", starts[i-1].Fence, starts[i].Fence)
		}
	}
}

// testDrvWatchdogKillsFrozenSupervisorsWorkload: the holder's supervisor is
// frozen with SIGSTOP, so it can neither renew nor stop its workload. The
// plugin's watchdog must kill the workload by the fence deadline (+1 s grace),
// say so in a task event, and a standby takes over once the server expires the
// lock, with no overlap.
func testDrvWatchdogKillsFrozenSupervisorsWorkload(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "watchdog", 2)
	j.run(t, a)
	a.WaitAllocs(t, j.id, 2, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	holder := first.AllocID
	fence1 := drvFence(t, first)
	// The standby must be waiting before the fault, or the takeover time
	// measures its start-up instead.
	for _, id := range drvRunning(t, a, j.id) {
		if id != holder {
			drvWaitEvent(t, a, id, 30*time.Second, "Waiting for lock", "held by alloc "+drvShort(holder))
		}
	}

	sup := drvSupervisor(t, holder)
	drvSIGCONTCleanup(t, sup.PID)
	s := j.sampler(t)
	s.WaitSeen(t, 30*time.Second, first.PID)
	stopAt := harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGSTOPped supervisor %d of holder %s (workload pid %d)", sup.PID, drvShort(holder), first.PID)

	killedAt := drvWaitGone(t, first.PID, drvTTL+5*time.Second)
	kill := time.Duration(killedAt - stopAt)
	harness.Measure(t, "watchdog_kill_after_sigstop", kill)
	if kill > drvTTL+2*time.Second {
		t.Errorf("watchdog killed the workload %s after SIGSTOP, want within TTL + 2s", kill)
	}
	drvWaitEvent(t, a, holder, 15*time.Second, "Lock lost: watchdog killed the workload")

	bound := 2*drvTTL + drvDelay + 8*time.Second
	next := j.waitStart(t, bound, func(r harness.Record) bool { return r.Instance != first.Instance })
	takeover := time.Duration(next.Mono - stopAt)
	harness.Measure(t, "watchdog_takeover_after_sigstop", takeover)
	harness.Measure(t, "watchdog_takeover_after_kill", time.Duration(next.Mono-killedAt))
	if takeover > bound {
		t.Errorf("standby took over %s after the SIGSTOP, want < 2×TTL + delay + 8s = %s", takeover, bound)
	}
	if f := drvFence(t, next); f <= fence1 {
		t.Errorf("fence did not increase: %d then %d", fence1, f)
	}
	time.Sleep(time.Second)
	sum := s.Stop()
	t.Logf("samples: %s", sum)
	ivs := harness.CheckNoOverlap(t, j.records(t), sum, harness.KnownEnd{PID: first.PID, Mono: killedAt})
	for _, h := range harness.Handovers(ivs) {
		t.Logf("handover %s → %s: gap %s (old ended by %s)", drvShort(h.From.AllocID), drvShort(h.To.AllocID), h.Gap, h.From.EndedBy)
	}
	if drvAlive(sup.PID) {
		t.Logf("the frozen supervisor %d still exists after the takeover", sup.PID)
	} else {
		t.Logf("the frozen supervisor %d is gone (the watchdog SIGKILLed it)", sup.PID)
	}
}

// testDrvExecSignalLogsStats: `nomad alloc exec` runs in the
// task dir and the task's cgroups and passes exit codes through; `nomad
// alloc signal` reaches the workload; `nomad alloc logs` shows its stdout;
// stats report memory. Also measures the start latency next to raw_exec
// running the same workload, and the plugin's peak RSS.
func testDrvExecSignalLogsStats(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "exec", 1)
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	alloc := first.AllocID
	a.WaitAllocs(t, j.id, 1, api.AllocClientStatusRunning, 30*time.Second)

	// exec: working directory and cgroups.
	out := a.Nomad(t, "alloc", "exec", "-task", drvTask, alloc, "/bin/sh", "-c", "pwd; cat /proc/self/cgroup")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if want := a.TaskDir(alloc, drvTask); strings.TrimSpace(lines[0]) != want {
		t.Errorf("exec pwd = %q, want the task dir %s\n%s", lines[0], want, out)
	}
	execCg := drvAllocCgroups(strings.Join(lines[1:], "\n"), alloc)
	wlCg, err := drvReadFile(fmt.Sprintf("/proc/%d/cgroup", first.PID))
	if err != nil {
		t.Fatal(err)
	}
	wantCg := drvAllocCgroups(wlCg, alloc)
	if len(wantCg) == 0 {
		t.Errorf("the workload is in no cgroup of its allocation:\n%s", wlCg)
	}
	if !slices.Equal(execCg, wantCg) {
		t.Errorf("exec runs in cgroups %q, want the workload's %q", execCg, wantCg)
	}
	t.Logf("exec and workload cgroups: %q", execCg)

	// exec: exit codes pass through.
	out, err = a.TryNomad(t, "alloc", "exec", "-task", drvTask, alloc, "/bin/sh", "-c", "echo to-stderr >&2; exit 7")
	if code := drvExitCode(err); code != 7 {
		t.Errorf("exec `exit 7`: exit code %d (err %v), want 7\n%s", code, err, out)
	}
	if !strings.Contains(out, "to-stderr") {
		t.Errorf("exec output lacks the command's stderr: %q", out)
	}
	if out := a.Nomad(t, "alloc", "exec", "-task", drvTask, alloc, "/bin/sh", "-c", "echo $NOMAD_ALLOC_ID"); strings.TrimSpace(out) != alloc {
		t.Errorf("exec env NOMAD_ALLOC_ID = %q, want %s", out, alloc)
	}

	// signal reaches the workload.
	a.Nomad(t, "alloc", "signal", "-s", "SIGUSR1", "-task", drvTask, alloc)
	harness.WaitRecord(t, j.record, 10*time.Second, func(r harness.Record) bool {
		return r.Instance == first.Instance && r.Event == harness.EventSignal && r.Signal == "SIGUSR1"
	})

	// logs show the workload's stdout.
	wantLog := fmt.Sprintf("testworkload started role=main pid=%d alloc=%s fence=%s", first.PID, alloc, first.Fence)
	deadline := time.Now().Add(15 * time.Second)
	for {
		out := a.Nomad(t, "alloc", "logs", alloc, drvTask)
		if strings.Contains(out, wantLog) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("nomad alloc logs lacks %q:\n%s", wantLog, out)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// stats.
	if mem := drvWaitMemStats(t, a, alloc, time.Time{}); mem != nil {
		harness.Measure(t, "task_stats_rss_bytes", mem.RSS)
		harness.Measure(t, "task_stats_usage_bytes", mem.Usage)
	}
	if out := a.Nomad(t, "alloc", "status", "-stats", alloc); !strings.Contains(out, "Memory") {
		t.Errorf("nomad alloc status -stats shows no memory:\n%s", out)
	}

	// Peak RSS of the plugin and of the task's supervisor.
	plugin := drvPlugin(t, a.Client().PID(), 0, 10*time.Second)
	if hwm, err := harness.ProcStatus(plugin.PID, "VmHWM"); err == nil {
		harness.Measure(t, "plugin_vmhwm", strings.ReplaceAll(hwm, " ", ""))
	}
	if hwm, err := harness.ProcStatus(drvSupervisor(t, alloc).PID, "VmHWM"); err == nil {
		harness.Measure(t, "supervisor_vmhwm", strings.ReplaceAll(hwm, " ", ""))
	}

	drvMeasureStartLatency(t, a)
}

// drvMeasureStartLatency starts a fresh singleton job and a raw_exec job
// running the same workload at the same moment, three times, and logs the
// time from each task's "Task Setup" and "Started" (StartTask returned)
// events to the workload's start record. The singleton figure includes
// starting the supervisor and taking a free lock.
func drvMeasureStartLatency(t *testing.T, a *harness.Agent) {
	for round := 1; round <= 3; round++ {
		single := newDrvJob(t, fmt.Sprintf("lat-singleton-%d", round), 1)
		raw := newDrvJob(t, fmt.Sprintf("lat-rawexec-%d", round), 1)
		raw.driver = "raw_exec"
		single.run(t, a)
		raw.run(t, a)
		for _, j := range []*drvJob{single, raw} {
			start := j.waitStart(t, 60*time.Second, nil)
			a.WaitAllocs(t, j.id, 1, api.AllocClientStatusRunning, 30*time.Second)
			drvMeasureStart(t, a, fmt.Sprintf("%s_%d", j.driver, round), start.AllocID, start)
		}
		for _, j := range []*drvJob{single, raw} {
			if _, _, err := a.API().Jobs().Deregister(j.id, false, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// drvMeasureStart logs the time from the task's Task Setup and Started
// events to the workload's start record.
func drvMeasureStart(t *testing.T, a *harness.Agent, name, allocID string, start harness.Record) {
	t.Helper()
	evs := drvEvents(t, a, allocID)
	for _, typ := range []string{api.TaskSetup, api.TaskStarted} {
		i := slices.IndexFunc(evs, func(ev *api.TaskEvent) bool { return ev.Type == typ })
		if i < 0 {
			t.Errorf("%s alloc %s has no %q event:\n%s", name, drvShort(allocID), typ, drvFormatEvents(evs))
			continue
		}
		d := start.Wall.Sub(time.Unix(0, evs[i].Time))
		harness.Measure(t, fmt.Sprintf("start_latency_%s_from_%s", name, strings.ToLower(strings.ReplaceAll(typ, " ", "_"))), d)
	}
}

// drvAllocCgroups returns the lines of a /proc/<pid>/cgroup text that name a
// cgroup of the allocation, sorted.
func drvAllocCgroups(text, allocID string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, allocID) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	slices.Sort(out)
	return out
}

// testDrvBadConfigFailsFast: configuration mistakes fail the task fast
// with an event that says what to fix.
func testDrvBadConfigFailsFast(t *testing.T, a *harness.Agent) {
	cases := []struct {
		name   string
		modify func(j *drvJob)
		want   []string
	}{
		{"ttl_out_of_range", func(j *drvJob) { j.lockBlock = `ttl = "5s"` },
			[]string{api.TaskDriverFailure, "TTL 5s is out of range", "10s to 24h"}},
		// command is optional in the schema (a gate needs none), so the
		// driver names the fix at start.
		{"missing_command", func(j *drvJob) { j.noCommand = true },
			[]string{api.TaskDriverFailure, "config.command is missing", "config.gate = true"}},
		{"unknown_field", func(j *drvJob) { j.configExtra = `colour = "blue"` },
			[]string{api.TaskFailedValidation, `"colour"`}},
		{"no_identity", func(j *drvJob) { j.noIdentity = true },
			[]string{api.TaskDriverFailure, "identity { env = true }"}},
	}
	var subtests []subtest
	for _, c := range cases {
		subtests = append(subtests, subtest{c.name, func(t *testing.T) {
			j := newDrvJob(t, "bad-"+strings.ReplaceAll(c.name, "_", "-"), 1)
			j.failFast = true
			c.modify(j)
			j.run(t, a)
			began := time.Now()
			allocs := a.WaitAllocs(t, j.id, 1, api.AllocClientStatusFailed, 60*time.Second)
			ev := drvWaitEvent(t, a, allocs[0].ID, 10*time.Second, c.want...)
			t.Logf("event: %s", drvEventText(ev))
			harness.Measure(t, "bad_config_"+c.name+"_failed_after", time.Since(began))
			if recs := j.records(t); len(recs) != 0 {
				t.Errorf("the workload ran despite the bad config: %+v", recs)
			}
		}})
	}
	runConcurrently(t, subtests)
}

// testDrvRollingUpdateNeverOverlaps: a changed jobspec (a workload argument
// and meta) rolls out one allocation at a time; the new version ends up
// holding the lock, and no two workloads ever overlap.
func testDrvRollingUpdateNeverOverlaps(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "rolling", 2)
	j.update = `    max_parallel     = 1
    min_healthy_time = "1s"
    healthy_deadline = "1m"
    progress_deadline = "2m"`
	j.args = []string{"v1"}
	j.meta = map[string]string{"version": "1"}
	j.run(t, a)
	first := j.waitStart(t, 60*time.Second, nil)
	drvWaitDeployment(t, a, j.id, 0, 90*time.Second)

	s := j.sampler(t)
	updateAt := harness.MonoNow()
	j.args = []string{"v2"}
	j.meta = map[string]string{"version": "2"}
	j.run(t, a)
	drvWaitDeployment(t, a, j.id, 1, 120*time.Second)
	v2 := j.waitStart(t, 30*time.Second, func(r harness.Record) bool { return slices.Contains(r.Argv, "v2") })
	time.Sleep(time.Second)
	sum := s.Stop()
	t.Logf("samples: %s", sum)
	harness.Measure(t, "rolling_update_to_v2_start", time.Duration(v2.Mono-updateAt))

	recs := j.records(t)
	version := map[string]string{} // instance → v1 or v2
	for _, r := range drvStarts(recs) {
		version[r.Instance] = r.Argv[len(r.Argv)-1]
	}
	ivs := harness.CheckNoOverlap(t, recs, sum)
	for _, h := range harness.Handovers(ivs) {
		from, to := version[h.From.Instance], version[h.To.Instance]
		harness.Measure(t, fmt.Sprintf("rolling_handover_%s_to_%s_gap", from, to), h.Gap)
		if h.Gap > 3*time.Second {
			t.Errorf("handover %s → %s took %s, want < 3s (graceful stops)", from, to, h.Gap)
		}
	}
	if last := ivs[len(ivs)-1]; last.Ended || last.Instance != v2.Instance {
		t.Errorf("the running workload is %+v, want the v2 one %s", last, v2.Instance)
	}
	if drvFence(t, v2) <= drvFence(t, first) {
		t.Errorf("fence did not increase: %s then %s", first.Fence, v2.Fence)
	}
	al, _, err := a.API().Allocations().Info(v2.AllocID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if al.Job == nil || al.Job.Version == nil || *al.Job.Version != 1 {
		t.Errorf("the new holder %s does not run job version 1: %+v", drvShort(v2.AllocID), al.Job)
	}
	drvCheckLockHeld(t, a, j.lockPath(), v2.AllocID, drvFence(t, v2))
}

// drvWaitDeployment waits until the job's deployment of version succeeded.
func drvWaitDeployment(t *testing.T, a *harness.Agent, jobID string, version uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, _, err := a.API().Jobs().LatestDeployment(jobID, nil)
		if err == nil && d != nil && d.JobVersion == version {
			switch d.Status {
			case api.DeploymentStatusSuccessful:
				return
			case api.DeploymentStatusFailed, api.DeploymentStatusCancelled:
				t.Fatalf("deployment of %s v%d: %s (%s)", jobID, version, d.Status, d.StatusDescription)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("deployment of %s v%d not successful after %s: %+v (err %v)", jobID, version, timeout, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testDrvExamplesValidate: every examples/*.nomad.hcl passes `nomad job
// validate` against the agent with the plugin loaded.
func testDrvExamplesValidate(t *testing.T, a *harness.Agent) {
	files, err := filepath.Glob(filepath.Join(harness.RepoRoot(t), "examples", "*.nomad.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.nomad.hcl")
	}
	for _, f := range files {
		out, err := a.TryNomad(t, "job", "validate", f)
		if err != nil {
			t.Errorf("nomad job validate %s: %v\n%s", filepath.Base(f), err, out)
			continue
		}
		t.Logf("%s: %s", filepath.Base(f), strings.TrimSpace(out))
	}
}

// testDrvPluginKillRecoversTask: the plugin process is SIGKILLed. Nomad
// relaunches it and it recovers the task: the same workload keeps running
// past a TTL, the lock is never lost (same holder and fence on the server,
// no "Lock lost" event), and the recovered handle still stops the task
// gracefully, with its exit code.
func testDrvPluginKillRecoversTask(t *testing.T, a *harness.Agent, j *drvJob) {
	a.WaitAllocs(t, j.id, 2, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	holder := first.AllocID
	fence := drvFence(t, first)
	lockID := drvCheckLockHeld(t, a, j.lockPath(), holder, fence)

	drvWaitMemStats(t, a, holder, time.Time{})
	agentPID := a.Client().PID()
	plugin := drvPlugin(t, agentPID, 0, 10*time.Second)
	if hwm, err := harness.ProcStatus(plugin.PID, "VmHWM"); err == nil {
		harness.Measure(t, "plugin_vmhwm_before_kill", strings.ReplaceAll(hwm, " ", ""))
	}
	sup := drvSupervisor(t, holder)
	s := j.sampler(t)
	s.WaitSeen(t, 30*time.Second, first.PID) // the span below starts before the kill
	logFrom := drvFileSize(a.Client().LogPath())
	killAt, killWall := harness.MonoNow(), time.Now()
	if err := syscall.Kill(plugin.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILLed plugin %d (agent %d); supervisor %d keeps running", plugin.PID, agentPID, sup.PID)
	plugin2 := drvPlugin(t, agentPID, plugin.PID, 60*time.Second)
	harness.Measure(t, "plugin_relaunch", time.Duration(harness.MonoNow()-killAt))
	drvWaitLog(t, a.Client().LogPath(), logFrom, 60*time.Second, "recovered supervisor", holder)
	harness.Measure(t, "plugin_recovered_task", time.Duration(harness.MonoNow()-killAt))

	// Sample past a TTL after the kill.
	for time.Duration(harness.MonoNow()-killAt) < drvTTL+3*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	sum := s.Stop()
	t.Logf("samples: %s", sum)
	span := drvCheckOnlyPID(t, sum.Samples, first.PID, holder)
	harness.Measure(t, "plugin_kill_sampled_for", span)
	if span < drvTTL+2*time.Second {
		t.Errorf("sampled for %s, want > TTL", span)
	}
	if !drvAlive(sup.PID) {
		t.Errorf("the supervisor %d died with the plugin", sup.PID)
	}
	evs := drvEvents(t, a, holder)
	if lost := drvMatching(evs, "Lock lost"); len(lost) > 0 {
		t.Errorf("lock lost across the plugin kill:\n%s", drvFormatEvents(evs))
	}
	if n := len(drvMatching(evs, "Acquired lock")); n != 1 {
		t.Errorf("%d Acquired events, want 1:\n%s", n, drvFormatEvents(evs))
	}
	if id := drvCheckLockHeld(t, a, j.lockPath(), holder, fence); id != lockID {
		t.Errorf("lock ID changed across the plugin kill")
	}
	if n := len(drvStarts(j.records(t))); n != 1 {
		t.Errorf("%d workload starts, want 1 (no restart, no failover)", n)
	}
	if hwm, err := harness.ProcStatus(plugin2.PID, "VmHWM"); err == nil {
		harness.Measure(t, "plugin_vmhwm_after_recovery", strings.ReplaceAll(hwm, " ", ""))
	}

	// The recovered handle still works: stats, exec, signal, then a
	// graceful stop.
	drvWaitMemStats(t, a, holder, killWall)
	if out := a.Nomad(t, "alloc", "exec", "-task", drvTask, holder, "/bin/sh", "-c", "pwd"); strings.TrimSpace(out) != a.TaskDir(holder, drvTask) {
		t.Errorf("exec after recovery: pwd = %q, want the task dir", out)
	}
	a.Nomad(t, "alloc", "signal", "-s", "SIGUSR2", "-task", drvTask, holder)
	harness.WaitRecord(t, j.record, 10*time.Second, func(r harness.Record) bool {
		return r.Instance == first.Instance && r.Event == harness.EventSignal && r.Signal == "SIGUSR2"
	})
	stopAt := harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	end := j.waitEnd(t, first.Instance, 15*time.Second)
	if end.Event != harness.EventStop {
		t.Errorf("workload ended with %q, want a graceful stop", end.Event)
	}
	drvWaitEvent(t, a, holder, 15*time.Second, "Released lock")
	term := a.WaitTaskEvent(t, holder, drvTask, api.TaskTerminated, 15*time.Second)
	if term.ExitCode != 0 {
		t.Errorf("terminated with exit code %d, want the workload's 0: %s", term.ExitCode, drvEventText(term))
	}
	next := j.waitStart(t, 15*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	harness.Measure(t, "plugin_kill_then_stop_handover", time.Duration(next.Mono-end.Mono))
	harness.Measure(t, "plugin_kill_stopalloc_to_exit", time.Duration(end.Mono-stopAt))
}

// The client-restart scenarios use a longer TTL, so that a loaded machine's
// slow agent start cannot eat the margin: the client stays stopped from right
// after a renewal past the renew interval (10s), so a renew fails and must
// succeed on retry, and comes back well inside the fence deadline (18s).
const (
	drvRestartTTL  = 20 * time.Second
	drvRestartDown = drvRestartTTL/2 + 300*time.Millisecond
)

// drvRestartLockBlock is the lock block of the client-restart jobs.
var drvRestartLockBlock = fmt.Sprintf("ttl = %q\n          delay = %q", drvRestartTTL.String(), drvDelayHCL)

// testDrvClientRestartKeepsLock: the client agent is stopped right after
// a renewal and started again 5.3 s later, within the TTL: one renew fails
// and is retried. The workload keeps running (same PID), the standby never
// starts, and no lock is lost.
func testDrvClientRestartKeepsLock(t *testing.T, a *harness.Agent, j *drvJob) {
	a.WaitAllocs(t, j.id, 2, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	holder := first.AllocID
	fence := drvFence(t, first)
	lockID := drvCheckLockHeld(t, a, j.lockPath(), holder, fence)
	var standby string
	for _, id := range drvRunning(t, a, j.id) {
		if id != holder {
			standby = id
		}
	}
	if standby == "" {
		t.Fatalf("no standby allocation")
	}
	drvWaitEvent(t, a, standby, 30*time.Second, "Waiting for lock", "held by alloc "+drvShort(holder))
	sup := drvSupervisor(t, holder)
	oldPlugin := drvPlugin(t, a.Client().PID(), 0, 10*time.Second)

	s := j.sampler(t)
	logFrom := drvFileSize(a.Client().LogPath())
	fenceDeadline := drvWaitRenew(t, a, holder, drvRestartTTL)
	stopAt := harness.MonoNow()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped, restartWall := harness.MonoNow(), time.Now()
	// Stay down past the renew interval (TTL/2), so that a renew fails and
	// must succeed on retry after the restart, but well inside the fence
	// deadline (TTL - margin after the last renew).
	time.Sleep(time.Duration(stopAt + int64(drvRestartDown) - harness.MonoNow()))
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	ready := harness.MonoNow()
	harness.Measure(t, "client_stop", time.Duration(stopped-stopAt))
	harness.Measure(t, "client_down_until_ready", time.Duration(ready-stopAt))
	harness.Measure(t, "client_ready_before_fence_deadline", time.Duration(fenceDeadline-ready))
	if d := time.Duration(ready - stopAt); d >= drvRestartTTL-2*time.Second {
		t.Errorf("the client was down for %s, want less than TTL - margin: fix the test timing", d)
	}
	drvWaitLog(t, a.Client().LogPath(), logFrom, 30*time.Second, "recovered supervisor", holder)
	harness.Measure(t, "client_restart_recovered_task", time.Duration(harness.MonoNow()-stopAt))
	if p := drvPlugin(t, a.Client().PID(), 0, 10*time.Second); p.PID == oldPlugin.PID {
		t.Logf("the agent reattached to the old plugin %d", p.PID)
	}

	// Sample past the fence deadline after the restart.
	for time.Duration(harness.MonoNow()-ready) < drvRestartTTL/2+2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	sum := s.Stop()
	t.Logf("samples: %s", sum)
	span := drvCheckOnlyPID(t, sum.Samples, first.PID, holder)
	harness.Measure(t, "client_restart_sampled_for", span)
	if !drvAlive(sup.PID) {
		t.Errorf("the supervisor %d did not survive the client restart", sup.PID)
	}
	recs := j.records(t)
	for _, r := range drvStarts(recs) {
		if r.Instance != first.Instance {
			t.Errorf("another workload started (failover): %+v", r)
		}
	}
	evs := drvEvents(t, a, holder)
	if lost := drvMatching(evs, "Lock lost"); len(lost) > 0 {
		t.Errorf("lock lost across the client restart:\n%s", drvFormatEvents(evs))
	}
	if n := len(drvMatching(evs, "Acquired lock")); n != 1 {
		t.Errorf("%d Acquired events, want 1:\n%s", n, drvFormatEvents(evs))
	}
	if acq := drvMatching(drvEvents(t, a, standby), "Acquired lock"); len(acq) > 0 {
		t.Errorf("the standby acquired the lock:\n%s", drvFormatEvents(drvEvents(t, a, standby)))
	}
	if id := drvCheckLockHeld(t, a, j.lockPath(), holder, fence); id != lockID {
		t.Errorf("lock ID changed across the client restart")
	}

	// The restarted client serves the recovered task's stats.
	drvWaitMemStats(t, a, holder, restartWall)

	// The supervisor did see Nomad gone and rode it out.
	stderr := a.AllocLogs(t, holder, drvTask, "stderr")
	fails := strings.Count(stderr, "renew failed, retrying")
	harness.Measure(t, "client_restart_failed_renews", fails)
	if fails == 0 {
		t.Errorf("no failed renew in the supervisor's log: the restart did not span a renew interval\n%s", stderr)
	}

	// The recovered task still stops gracefully and hands over.
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	end := j.waitEnd(t, first.Instance, 15*time.Second)
	drvWaitEvent(t, a, holder, 15*time.Second, "Released lock")
	next := j.waitStart(t, 15*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	if next.AllocID != standby {
		t.Logf("the new holder is %s, not the standby %s", drvShort(next.AllocID), drvShort(standby))
	}
	harness.Measure(t, "client_restart_then_stop_handover", time.Duration(next.Mono-end.Mono))
}

// drvWaitLog waits until a log file has a line, after its first from
// bytes, containing every one of subs.
func drvWaitLog(t *testing.T, path string, from int64, timeout time.Duration, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		text, _ := drvReadFile(path)
		if int64(len(text)) >= from {
			text = text[from:]
		}
		for _, l := range strings.Split(text, "\n") {
			ok := true
			for _, s := range subs {
				if !strings.Contains(l, s) {
					ok = false
					break
				}
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no line containing %q after %s", path, subs, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
