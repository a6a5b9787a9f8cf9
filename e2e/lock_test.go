package e2e

// End-to-end tests of the `lock` binary (bin/lock) against real Nomad agents
// built from the pinned module (bin/nomad). Every scenario asserts what a user
// sees: which workload runs, the lock variable, exit codes in task events,
// logs, records written by e2e/testworkload, and processes in /proc.
//
// Measured numbers are logged as `MEASURE name=value` lines:
//
//	go -C e2e test . -run 'TestLock' -count=1 -v | grep MEASURE

import (
	"encoding/json"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestLockDev runs every scenario that can share one dev agent, concurrently:
// jobs with `lock` under raw_exec and exec, and `lock` run directly against
// the agent's HTTP API.
func TestLockDev(t *testing.T) {
	t.Parallel()
	harness.Smoke(t, "stop_hands_over_without_overlap")
	workload := harness.BuildTestWorkload(t)
	// The exec scenario mounts a copy of bin/lock, alone in its directory,
	// the way a user would ship it on a host volume.
	lockDir := t.TempDir()
	copyFile(t, harness.LockBin(t), filepath.Join(lockDir, "lock"), 0o755)
	execRecords := t.TempDir()

	began := time.Now()
	a := harness.StartAgent(t, harness.AgentOptions{
		Dev: true,
		HostVolumes: map[string]string{
			"lockbin":      lockDir,
			"testworkload": filepath.Dir(workload),
			"lockrecords":  execRecords,
		},
		// The static lock and testworkload need nothing from the host; the
		// task's user (nobody) is looked up in the chroot by Nomad 1.10's
		// exec driver, and on the host by 1.11's.
		ChrootEnv: map[string]string{"/etc/hosts": "/etc/hosts", "/etc/passwd": "/etc/passwd", "/etc/group": "/etc/group"},
	})
	t.Logf("MEASURE dev_agent_ready=%s", harness.Millis(time.Since(began)))

	runConcurrently(t, []subtest{
		{"one_workload_among_three", func(t *testing.T) { testOneWorkloadAmongThree(t, a) }},
		{"stop_hands_over_without_overlap", func(t *testing.T) { testStopHandsOverWithoutOverlap(t, a) }},
		{"crash_kills_workload_then_expiry_hands_over", func(t *testing.T) { testCrashKillsWorkloadThenExpiryHandsOver(t, a) }},
		{"loss_stops_workload_before_fence", func(t *testing.T) { testLossStopsWorkloadBeforeFence(t, a) }},
		{"argv_and_exit_code_pass_through", func(t *testing.T) { testArgvAndExitCodePassThrough(t, a) }},
		{"exec_driver_entrypoint_holds_lock", func(t *testing.T) { testExecDriverEntrypointHoldsLock(t, a, execRecords) }},
		{"plain_signals", func(t *testing.T) { testPlainSignals(t, a) }},
		{"plain_wait", func(t *testing.T) { testPlainWait(t, a) }},
		{"plain_badflags", func(t *testing.T) { testPlainBadFlags(t, a) }},
		{"plain_status", func(t *testing.T) { testPlainStatus(t, a) }},
		{"plain_crash", func(t *testing.T) { testPlainCrash(t, a) }},
	})
}

// testOneWorkloadAmongThree: three allocations run `lock` around the
// workload. For 30 s, and at least 100 samples, exactly one workload runs at
// every sample, the variable names its allocation, and the two others run,
// waiting, saying for whom.
func testOneWorkloadAmongThree(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "singleton")
	a.RunJobHCL(t, jobHCL(s.job, "service", s.lockGroup(t, 3, nil, nil)))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	a.WaitAllocs(t, s.job, 3, api.AllocClientStatusRunning, 60*time.Second)
	first := waitMainStart(t, s.record, 60*time.Second, nil)
	holder := first.AllocID

	sum := harness.SampleForAtLeast(t, harness.SamplerOptions{
		Marker: s.marker, Filter: harness.Proc.IsMainWorkload, Interval: 25 * time.Millisecond,
	}, 30*time.Second, 100, 3*time.Minute)
	t.Logf("sampler: %s", sum)
	t.Logf("MEASURE singleton_samples=%d singleton_max_allocs=%d", len(sum.Samples), sum.MaxAllocs)
	bad := 0
	for _, smp := range sum.Samples {
		if smp.Err != nil || len(smp.PIDs) != 1 || !slices.Equal(smp.Allocs, []string{holder}) {
			if bad < 5 {
				t.Errorf("sample at %s: pids %v allocs %v err %v; want exactly the holder %s",
					smp.Wall.Format("15:04:05.000"), smp.PIDs, smp.Allocs, smp.Err, holder)
			}
			bad++
		}
	}
	if bad > 0 || len(sum.Samples) < 100 {
		t.Errorf("%d of %d samples did not show exactly one workload", bad, len(sum.Samples))
	}
	recs := readRecords(t, s.record)
	ivs := harness.CheckNoOverlap(t, recs, sum)
	if len(ivs) != 1 || ivs[0].Ended {
		t.Errorf("want one workload that never stopped, got intervals %+v", ivs)
	}

	v := readLock(t, a, s.path)
	if v.Lock == nil || v.Lock.ID == "" {
		t.Fatalf("lock %s is not held: %+v", s.path, v)
	}
	if got := v.Items["holder_alloc_id"]; got != holder {
		t.Errorf("variable names holder_alloc_id=%q, want the running workload's alloc %s", got, holder)
	}
	if got := strconv.FormatUint(v.ModifyIndex, 10); got != first.Fence {
		t.Errorf("NOMAD_LOCK_FENCE %s, want the variable's ModifyIndex %s", first.Fence, got)
	}

	allocs := a.WaitAllocs(t, s.job, 3, api.AllocClientStatusRunning, 10*time.Second)
	procs, err := harness.FindProcs(s.marker)
	if err != nil {
		t.Fatal(err)
	}
	waiting := 0
	for _, al := range allocs {
		if ts := al.TaskStates[taskName]; ts == nil || ts.Restarts != 0 {
			t.Errorf("alloc %s task state %+v, want running without restarts", al.ID, ts)
		}
		if al.ID == holder {
			continue
		}
		waiting++
		if !slices.ContainsFunc(procs, func(p harness.Proc) bool { return p.AllocID == al.ID && isLockExe(p) }) {
			t.Errorf("standby alloc %s has no live lock process: %v", al.ID, procs)
		}
		a.WaitAllocLog(t, al.ID, taskName, "stderr", 10*time.Second,
			"lock is held, waiting", "alloc "+holder[:8])
	}
	if waiting != 2 {
		t.Errorf("want 2 waiting allocations besides the holder, got %d", waiting)
	}
	for _, p := range mainWorkloads(t, s.marker) {
		if p.AllocID != holder {
			t.Errorf("a workload runs outside the holder: %v", p)
		}
	}
}

