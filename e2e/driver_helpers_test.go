package e2e

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
)

// Helpers of driver_test.go. Every identifier here starts with drv (or d)
// so that it never collides with the lock tests' helpers in this package.

// The lease timing of every driver job: the agent's plugin defaults and the
// jobs' lock blocks agree, so either source gives the same behaviour.
const (
	drvTTL      = 10 * time.Second
	drvDelay    = 1 * time.Second
	drvTTLHCL   = "10s"
	drvDelayHCL = "1s"
	drvTask     = "t"
	drvGroup    = "g"
	// drvKillTimeout is the task's kill_timeout.
	drvKillTimeout = "5s"
)

// drvAgentOptions loads bin/plugins/nomad-driver-singleton with default_ttl
// 10s and default_delay 1s, enables task stats, and waits until the driver
// is healthy.
func drvAgentOptions(t *testing.T, dev bool) harness.AgentOptions {
	opts := harness.SingletonAgentOptions(t, drvTTLHCL, drvDelayHCL)
	opts.Dev = dev
	// Nomad 1.11 collects task stats (`nomad alloc status -stats`, the
	// stats API) only with publish_allocation_metrics, which -dev sets.
	opts.Config = append(opts.Config, "telemetry {\n  publish_allocation_metrics = true\n}")
	return opts
}

// drvJob describes one test job: one group drvGroup with one task drvTask
// running the testworkload under the singleton driver (or raw_exec, to
// compare). Render it with hcl.
type drvJob struct {
	id     string
	count  int
	marker string // in the workload's argv: FindProcs and Sampler select by it
	record string // the testworkload record file
	// args are extra workload arguments after -record and -marker.
	args []string
	// driver is "singleton" (default) or "raw_exec".
	driver string
	// lockBlock replaces the lock {} block's body; "" gives ttl 10s, delay 1s.
	lockBlock string
	// configExtra is added to the config {} block verbatim.
	configExtra string
	// noCommand leaves command out of the config block.
	noCommand bool
	// noIdentity leaves out identity { env = true }.
	noIdentity bool
	// failFast: no task restart and no reschedule.
	failFast bool
	// update is the body of an update {} block ("" for none).
	update string
	// groupExtra is group-level HCL added verbatim, e.g. a disconnect {} block.
	groupExtra string
	meta       map[string]string
	// user is the task's user ("" for the agent's).
	user string
	// killTimeout ("" for drvKillTimeout) and killSignal ("" for Nomad's
	// default) are the task's.
	killTimeout, killSignal string
	// memoryMax, if not 0, is the task's memory_max (-1: no limit).
	memoryMax int
	// env is the task's env block (nil for none).
	env map[string]string
	// start is config.start ("" for none).
	start string
	// service, if set, names a task-level Nomad service on a group port
	// "http".
	service string
}

func newDrvJob(t *testing.T, name string, count int) *drvJob {
	id := "drv-" + name
	return &drvJob{
		id:     id,
		count:  count,
		marker: fmt.Sprintf("%s-%d", id, time.Now().UnixNano()),
		record: filepath.Join(t.TempDir(), "records.jsonl"),
		driver: harness.PluginDriverName,
	}
}

// lockPath is the driver's default lock path for the job's task.
func (j *drvJob) lockPath() string {
	return fmt.Sprintf("nomad/jobs/%s/%s/%s/lock", j.id, drvGroup, drvTask)
}

// hcl renders the job with harness/jobs/driver.nomad.hcl.tmpl.
func (j *drvJob) hcl(t *testing.T) string {
	command, lock := "", ""
	if !j.noCommand {
		command = harness.BuildTestWorkload(t)
	}
	if j.driver == harness.PluginDriverName {
		lock = j.lockBlock
		if lock == "" {
			lock = fmt.Sprintf("ttl = %q\n          delay = %q", drvTTLHCL, drvDelayHCL)
		}
	}
	return harness.Jobspec("driver", struct {
		ID, Update, Group, GroupExtra, Task, Driver, User   string
		Command, Lock, ConfigExtra, KillTimeout, KillSignal string
		Start, Service                                      string
		Count, MemoryMax                                    int
		FailFast, Identity                                  bool
		Meta, Env                                           map[string]string
		Args                                                []string
	}{
		ID: j.id, Update: j.update, Group: drvGroup, GroupExtra: j.groupExtra, Task: drvTask, Driver: j.driver, User: j.user,
		Command: command, Lock: lock, ConfigExtra: j.configExtra, Start: j.start, Service: j.service,
		KillTimeout: cmp.Or(j.killTimeout, drvKillTimeout), KillSignal: j.killSignal,
		Count: j.count, MemoryMax: j.memoryMax, FailFast: j.failFast, Identity: !j.noIdentity, Meta: j.meta, Env: j.env,
		Args: append([]string{"-record", j.record, "-marker", j.marker}, j.args...),
	})
}

