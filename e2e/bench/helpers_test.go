package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// taskName is the task of every bench job.
const taskName = "t"

// bench holds what every scenario needs.
type bench struct {
	cfg   Config
	rep   *Report
	began time.Time

	root, workload, lockBin, nomadBin, pluginBin string

	a       *harness.Agent  // the agent of every scenario but scale (dev, with the plugin)
	docker  *harness.Docker // its Docker engine, for VariantGate (handover, crash)
	records string          // directory of record files

	seq   atomic.Int64
	outMu sync.Mutex

	spanMu sync.Mutex
	spans  []span
}

// span is when a part of the bench ran, to tell which numbers other work on
// the machine may have touched.
type span struct {
	name     string
	from, to time.Duration
}

// phase records that name runs from now until the returned func is called.
func (b *bench) phase(name string) func() {
	from := time.Since(b.began)
	return func() {
		b.spanMu.Lock()
		defer b.spanMu.Unlock()
		b.spans = append(b.spans, span{name: name, from: from, to: time.Since(b.began)})
	}
}

// runPhase runs the scenario as a subtest named after it, if it is
// enabled, and records it as a phase.
func (b *bench) runPhase(t *testing.T, scenario, title string, fn func(*testing.T)) {
	if !b.cfg.Enabled(scenario) {
		return
	}
	done := b.phase(title)
	defer done()
	t.Run(scenario, fn)
}

// during names the phases that overlap [from, to].
func (b *bench) during(from, to time.Duration) []string {
	b.spanMu.Lock()
	defer b.spanMu.Unlock()
	var out []string
	for _, s := range b.spans {
		if s.from <= to && s.to >= from && !slices.Contains(out, s.name) {
			out = append(out, s.name)
		}
	}
	return out
}

// progress prints one line to stdout at once (not through t.Log, which
// `make bench` does not show).
func (b *bench) progress(format string, args ...any) {
	b.outMu.Lock()
	defer b.outMu.Unlock()
	el := time.Since(b.began)
	fmt.Printf("[bench %02d:%02d] %s\n", int(el.Minutes()), int(el.Seconds())%60, fmt.Sprintf(format, args...))
}

// row creates a row, adds it to the report and returns it for the scenario
// to fill in run by run.
func (b *bench) row(scenario, metric, variant string, unit Unit, agg Agg, goal *Goal) *Row {
	r := &Row{Scenario: scenario, Metric: metric, Variant: variant, Unit: unit, Agg: agg, Goal: goal, Planned: b.cfg.Runs}
	b.rep.Add(r)
	return r
}

var rowMu sync.Mutex

// add appends one run's value to a row (rows of concurrent runs are shared).
func add(r *Row, v float64) {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Values = append(r.Values, v)
}

func slug(variant string) string {
	switch variant {
	case VariantAnchor, VariantAnchorProcs:
		return "varlock"
	case VariantLock, VariantLockProcs:
		return "lock"
	case VariantDriver:
		return "driver"
	case VariantDriverRuleOff:
		return "driveroff"
	case VariantGate:
		return "gate"
	case VariantGateRaw:
		return "gateraw"
	case VariantLockSlot:
		return "lockslot"
	case VariantDriverSlot:
		return "driverslot"
	case VariantRawExec:
		return "raw"
	case VariantPlainExec:
		return "plain"
	case VariantLockClient:
		return "lockclient"
	case VariantLeaseClient:
		return "leaseclient"
	case VariantDriverLease:
		return "driverlease"
	case VariantDriverLeaseAggressive:
		return "driverleaseaggr"
	case VariantDriverMetrics:
		return "drivermetrics"
	}
	return "x"
}

// job is one bench job: one group "g" of count allocations, one task
// running the testworkload under the variant's supervisor.
type job struct {
	id       string
	variant  string
	count    int
	failFast bool // no restart, no reschedule: a killed allocation stays dead
	// holders, if not 0, makes path the prefix of a semaphore of that many
	// slots (VariantLockSlot, VariantDriverSlot).
	holders int
	path    string
	marker  string // in every process's argv: FindProcs and the sampler select by it
	record  string
	// lbURI, if set, registers the workload with this LB API as service
	// lbService (base path /lbService, group lbGroup, port label "http").
	lbURI, lbService string
	// update is the lines of the group's update block ("" for none);
	// updateGrace the driver's lock.update_grace ("" for its default).
	update, updateGrace string
	// extraArgs go after the workload's own flags (a version tag: changing
	// them is a destructive update).
	extraArgs []string
	// distinctHosts places each allocation on a client of its own.
	distinctHosts bool
	// small asks for little CPU and memory, so that a dev agent places a
	// hundred allocations.
	small bool
}