// testStopHandsOverWithoutOverlap: stopping the holder's allocation hands the
// lock to a standby: the gap from the old workload's stop to the new one's
// start is short, nothing overlaps, and the fence grows.
func testStopHandsOverWithoutOverlap(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "handover")
	a.RunJobHCL(t, jobHCL(s.job, "service", s.lockGroup(t, 3, nil, nil)))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	allocs := a.WaitAllocs(t, s.job, 3, api.AllocClientStatusRunning, 60*time.Second)
	first := waitMainStart(t, s.record, 60*time.Second, nil)
	var standbys []string
	for _, al := range allocs {
		if al.ID != first.AllocID {
			standbys = append(standbys, al.ID)
		}
	}
	// Every standby has found the lock held and parks its blocking query.
	for _, id := range standbys {
		a.WaitAllocLog(t, id, taskName, "stderr", 30*time.Second, "lock is held, waiting")
	}

	sampler := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	stopAt := harness.MonoNow()
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatalf("stop alloc %s: %v", first.AllocID, err)
	}
	next := waitMainStart(t, s.record, 30*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	time.Sleep(300 * time.Millisecond)
	sum := sampler.Stop()

	stop := harness.WaitRecord(t, s.record, 10*time.Second, func(r harness.Record) bool {
		return r.Instance == first.Instance && r.Event == harness.EventStop
	})
	gap := time.Duration(next.Mono - stop.Mono)
	t.Logf("MEASURE handover_gap=%s handover_stop_call_to_start=%s old_stop_signal=%s",
		harness.Millis(gap), harness.Millis(time.Duration(next.Mono-stopAt)), stop.Signal)
	if gap < 0 || gap > 3*time.Second {
		t.Errorf("handover gap %s (old stop → new start), want 0 ≤ gap < 3s", gap)
	}
	if stop.Signal != "SIGINT" {
		t.Errorf("old workload stopped by %q, want SIGINT (raw_exec's kill_signal, passed on as is)", stop.Signal)
	}
	if !slices.Contains(standbys, next.AllocID) {
		t.Errorf("the new holder is alloc %s, want one of the waiting standbys %v", next.AllocID, standbys)
	}
	harness.CheckNoOverlap(t, readRecords(t, s.record), sum)
	if f1, f2 := fence(t, first), fence(t, next); f2 <= f1 {
		t.Errorf("fence did not grow: old %d, new %d", f1, f2)
	} else {
		t.Logf("fence %d → %d", f1, f2)
	}
	if v := readLock(t, a, s.path); v.Items["holder_alloc_id"] != next.AllocID {
		t.Errorf("variable names %q, want the new holder %s", v.Items["holder_alloc_id"], next.AllocID)
	}
}