// run registers the job and registers a cleanup that purges it.
func (j *drvJob) run(t *testing.T, a *harness.Agent) {
	t.Helper()
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
}

// records reads the job's record file.
func (j *drvJob) records(t *testing.T) []harness.Record {
	t.Helper()
	recs, err := harness.ReadRecords(j.record)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// waitStart waits for a main-role start record satisfying match (nil: any).
func (j *drvJob) waitStart(t *testing.T, timeout time.Duration, match func(harness.Record) bool) harness.Record {
	t.Helper()
	return harness.WaitRecord(t, j.record, timeout, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && (match == nil || match(r))
	})
}

// waitEnd waits for the stop or exit record of the workload instance.
func (j *drvJob) waitEnd(t *testing.T, instance string, timeout time.Duration) harness.Record {
	t.Helper()
	return harness.WaitRecord(t, j.record, timeout, func(r harness.Record) bool {
		return r.Instance == instance && (r.Event == harness.EventStop || r.Event == harness.EventExit)
	})
}

// starts returns the main-role start records, oldest first.
func drvStarts(recs []harness.Record) []harness.Record {
	var out []harness.Record
	for _, r := range recs {
		if r.Event == harness.EventStart && r.Role == harness.RoleMain {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b harness.Record) int { return int(a.Mono - b.Mono) })
	return out
}

// sampler starts sampling the job's main workloads.
func (j *drvJob) sampler(t *testing.T) *harness.Sampler {
	return harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
}

// drvFence parses a record's NOMAD_LOCK_FENCE.
func drvFence(t *testing.T, r harness.Record) uint64 {
	t.Helper()
	f, err := strconv.ParseUint(r.Fence, 10, 64)
	if err != nil || f == 0 {
		t.Fatalf("record of pid %d has no valid NOMAD_LOCK_FENCE (%q): %v", r.PID, r.Fence, err)
	}
	return f
}