// lbGroup is the LB group of the bench's LB API servers.
const lbGroup = "bench-lb"

func (b *bench) newJob(kind, variant string, count int) *job {
	id := fmt.Sprintf("%s-%s-%d", kind, slug(variant), b.seq.Add(1))
	holders := 0
	if isSlot(variant) {
		holders = SlotHolders
	}
	path := "bench/" + id + "/lock"
	if variant == VariantDriverLease || variant == VariantDriverLeaseAggressive {
		// Lease mode takes only the job's own lock paths (docs/lease.md):
		// the standby's plugin acts on it with the operator's token.
		path = "nomad/jobs/" + id + "/lock"
	}
	return &job{
		id: id, variant: variant, count: count, holders: holders,
		path:   path,
		marker: fmt.Sprintf("bench-%s-%d", id, time.Now().UnixNano()),
		record: filepath.Join(b.records, id+".jsonl"),
	}
}

func (b *bench) workloadArgs(record, marker string) []string {
	return []string{b.workload, "-record", record, "-marker", marker}
}

// varLockArgs is `nomad var lock` with the bench timing and its defaults
// otherwise (shell mode included: that is how users run it).
func varLockArgs(path string) []string {
	return []string{"var", "lock", "-ttl", TTL.String(), "-delay", LockDelay.String(), path}
}

func lockArgs(path string) []string {
	return []string{"-ttl", TTL.String(), "-delay", LockDelay.String(), path}
}

// benchJob is the data of harness/jobs/bench.nomad.hcl.tmpl.
type benchJob struct {
	ID, Task, Driver, Command string
	// RestartDelay, if set, gives the group a restart block in delay mode.
	RestartDelay      string
	Count             int
	Network, FailFast bool
	HealthCheck       bool
	DistinctHosts     bool
	// Update, if set, is the lines of the group's update block.
	Update string
	// CPU and Memory are the task's resources (0: 50 MHz, 256 MB).
	CPU, Memory int
	Args        []string
	Env         map[string]string
	Lock        *benchLock
	LB          *benchLB
}

type benchLock struct {
	Path, TTL, Delay string
	Holders          int    // a semaphore of this many slots at Path (0: a single lock)
	UpdateGrace      string // the driver's update_grace ("" for its default)
	Mode, Profile    string // the driver's mode and lease_profile ("" for their defaults)
}

type benchLB struct {
	URI, ServiceID, BasePath string
	Groups                   []string
}

// driverBlocks are the singleton driver's lock and load_balancer blocks for j.
func driverBlocks(spec *benchJob, j *job) {
	spec.Lock = &benchLock{Path: j.path, TTL: TTL.String(), Delay: LockDelay.String(), Holders: j.holders, UpdateGrace: j.updateGrace}
	if j.lbURI != "" {
		spec.LB = &benchLB{URI: j.lbURI, ServiceID: j.lbService, BasePath: "/" + j.lbService, Groups: []string{lbGroup}}
	}
}