// testCrashKillsWorkloadThenExpiryHandsOver: SIGKILL to the holder's `lock`
// takes its workload and the workload's children down at once; a standby takes
// over once the server expires the lock (2×TTL + delay), with no overlap.
func testCrashKillsWorkloadThenExpiryHandsOver(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "crash")
	g := s.lockGroup(t, 3, nil, []string{"-children", "2"})
	g.failFast = true // the killed allocation must not come back and compete
	a.RunJobHCL(t, jobHCL(s.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	a.WaitAllocs(t, s.job, 3, api.AllocClientStatusRunning, 60*time.Second)
	first := waitMainStart(t, s.record, 60*time.Second, nil)
	holder := first.AllocID
	deadline := time.Now().Add(10 * time.Second)
	var group []harness.Proc
	for {
		procs, err := harness.FindProcs(s.marker)
		if err != nil {
			t.Fatal(err)
		}
		group = group[:0]
		for _, p := range procs {
			if p.AllocID == holder && p.IsTestWorkload() {
				group = append(group, p)
			}
		}
		if len(group) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(group) != 3 {
		t.Fatalf("want the workload and its 2 children in alloc %s, found %v", holder, group)
	}
	lock, _ := lockOf(t, s.marker, first.PID)
	if lock.Exe != harness.LockBin(t) {
		t.Errorf("the workload's parent runs %q, want %s", lock.Exe, harness.LockBin(t))
	}

	sampler := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	sampler.WaitSeen(t, 30*time.Second, first.PID) // the sampler must see the workload alive to see it die
	killAt := harness.MonoNow()
	if err := syscall.Kill(lock.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL lock %d: %v", lock.PID, err)
	}
	// The workload and its grandchildren die with lock: no orphan.
	var left []harness.Proc
	for {
		procs, err := harness.FindProcs(s.marker)
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, p := range procs {
			if p.AllocID == holder {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Duration(harness.MonoNow()-killAt) > 2*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	goneAt := harness.MonoNow()
	goneAfter := time.Duration(goneAt - killAt)
	t.Logf("MEASURE crash_group_gone=%s", harness.Millis(goneAfter))
	if len(left) > 0 {
		t.Errorf("%d process(es) of alloc %s still alive %s after SIGKILL to lock: %v", len(left), holder, goneAfter, left)
	}

	next := waitMainStart(t, s.record, 45*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	takeover := time.Duration(next.Mono - killAt)
	t.Logf("MEASURE crash_takeover=%s", harness.Millis(takeover))
	time.Sleep(300 * time.Millisecond)
	sum := sampler.Stop()
	if next.AllocID == holder {
		t.Errorf("the crashed allocation %s took the lock again", holder)
	}
	// The server expires the lock 2×TTL after the last renew, then waits the
	// lock delay: 21 s at most. Loose bound.
	if takeover > 30*time.Second {
		t.Errorf("standby took over %s after the crash, want < 30s (2×TTL + delay + slack)", takeover)
	}
	ivs := harness.CheckNoOverlap(t, readRecords(t, s.record), sum, harness.KnownEnd{PID: first.PID, Mono: goneAt})
	for _, iv := range ivs {
		if iv.Instance == first.Instance && (!iv.Ended || iv.EndedBy != "observed") {
			t.Errorf("crashed workload's interval %+v: want it ended, observed by the sampler", iv)
		}
	}
	if f1, f2 := fence(t, first), fence(t, next); f2 <= f1 {
		t.Errorf("fence did not grow: old %d, new %d", f1, f2)
	}
	if v := readLock(t, a, s.path); v.Lock == nil || v.Items["holder_alloc_id"] != next.AllocID {
		t.Errorf("variable: lock %+v holder %q, want held by the new holder %s", v.Lock, v.Items["holder_alloc_id"], next.AllocID)
	}
}

// testLossStopsWorkloadBeforeFence: releasing the holder's lock behind its
// back (as an operator with the lock ID could) stops the workload within
// milliseconds, well before the fence deadline, and `lock` exits 76.
func testLossStopsWorkloadBeforeFence(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "loss")
	g := s.lockGroup(t, 1, nil, nil)
	g.failFast = true
	a.RunJobHCL(t, jobHCL(s.job, "service", g))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	alloc := a.WaitAllocs(t, s.job, 1, api.AllocClientStatusRunning, 60*time.Second)[0]
	start := waitMainStart(t, s.record, 60*time.Second, nil)
	// With ACLs off, the management API shows the lock ID.
	v := readLock(t, a, s.path)
	if v.Lock == nil || v.Lock.ID == "" {
		t.Fatalf("lock %s not held: %+v", s.path, v)
	}
	releasedAt := harness.MonoNow()
	if _, _, err := a.API().Variables().ReleaseLock(&api.Variable{Path: s.path, Lock: &api.VariableLock{ID: v.Lock.ID}}, nil); err != nil {
		t.Fatalf("release %s behind the holder's back: %v", s.path, err)
	}

	// Fence deadline: TTL - margin after the last renew; 9 s is the loose bound.
	stop := harness.WaitRecord(t, s.record, 9*time.Second, func(r harness.Record) bool {
		return r.Instance == start.Instance && r.Event == harness.EventStop
	})
	for len(mainWorkloads(t, s.marker)) > 0 {
		if time.Duration(harness.MonoNow()-releasedAt) > 9*time.Second {
			t.Fatalf("workload still running 9s after its lock was released: %v", mainWorkloads(t, s.marker))
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := time.Duration(harness.MonoNow() - releasedAt)
	t.Logf("MEASURE loss_to_stop=%s loss_to_gone=%s stop_signal=%s",
		harness.Millis(time.Duration(stop.Mono-releasedAt)), harness.Millis(gone), stop.Signal)
	if stop.Signal != "SIGTERM" {
		t.Errorf("workload stopped by %q, want SIGTERM (lock's default -kill-signal)", stop.Signal)
	}

	ev := a.WaitTaskEvent(t, alloc.ID, taskName, api.TaskTerminated, 30*time.Second)
	if ev.ExitCode != 76 {
		t.Errorf("lock exited %d after losing the lock, want 76 (event: %s)", ev.ExitCode, ev.DisplayMessage)
	}
	a.WaitAllocLog(t, alloc.ID, taskName, "stderr", 10*time.Second, "lock lost", "409")
}

// testArgvAndExitCodePassThrough: `lock` passes awkward arguments and the exit
// code through unchanged; `nomad var lock` (shell mode, its default) mangles
// the arguments and turns exit code 7 into 1.
func testArgvAndExitCodePassThrough(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "exact")
	weird := []string{"with space", `"double quoted"`, "$HOME", "*", "", "ünïcode ☃ 日本", "--flag=x y", "tab\there"}
	workloadTail := append([]string{"-exit", "7", "--"}, weird...)

	lockGroup := s.lockGroup(t, 1, nil, workloadTail)
	lockGroup.name, lockGroup.failFast = "lock", true

	varRecord := filepath.Join(t.TempDir(), "varlock.jsonl")
	varArgs := []string{"var", "lock", "-ttl", lockTTL, "-delay", lockDelay, s.path + "-varlock",
		harness.BuildTestWorkload(t), "-record", varRecord, "-marker", s.marker}
	varArgs = append(varArgs, workloadTail...)
	varGroup := group{
		name: "varlock", failFast: true, command: harness.NomadBin(t), args: varArgs,
		// The nomad CLI reads NOMAD_ADDR only, never NOMAD_UNIX_ADDR.
		env: map[string]string{"NOMAD_ADDR": "unix://${NOMAD_SECRETS_DIR}/api.sock"},
	}
	a.RunJobHCL(t, jobHCL(s.job, "batch", lockGroup, varGroup))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	// lock: exact argv, exact exit code.
	got := waitMainStart(t, s.record, 60*time.Second, nil)
	if tail := argsAfterDashDash(got.Argv); !slices.Equal(tail, weird) {
		t.Errorf("lock: workload got args %q, want exactly %q", tail, weird)
	}
	if got.Fence == "" || got.LockPath != s.path {
		t.Errorf("lock: workload env NOMAD_LOCK_FENCE=%q NOMAD_LOCK_PATH=%q", got.Fence, got.LockPath)
	}
	// nomad var lock: mangled by the shell.
	vgot := waitMainStart(t, varRecord, 60*time.Second, nil)
	vtail := argsAfterDashDash(vgot.Argv)
	t.Logf("nomad var lock delivered %q", vtail)
	if slices.Equal(vtail, weird) {
		t.Errorf("nomad var lock delivered the args unchanged; expected its shell mode to mangle them")
	}

	codes := map[string]int{}
	for _, al := range a.WaitAllocs(t, s.job, 2, api.AllocClientStatusFailed, 60*time.Second) {
		ev := a.WaitTaskEvent(t, al.ID, taskName, api.TaskTerminated, 30*time.Second)
		codes[al.TaskGroup] = ev.ExitCode
	}
	t.Logf("child exit 7: lock exited %d, nomad var lock exited %d", codes["lock"], codes["varlock"])
	if codes["lock"] != 7 {
		t.Errorf("lock exited %d for a child that exited 7, want 7", codes["lock"])
	}
	if codes["varlock"] != 1 {
		t.Errorf("nomad var lock exited %d for a child that exited 7, want 1 (its documented behaviour)", codes["varlock"])
	}
	exit := harness.WaitRecord(t, s.record, 10*time.Second, func(r harness.Record) bool { return r.Event == harness.EventExit })
	if exit.Code == nil || *exit.Code != 7 {
		t.Errorf("workload exit record %+v, want code 7", exit)
	}
}

// testExecDriverEntrypointHoldsLock: `lock` as the entrypoint of an exec-driver
// task (chroot), mounted from a host volume with the workload, holds the lock
// through /secrets/api.sock.
func testExecDriverEntrypointHoldsLock(t *testing.T, a *harness.Agent, records string) {
	if !a.DriverHealthy("exec") {
		t.Fatal("the exec driver is not healthy on this agent")
	}
	s := newScenario(t, "exec")
	record := "/records/" + s.job + ".jsonl"
	args := lockArgs("nomad/jobs/${NOMAD_JOB_ID}/lock")
	args = append(args, "/opt/testworkload/testworkload", "-record", record, "-marker", s.marker)
	a.RunJobHCL(t, jobHCL(s.job, "service", group{
		failFast: true, driver: "exec", command: "/opt/lock/lock", args: args,
		volumes: []volume{
			{name: "lockbin", dest: "/opt/lock"},
			{name: "testworkload", dest: "/opt/testworkload"},
			{name: "lockrecords", dest: "/records", writable: true},
		},
	}))
	t.Cleanup(func() { _ = a.Purge(s.job) })

	hostRecord := filepath.Join(records, s.job+".jsonl")
	alloc := a.WaitAllocs(t, s.job, 1, api.AllocClientStatusRunning, 60*time.Second)[0]
	start := waitMainStart(t, hostRecord, 60*time.Second, nil)
	if start.AllocID != alloc.ID || start.Fence == "" || start.LockPath != s.path {
		t.Errorf("workload record alloc=%q fence=%q path=%q, want alloc %s, a fence, path %s",
			start.AllocID, start.Fence, start.LockPath, alloc.ID, s.path)
	}
	v := readLock(t, a, s.path)
	if v.Lock == nil || v.Items["holder_alloc_id"] != alloc.ID {
		t.Errorf("variable %s: lock %+v, holder_alloc_id %q, want held by %s", s.path, v.Lock, v.Items["holder_alloc_id"], alloc.ID)
	}
	if strconv.FormatUint(v.ModifyIndex, 10) != start.Fence {
		t.Errorf("fence %s, want the variable's ModifyIndex %d", start.Fence, v.ModifyIndex)
	}
	ws := mainWorkloads(t, s.marker)
	if len(ws) != 1 {
		t.Fatalf("want one workload, found %v", ws)
	}
	lock, _ := lockOf(t, s.marker, ws[0].PID)
	t.Logf("in the chroot: lock %v (exe %s), workload recorded pid %d", lock, lock.Exe, start.PID)

	// Stopping the job stops the workload and releases the lock.
	if err := a.Purge(s.job); err != nil {
		t.Fatal(err)
	}
	harness.WaitRecord(t, hostRecord, 20*time.Second, func(r harness.Record) bool {
		return r.Instance == start.Instance && r.Event == harness.EventStop
	})
	waitReleased(t, a, s.path, 10*time.Second)
}

// testPlainSignals: signals sent to `lock` (run outside Nomad) reach the
// workload; SIGTERM/SIGINT stop it and lock exits with its code, then releases.
func testPlainSignals(t *testing.T, a *harness.Agent) {
	tests := []struct {
		name     string
		flags    []string // extra lock flags
		wflags   []string // extra workload flags
		sig      syscall.Signal
		want     harness.Record // Event and Signal of the record it causes
		wantCode int            // lock's exit code; -1: lock keeps running
	}{
		{name: "SIGUSR1 is forwarded", sig: syscall.SIGUSR1,
			want: harness.Record{Event: harness.EventSignal, Signal: "SIGUSR1"}, wantCode: -1},
		{name: "SIGHUP is forwarded", sig: syscall.SIGHUP,
			want: harness.Record{Event: harness.EventSignal, Signal: "SIGHUP"}, wantCode: -1},
		{name: "SIGWINCH is forwarded", sig: syscall.SIGWINCH,
			want: harness.Record{Event: harness.EventSignal, Signal: "SIGWINCH"}, wantCode: -1},
		{name: "SIGTERM stops the workload with SIGTERM", sig: syscall.SIGTERM,
			want: harness.Record{Event: harness.EventStop, Signal: "SIGTERM"}, wantCode: 0},
		{name: "SIGINT stops the workload with SIGINT", sig: syscall.SIGINT,
			want: harness.Record{Event: harness.EventStop, Signal: "SIGINT"}, wantCode: 0},
		{name: "a workload ignoring SIGTERM is SIGKILLed after -kill-timeout", sig: syscall.SIGTERM,
			flags: []string{"-kill-timeout", "1s"}, wflags: []string{"-ignore-term"},
			want: harness.Record{Event: harness.EventSignal, Signal: "SIGTERM"}, wantCode: 128 + 9},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScenario(t, "plain-sig"+strconv.Itoa(i))
			p := startPlainLock(t, a, lockArgs(s.path, tc.flags...), s.workloadArgv(t, tc.wflags...)...)
			start := waitMainStart(t, s.record, 30*time.Second, nil)
			if err := p.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			harness.WaitRecord(t, s.record, 10*time.Second, func(r harness.Record) bool {
				return r.Instance == start.Instance && r.Event == tc.want.Event && r.Signal == tc.want.Signal
			})
			if tc.wantCode < 0 {
				time.Sleep(200 * time.Millisecond)
				if p.Exited() || len(mainWorkloads(t, s.marker)) != 1 {
					t.Fatalf("lock or its workload did not survive %v; stderr:\n%s", tc.sig, p.Stderr())
				}
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				tc.wantCode = 0
			}
			if code := p.Wait(20 * time.Second); code != tc.wantCode {
				t.Errorf("lock exited %d, want %d; stderr:\n%s", code, tc.wantCode, p.Stderr())
			}
			if ws := mainWorkloads(t, s.marker); len(ws) > 0 {
				t.Errorf("workload outlived lock: %v", ws)
			}
			if v := readLock(t, a, s.path); v.Lock != nil {
				t.Errorf("lock not released after lock exited: %+v", v.Lock)
			}
		})
	}
}

// testPlainWait: -wait gives up with 75 while another holder keeps the lock;
// -early-return exits 0 at once. Neither runs its command.
func testPlainWait(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "plain-wait")
	holder := startPlainLock(t, a, lockArgs(s.path), s.workloadArgv(t)...)
	waitMainStart(t, s.record, 30*time.Second, nil)

	other := filepath.Join(t.TempDir(), "other.jsonl")
	argv := []string{harness.BuildTestWorkload(t), "-record", other, "-marker", s.marker}

	w := startPlainLock(t, a, lockArgs(s.path, "-wait", "2s"), argv...)
	code := w.Wait(30 * time.Second)
	t.Logf("MEASURE wait_2s_exit=%s", harness.Millis(w.Runtime()))
	if code != 75 {
		t.Errorf("-wait 2s exited %d, want 75; stderr:\n%s", code, w.Stderr())
	}
	// Loose on top (10× the wait): a busy machine starts lock late.
	if w.Runtime() < 1500*time.Millisecond || w.Runtime() > 20*time.Second {
		t.Errorf("-wait 2s exited after %s, want about 2s", w.Runtime())
	}

	e := startPlainLock(t, a, lockArgs(s.path, "-early-return"), argv...)
	code = e.Wait(30 * time.Second)
	t.Logf("MEASURE early_return_exit=%s", harness.Millis(e.Runtime()))
	if code != 0 {
		t.Errorf("-early-return exited %d, want 0; stderr:\n%s", code, e.Stderr())
	}
	if e.Runtime() > 5*time.Second {
		t.Errorf("-early-return took %s, want an immediate exit", e.Runtime())
	}
	if recs := readRecords(t, other); len(recs) > 0 {
		t.Errorf("a contender ran its command without the lock: %v", recs)
	}
	if !strings.Contains(e.Stderr(), "early-return") {
		t.Errorf("-early-return does not say why it exited:\n%s", e.Stderr())
	}

	if err := holder.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := holder.Wait(20 * time.Second); code != 0 {
		t.Errorf("holder exited %d, want 0", code)
	}
}

// testPlainBadFlags: configuration errors exit 64 naming the culprit, before
// any process is started or any request is sent.
func testPlainBadFlags(t *testing.T, a *harness.Agent) {
	tests := []struct {
		name  string
		flags []string // before the path
		path  string
		noCmd bool
		// file is the content of a -config file (named lock.hcl).
		file string
		// badToken points NOMAD_SECRETS_DIR at a dir whose nomad_token is unreadable.
		badToken bool
		want     string
	}{
		{name: "unknown flag", flags: []string{"-bogus"}, want: "-bogus"},
		{name: "bad duration", flags: []string{"-ttl", "soon"}, want: "-ttl"},
		{name: "TTL below Nomad's minimum", flags: []string{"-ttl", "5s"}, want: "TTL 5s is out of range"},
		{name: "zero delay", flags: []string{"-delay", "0s"}, want: "lock delay 0s must be greater than 0"},
		{name: "renew below its minimum", flags: []string{"-renew", "1ns"}, want: "-renew = 1ns is below its minimum of 1s"},
		{name: "unknown kill signal", flags: []string{"-kill-signal", "SIGFOO"}, want: "-kill-signal"},
		{name: "token in argv", flags: []string{"-token", "s3cr3t-t0ken"}, want: "-token is refused"},
		{name: "bad path", path: "nomad/web/lock", want: "below nomad/jobs/"},
		{name: "missing command", noCmd: true, want: "missing command"},
		// The -config HCL file.
		{name: "file: unknown key", file: "lock {\n  tll = \"10s\"\n}\n", want: "lock.hcl:2,3-6: Unsupported argument"},
		{name: "file: bad duration", file: `lock { delay = "soon" }`, want: `lock.delay = "soon" is not a duration`},
		{name: "file: TTL out of range", file: `lock { ttl = "25h" }`, want: "lock TTL 25h0m0s is out of range"},
		{name: "file: missing", flags: []string{"-config", "/nonexistent/lock.hcl"}, want: "read -config file"},
		// The workload-identity token file ($NOMAD_SECRETS_DIR/nomad_token)
		// exists but cannot be read (a directory: root reads any file).
		{name: "unreadable token file", badToken: true, want: "read workload identity token"},
		// The load balancer flags.
		{name: "lb: bad uri", flags: lbFlagsWith("-lb-uri", "ftp://127.0.0.1:1/baragon/v2/request"), want: "scheme must be http or https"},
		{name: "lb: missing service", flags: lbFlagsWith("-lb-service-id", ""), want: "service_id is required"},
		{name: "lb: unreadable authkey file", flags: lbFlagsWith("-lb-authkey-file", "/nonexistent/authkey"), want: "authkey_file: open"},
		{name: "lb: bad CA file", flags: lbFlagsWith("-lb-ca-file", "/etc/hostname"), want: "holds no PEM certificate"},
		{name: "lb: poll below its minimum", flags: lbFlagsWith("-lb-poll-interval", "1ns"), want: "poll_interval = 1ns is below its minimum of 100ms"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScenario(t, "plain-flag"+strconv.Itoa(i))
			path := s.path
			if tc.path != "" {
				path = tc.path
			}
			args := append([]string{"-ttl", lockTTL, "-delay", lockDelay}, tc.flags...)
			if tc.file != "" {
				// The file's lock block is overridden by -ttl and -delay, so
				// those come from the file alone here.
				f := filepath.Join(t.TempDir(), "lock.hcl")
				if err := os.WriteFile(f, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"-config", f}, tc.flags...)
			}
			args = append(args, path)
			if !tc.noCmd {
				args = append(args, s.workloadArgv(t)...)
			}
			// The -lb-port label resolves through NOMAD_HOST_ADDR_<label>.
			env := append(harness.WithoutNomadEnv(os.Environ()), a.Env()...)
			env = append(env, "NOMAD_HOST_ADDR_http=127.0.0.1:8080")
			if tc.badToken {
				secrets := t.TempDir()
				if err := os.Mkdir(filepath.Join(secrets, "nomad_token"), 0o700); err != nil {
					t.Fatal(err)
				}
				env = append(env, "NOMAD_SECRETS_DIR="+secrets)
			}
			cmd := exec.Command(harness.LockBin(t), args...)
			cmd.Env = env
			p := harness.StartProcess(t, cmd)
			code, stdout, stderr := p.Wait(30*time.Second), p.Stdout(), p.Stderr()
			if code != 64 {
				t.Errorf("exit %d, want 64; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not name %q:\n%s", tc.want, stderr)
			}
			if strings.Contains(stdout+stderr, "s3cr3t-t0ken") {
				t.Errorf("the refused token is echoed back:\n%s", stdout+stderr)
			}
			if _, err := os.Stat(s.record); !os.IsNotExist(err) {
				t.Errorf("the workload was started (record file exists: %v)", err)
			}
			if v, _, err := a.API().Variables().Peek(path, nil); err != nil || v != nil {
				t.Errorf("the lock variable %s: %+v, %v; want it never created", path, v, err)
			}
		})
	}
}

// lbFlagsWith is a valid set of -lb-* flags with one of them replaced.
func lbFlagsWith(flag, value string) []string {
	flags := map[string]string{
		"-lb-uri": "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id": "svc",
		"-lb-base-path": "/svc", "-lb-groups": "g", "-lb-port": "http",
	}
	flags[flag] = value
	var out []string
	for _, k := range slices.Sorted(maps.Keys(flags)) {
		out = append(out, k, flags[k])
	}
	return out
}

// testPlainStatus: `lock status` shows Held = true and the holder while held,
// false (and the last holder) after.
func testPlainStatus(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "plain-status")
	code, out, stderr := runLock(t, a, "status", s.path)
	if code != 0 || !regexp.MustCompile(`(?m)^Held\s+= false \(the variable does not exist\)$`).MatchString(out) {
		t.Errorf("status of a missing lock: exit %d\n%s%s", code, out, stderr)
	}

	holder := startPlainLock(t, a, lockArgs(s.path), s.workloadArgv(t)...)
	start := waitMainStart(t, s.record, 30*time.Second, nil)
	host, _ := os.Hostname()

	code, out, stderr = runLock(t, a, "status", s.path)
	t.Logf("lock status while held:\n%s", out)
	for _, re := range []string{
		`(?m)^Held\s+= true$`,
		`(?m)^Holder\s+= pid ` + strconv.Itoa(holder.PID()) + ` on \S+$`,
		`(?m)^Host/PID\s+= ` + regexp.QuoteMeta(host) + `/` + strconv.Itoa(holder.PID()) + `$`,
		`(?m)^Fence\s+= ` + start.Fence + `$`,
		`(?m)^TTL\s+= 10s$`,
	} {
		if code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status while held (exit %d) does not match %s:\n%s%s", code, re, out, stderr)
		}
	}
	code, out, _ = runLock(t, a, "status", "-json", s.path)
	var st struct {
		Schema int
		Locks  []struct {
			State  string
			Fence  uint64
			Holder struct{ PID int }
		}
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 || st.Schema != 1 || len(st.Locks) != 1 {
		t.Fatalf("status -json: exit %d, %v:\n%s", code, err, out)
	}
	if l := st.Locks[0]; l.State != "held" || l.Holder.PID != holder.PID() || strconv.FormatUint(l.Fence, 10) != start.Fence {
		t.Errorf("status -json while held: %+v (holder pid %d, fence %s)", l, holder.PID(), start.Fence)
	}

	if err := holder.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	holder.Wait(20 * time.Second)
	code, out, stderr = runLock(t, a, "status", s.path)
	t.Logf("lock status after release:\n%s", out)
	for _, re := range []string{`(?m)^Held\s+= false$`, `(?m)^Last holder\s+= pid ` + strconv.Itoa(holder.PID()) + ` `} {
		if code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status after release (exit %d) does not match %s:\n%s%s", code, re, out, stderr)
		}
	}
}