// drvEventText is everything a user can read in a task event.
func drvEventText(ev *api.TaskEvent) string {
	parts := []string{ev.Type + ":", ev.DisplayMessage}
	for _, s := range []string{ev.Message, ev.DriverError, ev.ValidationError, ev.SetupError, ev.DriverMessage, ev.KillError} {
		if s != "" && !strings.Contains(ev.DisplayMessage, s) {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, " ")
}

// drvEvents returns the task's events (none if the task has no state yet).
func drvEvents(t *testing.T, a *harness.Agent, allocID string) []*api.TaskEvent {
	t.Helper()
	evs, err := a.TaskEvents(allocID, drvTask)
	if err != nil && !strings.Contains(err.Error(), "has no task") {
		t.Fatalf("task events of %s: %v", drvShort(allocID), err)
	}
	return evs
}

// drvMatching returns the events whose text contains every one of subs.
func drvMatching(evs []*api.TaskEvent, subs ...string) []*api.TaskEvent {
	var out []*api.TaskEvent
	for _, ev := range evs {
		text := drvEventText(ev)
		ok := true
		for _, s := range subs {
			if !strings.Contains(text, s) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out
}

// drvWaitEvent waits until the task has an event whose text contains every
// one of subs, and returns the first such event.
func drvWaitEvent(t *testing.T, a *harness.Agent, allocID string, timeout time.Duration, subs ...string) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs := drvEvents(t, a, allocID)
		if m := drvMatching(evs, subs...); len(m) > 0 {
			return m[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no task event containing %q within %s; events:\n%s", drvShort(allocID), subs, timeout, drvFormatEvents(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func drvFormatEvents(evs []*api.TaskEvent) string {
	if len(evs) == 0 {
		return "  (none)"
	}
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %s %s\n", time.Unix(0, ev.Time).Format("15:04:05.000"), drvEventText(ev))
	}
	return b.String()
}

// drvLock reads the lock variable (ACLs are off: its Lock field is visible).
func drvLock(t *testing.T, a *harness.Agent, path string) *api.Variable {
	t.Helper()
	v, _, err := a.API().Variables().Read(path, nil)
	if err != nil {
		t.Fatalf("read lock variable %s: %v", path, err)
	}
	return v
}

// drvCheckLockHeld asserts that the variable's lock is held by allocID with
// the given fence (its ModifyIndex, which renewals leave alone) and returns
// the lock ID.
func drvCheckLockHeld(t *testing.T, a *harness.Agent, path, allocID string, fence uint64) string {
	t.Helper()
	v := drvLock(t, a, path)
	if v.Lock == nil || v.Lock.ID == "" {
		t.Errorf("lock %s is not held: %+v", path, v)
		return ""
	}
	if got := v.Items["holder_alloc_id"]; got != allocID {
		t.Errorf("lock %s names holder alloc %q, want %s", path, got, allocID)
	}
	if v.ModifyIndex != fence {
		t.Errorf("lock %s has ModifyIndex %d, want the holder's fence %d (a new acquire happened?)", path, v.ModifyIndex, fence)
	}
	return v.Lock.ID
}

// drvRunning returns the IDs of the job's running allocations.
func drvRunning(t *testing.T, a *harness.Agent, jobID string) []string {
	t.Helper()
	allocs, err := a.Allocs(jobID)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, al := range allocs {
		if al.ClientStatus == api.AllocClientStatusRunning {
			ids = append(ids, al.ID)
		}
	}
	return ids
}

// drvSamplesWithin returns the samples taken in [from, to] (CLOCK_MONOTONIC ns).
func drvSamplesWithin(sum harness.SampleSummary, from, to int64) []harness.Sample {
	var out []harness.Sample
	for _, s := range sum.Samples {
		if s.Mono >= from && s.Mono <= to {
			out = append(out, s)
		}
	}
	return out
}

// drvCheckOnlyPID asserts that every sample (there must be some) saw
// exactly one workload process, pid, of allocation allocID, and returns
// the span they cover.
func drvCheckOnlyPID(t *testing.T, samples []harness.Sample, pid int, allocID string) time.Duration {
	t.Helper()
	return drvCheckOnlyPIDs(t, samples, allocID, pid)
}

// drvCheckOnlyPIDs asserts that every sample (there must be some) saw
// exactly the processes pids, all of allocation allocID, and returns the
// span they cover.
func drvCheckOnlyPIDs(t *testing.T, samples []harness.Sample, allocID string, pids ...int) time.Duration {
	t.Helper()
	if len(samples) == 0 {
		t.Errorf("no samples")
		return 0
	}
	want := slices.Sorted(slices.Values(pids))
	bad := 0
	for _, s := range samples {
		if s.Err != nil || !slices.Equal(s.PIDs, want) || len(s.Allocs) != 1 || s.Allocs[0] != allocID {
			if bad < 5 {
				t.Errorf("sample at %s: pids %v allocs %v err %v; want only pids %v of alloc %s",
					s.Wall.Format("15:04:05.000"), s.PIDs, s.Allocs, s.Err, want, drvShort(allocID))
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d samples did not show exactly the workload's processes", bad, len(samples))
	}
	return time.Duration(samples[len(samples)-1].Mono - samples[0].Mono)
}

// drvSupervisor returns the single supervisor process of the alloc's task.
func drvSupervisor(t *testing.T, allocID string) harness.Proc {
	t.Helper()
	var procs []harness.Proc
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		procs, err = harness.SupervisorProcs(allocID)
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == 1 {
			return procs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: want one supervisor process, found %v", drvShort(allocID), procs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// drvPlugin waits until the agent process agentPID has exactly one driver
// plugin process other than not (0: any) and returns it.
func drvPlugin(t *testing.T, agentPID, not int, timeout time.Duration) harness.Proc {
	t.Helper()
	return drvPluginRunning(t, agentPID, harness.PluginBin(t), not, timeout)
}

// drvPluginRunning is drvPlugin for the plugin binary bin.
func drvPluginRunning(t *testing.T, agentPID int, bin string, not int, timeout time.Duration) harness.Proc {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		procs, err := harness.PluginProcs(agentPID, bin)
		if err != nil {
			t.Fatal(err)
		}
		procs = slices.DeleteFunc(procs, func(p harness.Proc) bool { return p.PID == not })
		if len(procs) == 1 {
			return procs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %d: want one plugin process (other than %d) running %s, found %v", agentPID, not, bin, procs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drvAlive reports whether pid is a live process (not a zombie).
func drvAlive(pid int) bool {
	stat, err := procfs.Read(pid)
	return err == nil && !stat.Gone()
}

// drvWaitGone polls until pid is gone (or a zombie) and returns when it saw
// that (CLOCK_MONOTONIC ns).
func drvWaitGone(t *testing.T, pid int, timeout time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for drvAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %s", pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return harness.MonoNow()
}

// drvStatus is the part of the driver's status.json (in the task's state dir
// below the plugin's state_dir) the tests read: the supervisor's fence
// deadline, refreshed at every renew.
type drvStatus struct {
	State             string
	Fence             uint64
	FenceDeadlineBoot int64
	WorkloadPID       int
}

func drvReadStatus(t *testing.T, a *harness.Agent, allocID string) drvStatus {
	t.Helper()
	return drvReadStatusIn(t, drvStateDir(t, allocID))
}

func drvReadStatusIn(t *testing.T, stateDir string) drvStatus {
	t.Helper()
	path := filepath.Join(stateDir, "status.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read supervisor status: %v", err)
	}
	var st drvStatus
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return st
}

// drvStateDir is the task's state dir: the supervisor's argv[2].
func drvStateDir(t *testing.T, allocID string) string {
	t.Helper()
	return drvSupervisor(t, allocID).Argv[2]
}

// drvWaitRenew waits until the holder's supervisor has renewed the lock
// (its fence deadline moved), so a fault injected right after has the whole
// TTL - margin budget. It returns the new fence deadline.
func drvWaitRenew(t *testing.T, a *harness.Agent, allocID string, ttl time.Duration) int64 {
	t.Helper()
	dir := drvStateDir(t, allocID)
	first := drvReadStatusIn(t, dir).FenceDeadlineBoot
	deadline := time.Now().Add(ttl)
	for {
		if st := drvReadStatusIn(t, dir); st.FenceDeadlineBoot > first {
			return st.FenceDeadlineBoot
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no renewal seen within %s", drvShort(allocID), ttl)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drvExitCode is the exit code of a failed command (-1 if it did not run).
func drvExitCode(err error) int {
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// drvSIGCONTCleanup continues the stopped process pid at cleanup, if the
// same process (same start time) still exists.
func drvSIGCONTCleanup(t *testing.T, pid int) {
	ticks, err := harness.ProcStartTicks(pid)
	if err != nil {
		t.Fatalf("start time of %d: %v", pid, err)
	}
	t.Cleanup(func() {
		if now, err := harness.ProcStartTicks(pid); err == nil && now == ticks && drvAlive(pid) {
			t.Logf("supervisor %d still exists at cleanup: SIGCONT", pid)
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
}

// drvWaitMemStats polls the allocation's stats until the task reports
// memory in use, measured after after, and returns it; the test fails
// after 20 s.
func drvWaitMemStats(t *testing.T, a *harness.Agent, allocID string, after time.Time) *api.MemoryStats {
	t.Helper()
	al, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := a.API().Allocations().Stats(al, nil)
		if err == nil && st.Tasks[drvTask] != nil && st.Tasks[drvTask].ResourceUsage != nil && st.Tasks[drvTask].Timestamp > after.UnixNano() {
			if m := st.Tasks[drvTask].ResourceUsage.MemoryStats; m != nil && (m.RSS > 0 || m.Usage > 0) {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("alloc %s: stats report no memory measured after %s within 20s (last error %v, stats %+v)", drvShort(allocID), after.Format("15:04:05.000"), err, st)
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// drvReadFile returns a file's content as a string.
func drvReadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

// drvFileSize is the file's size (0 if it cannot be read).
func drvFileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func drvShort(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// sigkillTogether SIGKILLs the processes back to back. Only the first must
// still exist: the others may already have died with it (a workload dies
// with its supervisor, through the process-group guard, within
// microseconds).
func sigkillTogether(t *testing.T, pids ...int) {
	t.Helper()
	for i, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && (i == 0 || !errors.Is(err, syscall.ESRCH)) {
			t.Fatalf("SIGKILL %d: %v", pid, err)
		}
	}
}