// hcl renders the job with harness/jobs/bench.nomad.hcl.tmpl (VariantGate:
// gateHCL).
func (b *bench) hcl(j *job) string {
	if isGate(j.variant) {
		return b.gateHCL(j)
	}
	spec := benchJob{ID: j.id, Task: taskName, Count: j.count, Network: j.lbURI != "", FailFast: j.failFast, Update: j.update,
		DistinctHosts: j.distinctHosts}
	if j.small {
		spec.CPU, spec.Memory = 10, 32
	}
	wl := append(b.workloadArgs(j.record, j.marker), j.extraArgs...)
	switch j.variant {
	case VariantAnchor:
		spec.Driver, spec.Command = "raw_exec", b.nomadBin
		spec.Args = append(varLockArgs(j.path), wl...)
		// The nomad CLI reads NOMAD_ADDR only, never NOMAD_UNIX_ADDR.
		spec.Env = map[string]string{"NOMAD_ADDR": "unix://${NOMAD_SECRETS_DIR}/api.sock"}
	case VariantLock, VariantLockSlot:
		spec.Driver, spec.Command = "raw_exec", b.lockBin
		var flags []string
		if j.holders > 0 {
			flags = []string{"-n", strconv.Itoa(j.holders)}
		}
		if j.lbURI != "" {
			flags = append(flags, "-lb-uri", j.lbURI, "-lb-service-id", j.lbService, "-lb-base-path", "/"+j.lbService,
				"-lb-groups", lbGroup, "-lb-port", "http")
		}
		spec.Args = append(append(flags, lockArgs(j.path)...), wl...)
	case VariantDriver, VariantDriverSlot, VariantDriverRuleOff:
		spec.Driver, spec.Command, spec.Args = harness.PluginDriverName, wl[0], wl[1:]
		driverBlocks(&spec, j)
	case VariantDriverLease, VariantDriverLeaseAggressive:
		spec.Driver, spec.Command, spec.Args = harness.PluginDriverName, wl[0], wl[1:]
		driverBlocks(&spec, j)
		spec.Lock.Mode = "lease"
		if j.variant == VariantDriverLeaseAggressive {
			spec.Lock.Profile = "aggressive"
		}
	case VariantRawExec:
		spec.Driver, spec.Command, spec.Args = "raw_exec", wl[0], wl[1:]
	default:
		panic("bench: no job for variant " + j.variant)
	}
	// The task's kill_timeout (6s) is above lock's default -kill-timeout
	// (4s), so lock releases before Nomad would SIGKILL it.
	return harness.Jobspec("bench", spec)
}

// register submits the job and returns CLOCK_MONOTONIC just before the
// register call (after parsing, which is not part of a submit).
func (b *bench) register(t testing.TB, j *job) int64 {
	t.Helper()
	parsed, err := b.a.API().Jobs().ParseHCL(b.hcl(j), true)
	if err != nil {
		t.Fatalf("parse job %s: %v\n%s", j.id, err, b.hcl(j))
	}
	submit := harness.MonoNow()
	if _, _, err := b.a.API().Jobs().Register(parsed, nil); err != nil {
		t.Fatalf("register job %s: %v", j.id, err)
	}
	return submit
}

// waitStart waits for a main-role start record in the job's record file
// written after the monotonic moment after.
func waitStart(t testing.TB, record string, after int64, timeout time.Duration) harness.Record {
	t.Helper()
	return harness.WaitRecord(t, record, timeout, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > after
	})
}