// testPlainCrash: outside Nomad (no task cgroup to clean up after it), a
// SIGKILLed `lock` still takes its workload and the workload's children
// down: its process-group guard does.
func testPlainCrash(t *testing.T, a *harness.Agent) {
	s := newScenario(t, "plain-crash")
	p := startPlainLock(t, a, lockArgs(s.path), s.workloadArgv(t, "-children", "2")...)
	waitMainStart(t, s.record, 30*time.Second, nil)
	deadline := time.Now().Add(10 * time.Second)
	var procs []harness.Proc
	for {
		all, err := harness.FindProcs(s.marker)
		if err != nil {
			t.Fatal(err)
		}
		procs = slices.DeleteFunc(all, func(p harness.Proc) bool { return !p.IsTestWorkload() })
		if len(procs) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(procs) != 3 {
		t.Fatalf("want the workload and 2 children, found %v", procs)
	}
	guard := procs[0].PGID // the group leader is lock's guard
	if guard == procs[0].PID || guard == p.PID() {
		t.Errorf("the workload's process group %d is not led by a separate guard (lock pid %d)", guard, p.PID())
	}

	killAt := time.Now()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.Wait(10 * time.Second)
	for {
		left, err := harness.FindProcs(s.marker)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 && !alive(guard) {
			break
		}
		if time.Since(killAt) > 2*time.Second {
			t.Fatalf("still alive 2s after SIGKILL to lock: %v (guard %d alive: %t)", left, guard, alive(guard))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("MEASURE plain_crash_group_gone=%s", harness.Millis(time.Since(killAt)))
}

// TestLockACL: with ACLs on, a job whose workload identity has
// the example policy acquires; a job without it exits 77 printing the policy
// and the command to apply it. The token is never in argv or the logs.
func TestLockACL(t *testing.T) {
	t.Parallel()
	harness.Smoke(t)
	began := time.Now()
	a := harness.StartAgent(t, harness.AgentOptions{ACLs: true})
	t.Logf("MEASURE acl_agent_ready=%s", harness.Millis(time.Since(began)))

	ok := newScenario(t, "acl-ok")
	denied := newScenario(t, "acl-denied")

	applyLockPolicy(t, a, ok.job, ok.path)

	gOK := ok.lockGroup(t, 1, nil, nil)
	gOK.failFast = true
	a.RunJobHCL(t, jobHCL(ok.job, "service", gOK))
	gDenied := denied.lockGroup(t, 1, nil, nil)
	gDenied.failFast, gDenied.identityFile = true, true
	a.RunJobHCL(t, jobHCL(denied.job, "service", gDenied))

	// With the policy: acquires and runs.
	okAlloc := a.WaitAllocs(t, ok.job, 1, api.AllocClientStatusRunning, 60*time.Second)[0]
	start := waitMainStart(t, ok.record, 60*time.Second, nil)
	if start.AllocID != okAlloc.ID || start.Fence == "" {
		t.Errorf("workload record alloc %q fence %q, want alloc %s and a fence", start.AllocID, start.Fence, okAlloc.ID)
	}
	lock, _ := lockOf(t, ok.marker, start.PID)
	env, err := harness.ReadEnviron(lock.PID)
	if err != nil {
		t.Fatal(err)
	}
	token := harness.Getenv(env, "NOMAD_TOKEN")
	if token == "" {
		t.Fatalf("lock %d has no NOMAD_TOKEN in its environment", lock.PID)
	}
	argv, err := harness.ReadCmdline(lock.PID)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(argv, "\x00"), token) || slices.Contains(argv, "-token") {
		t.Errorf("the token is in lock's argv (world-readable): %q", argv)
	}
	v := readLock(t, a, ok.path) // management token: Lock is visible
	if v.Lock == nil || v.Items["holder_alloc_id"] != okAlloc.ID {
		t.Errorf("variable %s: lock %+v holder %q, want held by %s", ok.path, v.Lock, v.Items["holder_alloc_id"], okAlloc.ID)
	}

	// Without it: 77, with the policy and the command that fixes it.
	deniedAlloc := a.WaitAllocs(t, denied.job, 1, api.AllocClientStatusFailed, 60*time.Second)[0]
	ev := a.WaitTaskEvent(t, deniedAlloc.ID, taskName, api.TaskTerminated, 30*time.Second)
	if ev.ExitCode != 77 {
		t.Errorf("lock without the policy exited %d, want 77 (%s)", ev.ExitCode, ev.DisplayMessage)
	}
	stderr := a.WaitAllocLog(t, deniedAlloc.ID, taskName, "stderr", 10*time.Second,
		"permission denied (HTTP 403)",
		`capabilities = ["write", "read"]`,
		`path "`+denied.path+`"`,
		"nomad acl policy apply -namespace default -job "+denied.job+" ")
	t.Logf("denied job's stderr:\n%s", stderr)
	if recs := readRecords(t, denied.record); len(recs) > 0 {
		t.Errorf("the workload ran without the lock: %v", recs)
	}
	deniedToken := readSecretToken(t, a, deniedAlloc.ID)

	// No token in any log. Workload identities are JWTs: check for any, too.
	for _, al := range []string{okAlloc.ID, deniedAlloc.ID} {
		for _, stream := range []string{"stdout", "stderr"} {
			out := a.AllocLogs(t, al, taskName, stream)
			if strings.Contains(out, token) || strings.Contains(out, deniedToken) || jwtPattern.MatchString(out) {
				t.Errorf("a token appears in the %s of alloc %s:\n%s", stream, al, out)
			}
		}
	}
}

// readSecretToken reads the workload identity that `identity { file = true }`
// wrote into the task's secrets dir (as root, from the host). It stays there
// until the allocation is garbage-collected.
func readSecretToken(t *testing.T, a *harness.Agent, allocID string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(a.AllocDir(), allocID, taskName, "secrets", "nomad_token"))
	tok := strings.TrimSpace(string(b))
	if err != nil || tok == "" {
		t.Fatalf("read the denied task's token from its secrets dir: %q, %v", tok, err)
	}
	return tok
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