// waitStandbys waits until n allocations of the job other than holder have
// had their task running for at least settle: their supervisors are then
// waiting for the lock (blocking query parked, for (b) and (c)). For (d), a
// standby's gate never runs (Nomad starts it once it holds): its event
// "Gate waiting for lock" is at least settle old.
func (b *bench) waitStandbys(t testing.TB, j *job, holder string, n int, settle, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		allocs, err := b.a.Allocs(j.id)
		var ready []string
		for _, al := range allocs {
			if isGate(j.variant) {
				if al.ID != holder && al.DesiredStatus == api.AllocDesiredStatusRun && gateWaitingFor(al, settle) {
					ready = append(ready, al.ID)
				}
				continue
			}
			if al.ID == holder || al.ClientStatus != api.AllocClientStatusRunning {
				continue
			}
			ts := al.TaskStates[taskName]
			if ts != nil && ts.State == "running" && !ts.StartedAt.IsZero() && time.Since(ts.StartedAt) >= settle {
				ready = append(ready, al.ID)
			}
		}
		if err == nil && len(ready) >= n {
			return ready
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d standby allocations ready after %s, want %d (err %v)", j.id, len(ready), timeout, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// supervisorPID finds the process that supervises the job's workload in
// allocID: the `nomad var lock` process, the `lock` process, or the
// driver's `__singleton-supervise` process ((d): the gate's).
func (b *bench) supervisorPID(t testing.TB, j *job, allocID string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found []harness.Proc
		var err error
		if j.variant == VariantDriver || j.variant == VariantDriverSlot || isGate(j.variant) {
			found, err = harness.SupervisorProcs(allocID)
		} else {
			var procs []harness.Proc
			procs, err = harness.FindProcs(j.marker)
			for _, p := range procs {
				if p.AllocID != allocID {
					continue
				}
				exe := strings.TrimSuffix(p.Exe, " (deleted)")
				switch {
				case (j.variant == VariantLock || j.variant == VariantLockSlot) && exe == b.lockBin,
					j.variant == VariantAnchor && exe == b.nomadBin && len(p.Argv) > 2 && p.Argv[1] == "var" && p.Argv[2] == "lock":
					found = append(found, p)
				}
			}
		}
		if err == nil && len(found) == 1 {
			return found[0].PID
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s alloc %s: want one supervisor process, found %v (err %v)", j.id, allocID, found, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// watchWorkloadExit opens a pidfd on the workload that wrote rec (its
// recorded PID is the host PID under raw_exec and the singleton driver,
// checked against /proc; (d)'s docker app is found by its allocation), to
// learn the moment it exits.
func (b *bench) watchWorkloadExit(t testing.TB, j *job, rec harness.Record) *harness.ExitWatch {
	t.Helper()
	procs, err := harness.FindProcs(j.marker)
	if err != nil {
		t.Fatal(err)
	}
	pid := rec.PID
	if j.variant == VariantGate {
		// In its container the app records its PID there (1): find its
		// host PID by its allocation.
		pid = 0
		for _, p := range procs {
			if p.IsMainWorkload() && p.AllocID == rec.AllocID {
				pid = p.PID
			}
		}
	}
	if !slices.ContainsFunc(procs, func(p harness.Proc) bool {
		return p.PID == pid && p.IsMainWorkload() && p.AllocID == rec.AllocID
	}) {
		t.Fatalf("workload pid %d (alloc %s) not found among %v", rec.PID, rec.AllocID, procs)
	}
	w, err := harness.WatchExit(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// waitExit returns when the watched workload exited, waiting up to timeout.
// The exit itself, not the workload's stop record, ends its run: a workload
// SIGKILLed by its supervisor or by Nomad writes no record.
func waitExit(t testing.TB, w *harness.ExitWatch, rec harness.Record, timeout time.Duration) int64 {
	t.Helper()
	at, ok := w.Wait(timeout)
	if !ok {
		t.Fatalf("workload pid %d (alloc %s) still running %s later", rec.PID, short(rec.AllocID), timeout)
	}
	return at
}

// stopJob purges the job and, with wait, waits until none of its processes
// is left. Anything still alive after the wait (say, a workload orphaned
// when its supervisor was killed and not reaped by Nomad) is SIGKILLed by
// PID and reported; the returned count says how many.
func (b *bench) stopJob(t testing.TB, j *job, wait time.Duration) int {
	t.Helper()
	if err := b.a.Purge(j.id); err != nil {
		t.Errorf("purge job %s: %v", j.id, err)
	}
	if wait <= 0 {
		return 0
	}
	deadline := time.Now().Add(wait)
	for {
		procs, err := harness.FindProcs(j.marker)
		if err == nil && len(procs) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			for _, p := range procs {
				if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
					t.Errorf("kill leftover %d: %v", p.PID, err)
				}
			}
			return len(procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopProcess ends a process the bench started: SIGTERM, then after grace
// SIGKILL to its process group. It returns the exit code and whether the
// SIGTERM was enough.
func stopProcess(p *harness.Process, grace time.Duration) (int, bool) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
		return p.Wait(time.Second), true
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	return p.Wait(10 * time.Second), false
}

// readKB reads a /proc/<pid>/status field such as VmHWM in MiB.
func readMiB(pid int, field string) (float64, error) {
	v, err := harness.ProcStatus(pid, field)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(v)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("/proc/%d/status %s = %q", pid, field, v)
	}
	kb, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, err
	}
	return kb / 1024, nil
}

// cpuNanos is the CPU time of a process's live threads, in ns, from
// /proc/<pid>/task/*/schedstat: nanosecond resolution where /proc/<pid>/stat
// counts 10 ms ticks. (Threads that exit take their time with them; Go
// processes keep theirs.)
func cpuNanos(pid int) (int64, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, tk := range tasks {
		b, err := os.ReadFile(dir + "/" + tk.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s/%s/schedstat: %w", dir, tk.Name(), err)
		}
		total += ns
	}
	return total, nil
}

// cpuMeter measures the CPU of a set of processes over a window, as % of
// one core. Processes that vanish are counted up to their last reading.
type cpuMeter struct {
	pids  []int
	start map[int]int64
	last  map[int]int64
	began int64
}

func startCPU(pids ...int) *cpuMeter {
	m := &cpuMeter{pids: pids, start: map[int]int64{}, last: map[int]int64{}, began: harness.MonoNow()}
	for _, pid := range pids {
		if ns, err := cpuNanos(pid); err == nil {
			m.start[pid], m.last[pid] = ns, ns
		}
	}
	return m
}

// percent reads the processes again and returns their CPU since start.
func (m *cpuMeter) percent() float64 {
	var used int64
	for _, pid := range m.pids {
		s, ok := m.start[pid]
		if !ok {
			continue
		}
		if ns, err := cpuNanos(pid); err == nil {
			m.last[pid] = ns
		}
		used += m.last[pid] - s
	}
	return float64(used) / float64(harness.MonoNow()-m.began) * 100
}

// runConcurrently runs each function as a subtest in its own goroutine and
// waits for all. (t.Parallel would be limited by -test.parallel.)
func runConcurrently(t *testing.T, names []string, fns []func(t *testing.T)) {
	var wg sync.WaitGroup
	for i := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(names[i], fns[i])
		}()
	}
	wg.Wait()
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func fmtS(ns int64) string { return Seconds.Format(secondsOf(ns)) }

// gateTask is the gate of a VariantGate job; its gated docker task is
// taskName.
const gateTask = "gate"

// gateHCL is a VariantGate job: a gate holding the lock for a docker task
// running the testworkload (which exits on SIGTERM), its records in a bind
// mount of the records directory.
func (b *bench) gateHCL(j *job) string {
	type gateJob struct {
		ID, GateTask, Driver, Path, TTL, Delay, Task, Image, Command string
		Count                                                        int
		FailFast                                                     bool
		Args, Volumes                                                []string
	}
	if j.variant == VariantGateRaw {
		return harness.Jobspec("bench-gate", gateJob{
			ID: j.id, GateTask: gateTask, Driver: harness.PluginDriverName,
			Path: j.path, TTL: TTL.String(), Delay: LockDelay.String(),
			Task: taskName, Command: b.workload,
			Count: j.count, FailFast: j.failFast,
			Args: []string{"-record", j.record, "-marker", j.marker},
		})
	}
	return harness.Jobspec("bench-gate", gateJob{
		ID: j.id, GateTask: gateTask, Driver: harness.PluginDriverName,
		Path: j.path, TTL: TTL.String(), Delay: LockDelay.String(),
		Task: taskName, Image: b.docker.Image, Command: harness.ImageWorkloadPath,
		Count: j.count, FailFast: j.failFast,
		Args:    []string{"-record", "/records/" + filepath.Base(j.record), "-marker", j.marker},
		Volumes: []string{b.records + ":/records"},
	})
}

// isGate reports whether a variant is a gate holding the lock for another
// task ((d), (e)).
func isGate(variant string) bool { return variant == VariantGate || variant == VariantGateRaw }

// isSlot reports whether the variant holds a semaphore's slot.
func isSlot(variant string) bool { return variant == VariantLockSlot || variant == VariantDriverSlot }

// gateWaitingFor reports whether the allocation's gate has said, at least
// settle ago, that it waits for the lock (and has not started since).
func gateWaitingFor(al *api.AllocationListStub, settle time.Duration) bool {
	ts := al.TaskStates[gateTask]
	if ts == nil || ts.State != "pending" {
		return false
	}
	for _, ev := range ts.Events {
		if strings.Contains(ev.DisplayMessage+" "+ev.Message+" "+ev.DriverMessage, "Gate waiting for lock") {
			return time.Since(time.Unix(0, ev.Time)) >= settle
		}
	}
	return false
}
