package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
)

var lockVariants = []string{VariantAnchor, VariantLock, VariantDriver}

// failoverVariants are those of the handover and crash scenarios: the lock
// variants and (d), a gate holding the lock for a docker task.
var failoverVariants = append(slices.Clone(lockVariants), VariantGate)

// stepDownVariants are those of the handover scenario's switchover: the
// failover variants but (a), which has no step-down.
var stepDownVariants = slices.DeleteFunc(slices.Clone(failoverVariants), IsAnchor)

// crashVariants are those of the crash scenario: failoverVariants and (e),
// a gate holding the lock for a raw_exec task.
var crashVariants = append(slices.Clone(failoverVariants), VariantGateRaw)

// The targets the report judges rows by (its Goals table), each with the
// mechanism that bounds the number, so a reader sees why the target holds.
var (
	handoverGoal = func() *Goal {
		return Below(0.3, Seconds, "the standby's parked blocking query returns when the release is "+
			"written; then a process start. (a) polls every 1.1×TTL instead (11 s here).")
	}
	crashGoal = func(v string) *Goal {
		bound := "the server: it expires the lock 2×TTL after the last renew, then waits the lock delay; " +
			"renewing every TTL/2 puts that 15.5 to 21 s after the kill, plus the standby's wake-up (a blocking query)."
		if v == VariantDriver {
			bound = "the plugin: it watches the supervisor, and once every process of the task is confirmed gone it " +
				"releases the lock on the dead supervisor's behalf, so the standby's blocking query returns at once. " +
				"Were the plugin gone too (node down), the server bound of (b) would apply."
		}
		if isGate(v) {
			return MedianAtMost(1, Seconds, "the plugin: once the gate's supervisor is gone it kills the gated app itself "+
				"(docker: paused, then SIGKILLed; raw_exec: its cgroup frozen and killed), proves it dead, marks the "+
				"release clean and releases, so the standby's gate starts its app at once; then Nomad starts the app "+
				"(a docker container's create and start take a few hundred ms, more on a busy machine).")
		}
		return AtMost((2*TTL + LockDelay + 500*time.Millisecond).Seconds(), Seconds, bound)
	}
	overlapGoal = func(v string) *Goal {
		if isGate(v) {
			return Zero("the plugin kills the gated task and proves it dead before it releases the gate's lock; " +
				"where it cannot, Nomad kills it (its kill_timeout, checked against ttl + delay when the gate starts), " +
				"long before the server can expire the lock.")
		}
		return Zero("the supervisor's death takes the workload's process group with it (PDEATHSIG and a group guard), " +
			"long before the server can expire the lock.")
	}
	stepDownOverlapGoal = func() *Goal {
		return Zero("a step-down is the holder's graceful stop: every process of its workload is proven dead " +
			"before it releases, and the standby starts its workload only once it holds the lock.")
	}
	rssGoal = func() *Goal {
		return AtMost(12, MiB, "the Go runtime plus the nomad/api client; no nomad/structs linked.")
	}
)

// handover measures a graceful handover (section TitleHandover), in two
// forms, and a switchover beside them.
//
// Standby: the holder is the only allocation of its job and a standby waits
// in a second job on the same lock; stopping the holder's job stops its
// allocation and nothing replaces it, so the standby is the one to take
// over. This is the measurement the goal is about.
//
// Step-down ((b), (c), (d)): `lock step-down` moves the lock of a count = 2
// group to its standby (handoverStepDown).
//
// Replacement (not in quick mode): holder and standby are one count = 2
// group and the holder's allocation is stopped with `nomad alloc stop`; the
// scheduler starts a replacement allocation at once, which competes for the
// free lock too (and, for (a), wins it long before the polling standby).
func (b *bench) handover(t *testing.T) {
	type rows struct {
		stop, stepDown handoverRows
		repl, won      *Row
	}
	rs := map[string]*rows{}
	for _, v := range failoverVariants {
		rs[v] = &rows{}
	}
	for _, v := range failoverVariants {
		var g *Goal
		if v != VariantAnchor && v != VariantGate {
			g = handoverGoal()
		}
		rs[v].stop.gap = b.row(TitleHandover, "holder stopped: old workload exit → standby's workload start", v, Seconds, AggStats, g)
		rs[v].stop.gap.Chart = "handover\n(holder stopped)"
	}
	for _, v := range failoverVariants {
		rs[v].stop.call = b.row(TitleHandover, "holder stopped: stop call → standby's workload start", v, Seconds, AggStats, nil)
	}
	for _, v := range failoverVariants {
		rs[v].stop.over = b.row(TitleHandover, "holder stopped: runs where old and new workload overlapped", v, Count, AggSum, nil)
	}
	const stepDownGap = "lock step-down: old workload exit → standby's workload start"
	b.rep.Add(&Row{Scenario: TitleHandover, Metric: stepDownGap, Variant: VariantAnchor, Status: "n/a: nomad var lock has no step-down"})
	for _, v := range stepDownVariants {
		var g *Goal
		if v != VariantGate {
			g = handoverGoal()
		}
		rs[v].stepDown.gap = b.row(TitleHandover, stepDownGap, v, Seconds, AggStats, g)
	}
	for _, v := range stepDownVariants {
		rs[v].stepDown.call = b.row(TitleHandover, "lock step-down: command start → standby's workload start", v, Seconds, AggStats, nil)
	}
	for _, v := range stepDownVariants {
		rs[v].stepDown.over = b.row(TitleHandover, "lock step-down: runs where old and new workload overlapped", v, Count, AggSum, stepDownOverlapGoal())
	}
	if !b.cfg.Quick {
		for _, v := range failoverVariants {
			rs[v].repl = b.row(TitleHandover, "alloc stop in a count = 2 group: old workload exit → next workload start", v, Seconds, AggStats, nil)
			rs[v].repl.Note = "the replacement competes"
			rs[v].repl.Chart = "handover\n(alloc stop,\ncount = 2)"
		}
		for _, v := range failoverVariants {
			rs[v].won = b.row(TitleHandover, "alloc stop in a count = 2 group: runs the replacement won over the standby", v, Count, AggSum, nil)
		}
	}
	// One variant at a time: these are sub-second gaps on 2 cores.
	for _, v := range failoverVariants {
		t.Run(slug(v), func(t *testing.T) {
			b.handoverStandby(t, v, rs[v].stop)
			if rs[v].stepDown.gap != nil {
				b.handoverStepDown(t, v, rs[v].stepDown)
			}
			if rs[v].repl != nil {
				b.handoverReplacement(t, v, rs[v].repl, rs[v].won)
			}
		})
	}
}

// handoverRows are the rows of one form of handover: the gap (old workload
// exit → new workload start), the call that asked for it → new workload
// start, and the runs where the two workloads overlapped (a negative gap).
type handoverRows struct{ gap, call, over *Row }

func (r handoverRows) add(gap, call int64) {
	add(r.gap, secondsOf(gap))
	add(r.call, secondsOf(call))
	overlap := 0.0
	if gap < 0 {
		overlap = 1
	}
	add(r.over, overlap)
}

// handoverOnce watches the holder's workload, then calls ask (a stop, a
// step-down) and waits for the next workload start in j's record file. It
// returns that start, the gap from the old workload's exit to it, and the
// time from ask's call to it.
func (b *bench) handoverOnce(t *testing.T, j *job, holder harness.Record, ask func()) (next harness.Record, gap, call int64) {
	t.Helper()
	exited := b.watchWorkloadExit(t, j, holder)
	askAt := harness.MonoNow()
	ask()
	next = waitStart(t, j.record, askAt, 60*time.Second)
	return next, next.Mono - waitExit(t, exited, holder, 30*time.Second), next.Mono - askAt
}

// stopCall is a handoverOnce ask: stop the job (not purge it), which stops
// its allocations gracefully.
func (b *bench) stopCall(t *testing.T, jobID string) func() {
	return func() {
		if _, _, err := b.a.API().Jobs().Deregister(jobID, false, nil); err != nil {
			t.Fatalf("stop job %s: %v", jobID, err)
		}
	}
}

// sibling is another job on the same lock, record file and marker.
func (b *bench) sibling(j *job, kind string, count int) *job {
	s := *j
	s.id = fmt.Sprintf("%s-%s-%d", kind, slug(j.variant), b.seq.Add(1))
	s.count = count
	return &s
}

func (b *bench) handoverStandby(t *testing.T, v string, rows handoverRows) {
	holderJob := b.newJob("handover", v, 1)
	holderJob.failFast = true
	b.register(t, holderJob)
	jobs := []*job{holderJob}
	defer func() {
		for _, j := range jobs {
			b.stopJob(t, j, 0)
		}
	}()
	holder := waitStart(t, holderJob.record, 0, 90*time.Second)
	for run := 1; run <= b.cfg.Runs; run++ {
		standbyJob := b.sibling(holderJob, "handover-standby", 1)
		jobs = append(jobs, standbyJob)
		b.register(t, standbyJob)
		b.waitStandbys(t, standbyJob, "", 1, 1500*time.Millisecond, 90*time.Second)
		if v == VariantAnchor && !b.cfg.Quick {
			// (a)'s standby polls every 1.1×TTL from its own start, which
			// the standby wait above would otherwise always catch at the
			// same phase.
			time.Sleep(randomPhase(TTL * 11 / 10))
		}
		next, g, call := b.handoverOnce(t, holderJob, holder, b.stopCall(t, holderJob.id))
		rows.add(g, call)
		b.progress("handover %s run %d/%d: holder's job stopped: old exit → standby's start %s (stop call → start %s)",
			v, run, b.cfg.Runs, fmtS(g), fmtS(call))
		if allocs, err := b.a.Allocs(standbyJob.id); err != nil || len(allocs) != 1 || allocs[0].ID != next.AllocID {
			t.Errorf("the new holder is alloc %s, want the standby job's allocation", next.AllocID)
		}
		holder, holderJob = next, standbyJob
	}
}

// pairJob registers a count = 2 job of variant v, a holder and a standby,
// and waits for the holder's workload.
func (b *bench) pairJob(t *testing.T, kind, v string) (*job, harness.Record) {
	j := b.newJob(kind, v, 2)
	b.register(t, j)
	return j, waitStart(t, j.record, 0, 90*time.Second)
}

// handoverStepDown measures a switchover: one count = 2 group, a holder and
// a warm standby; `lock step-down <path>` against the agent's HTTP API (the
// bench agent has no ACLs: no token) hands the lock to the standby, and the
// former holder's allocation waits as the next run's standby ((d): after
// Nomad's restart of its allocation, which the command asks for).
func (b *bench) handoverStepDown(t *testing.T, v string, rows handoverRows) {
	j, holder := b.pairJob(t, "stepdown", v)
	defer b.stopJob(t, j, 0)
	for run := 1; run <= b.cfg.Runs; run++ {
		// As the graceful handover's standby: it has waited 1.5 s.
		standby := b.a.WaitStandbyRecords(t, j.path, holder.AllocID, 1, 1500*time.Millisecond, 90*time.Second)
		var cmd *harness.Process
		next, g, call := b.handoverOnce(t, j, holder, func() {
			c := exec.Command(b.lockBin, "step-down", j.path)
			c.Env = append(harness.WithoutNomadEnv(os.Environ()), "NOMAD_ADDR="+b.a.Addr())
			cmd = harness.StartProcess(t, c)
		})
		if code := cmd.Wait(60 * time.Second); code != 0 || next.AllocID != standby[0] {
			t.Fatalf("lock step-down %s: exit %d, new holder %s, want 0 and the standby %s\n%s%s",
				j.path, code, short(next.AllocID), short(standby[0]), cmd.Stdout(), cmd.Stderr())
		}
		rows.add(g, call)
		b.progress("handover %s run %d/%d: lock step-down: old exit → standby's start %s (command start → start %s)",
			v, run, b.cfg.Runs, fmtS(g), fmtS(call))
		holder = next
	}
}

func (b *bench) handoverReplacement(t *testing.T, v string, gap, won *Row) {
	j, holder := b.pairJob(t, "handover-repl", v)
	defer b.stopJob(t, j, 0)
	for run := 1; run <= b.cfg.Runs; run++ {
		b.waitStandbys(t, j, holder.AllocID, 1, 1500*time.Millisecond, 90*time.Second)
		if v == VariantAnchor {
			time.Sleep(randomPhase(TTL * 11 / 10))
		}
		standbys := b.waitStandbys(t, j, holder.AllocID, 1, 0, 10*time.Second)
		next, g, _ := b.handoverOnce(t, j, holder, func() {
			if err := b.a.StopAlloc(holder.AllocID); err != nil {
				t.Fatalf("stop alloc %s: %v", holder.AllocID, err)
			}
		})
		add(gap, secondsOf(g))
		who := "the replacement"
		if slices.Contains(standbys, next.AllocID) {
			who = "the standby"
			add(won, 0)
		} else {
			add(won, 1)
		}
		b.progress("handover %s run %d/%d: one alloc of count=2 stopped: old exit → next start %s (%s won)",
			v, run, b.cfg.Runs, fmtS(g), who)
		holder = next
	}
}

// crash measures the takeover after SIGKILL to the holder's supervisor
// (section TitleCrash). The variants of one run go concurrently.
func (b *bench) crash(t *testing.T) {
	take, gone, over := map[string]*Row{}, map[string]*Row{}, map[string]*Row{}
	for _, v := range crashVariants {
		var g *Goal
		if v != VariantAnchor {
			g = crashGoal(v)
		}
		take[v] = b.row(TitleCrash, "SIGKILL to supervisor → new workload start", v, Seconds, AggStats, g)
		take[v].Chart = "crash\ntakeover"
	}
	for _, v := range crashVariants {
		gone[v] = b.row(TitleCrash, "SIGKILL to supervisor → old workload gone", v, Seconds, AggStats, nil)
		gone[v].NoRatio = true // near zero for all: a ratio would be noise
		gone[v].Note = "pidfd"
	}
	for _, v := range crashVariants {
		var g *Goal
		if v != VariantAnchor {
			g = overlapGoal(v)
		}
		over[v] = b.row(TitleCrash, "runs where the old workload was alive at the new start", v, Count, AggSum, g)
	}
	for run := 1; run <= b.cfg.Runs; run++ {
		var names []string
		var fns []func(*testing.T)
		for _, v := range crashVariants {
			names = append(names, fmt.Sprintf("run%d/%s", run, slug(v)))
			fns = append(fns, func(t *testing.T) { b.crashRun(t, v, run, take[v], gone[v], over[v]) })
		}
		runConcurrently(t, names, fns)
	}
}

func (b *bench) crashRun(t *testing.T, v string, run int, take, gone, over *Row) {
	j := b.newJob("crash", v, 2)
	j.failFast = true // the killed allocation must not come back and compete
	b.register(t, j)
	first := waitStart(t, j.record, 0, 90*time.Second)
	b.waitStandbys(t, j, first.AllocID, 1, 1500*time.Millisecond, 90*time.Second)
	sup := b.supervisorPID(t, j, first.AllocID)
	// Kill at a random phase of the holder's renew period ((a): and of the
	// standby's 1.1×TTL poll), not always just after the first acquire.
	if v == VariantAnchor {
		time.Sleep(randomPhase(TTL * 11 / 10))
	} else {
		time.Sleep(randomPhase(TTL / 2))
	}

	next, state, overlap := b.killSupervisor(t, j, first, sup, take, gone, over)
	b.progress("crash %s run %d/%d: takeover %s, old workload %s, overlap %t",
		v, run, b.cfg.Runs, fmtS(next.Mono-next.killAt), state, overlap)
	if left := b.stopJob(t, j, 30*time.Second); left > 0 {
		b.rep.Note("%s, crash run %d: %d process(es) of the job were still alive 30 s after the job was purged; the bench SIGKILLed them.", v, run, left)
	}
	if overlap {
		b.rep.Note("%s, crash run %d: the old workload (pid %d) was still running when the new holder's workload started (%s after the kill; old workload %s).",
			v, run, first.PID, fmtS(next.Mono-next.killAt), state)
	}
}

// killSupervisor SIGKILLs the holder's supervisor sup, waits for the next
// workload start of job j, and adds to the rows the takeover (kill → new
// start), when the old workload exited after the kill, and whether it
// outlived the new start. A pidfd on the old workload tells the moment it
// exits, to the microsecond: the overlap check must not depend on a
// sampler's 20 ms.
func (b *bench) killSupervisor(t *testing.T, j *job, first harness.Record, sup int, take, gone, over *Row) (next killedNext, state string, overlap bool) {
	exited := b.watchWorkloadExit(t, j, first)
	killAt := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL supervisor %d: %v", sup, err)
	}
	rec := waitStart(t, j.record, killAt, 90*time.Second)
	death, died := exited.Wait(10 * time.Second)
	overlap = !died || death > rec.Mono
	goneAfter := nan
	state = "STILL ALIVE 10 s after the new start"
	if died {
		goneAfter = secondsOf(death - killAt)
		state = "exited " + Seconds.Format(goneAfter) + " after the kill"
	}
	add(take, secondsOf(rec.Mono-killAt))
	add(gone, goneAfter)
	if overlap {
		add(over, 1)
	} else {
		add(over, 0)
	}
	return killedNext{Record: rec, killAt: killAt}, state, overlap
}

// killedNext is the workload that started after a supervisor was killed.
type killedNext struct {
	harness.Record
	killAt int64 // monotonic ns of the kill
}

// randomPhase is a uniformly random wait in [0, period).
func randomPhase(period time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(period)))
}

// start measures an uncontended start (section TitleStart). One measurement at a time.
func (b *bench) start(t *testing.T) {
	const procMetric, submitMetric = "process start → workload start", "job submit → workload start"
	proc := map[string]*Row{}
	for _, v := range []string{VariantPlainExec, VariantAnchor, VariantLock} {
		proc[v] = b.row(TitleStart, procMetric, v, Seconds, AggStats, nil)
		proc[v].Chart = "start\n(process)"
	}
	proc[VariantPlainExec].Note = "no lock; outside Nomad"
	proc[VariantAnchor].Note = "outside Nomad"
	proc[VariantLock].Note = "outside Nomad"
	submit := map[string]*Row{}
	for _, v := range []string{VariantRawExec, VariantAnchor, VariantLock, VariantDriver} {
		submit[v] = b.row(TitleStart, submitMetric, v, Seconds, AggStats, nil)
		submit[v].Chart = "start\n(job submit)"
	}
	submit[VariantRawExec].Note = "no lock"
	// Warm-up, not measured: the agent's first job and the first exec of
	// each binary are slower than the rest.
	t.Run("warmup", func(t *testing.T) {
		for _, v := range []string{VariantPlainExec, VariantAnchor, VariantLock} {
			b.procStart(t, v)
		}
		j := b.newJob("warmup", VariantRawExec, 1)
		b.register(t, j)
		waitStart(t, j.record, 0, 60*time.Second)
		b.stopJob(t, j, 30*time.Second)
	})
	for run := 1; run <= b.cfg.Runs; run++ {
		t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
			var line []string
			// The order rotates from run to run, so that no variant always
			// goes first.
			for _, v := range rotate([]string{VariantPlainExec, VariantAnchor, VariantLock}, run) {
				d := b.procStart(t, v)
				add(proc[v], secondsOf(d))
				line = append(line, fmt.Sprintf("%s %s", slug(v), fmtS(d)))
			}
			b.progress("start run %d/%d: process start → workload: %s", run, b.cfg.Runs, strings.Join(line, ", "))
			line = nil
			for _, v := range rotate([]string{VariantRawExec, VariantAnchor, VariantLock, VariantDriver}, run) {
				j := b.newJob("start", v, 1)
				submitAt := b.register(t, j)
				st := waitStart(t, j.record, 0, 60*time.Second)
				add(submit[v], secondsOf(st.Mono-submitAt))
				line = append(line, fmt.Sprintf("%s %s", slug(v), fmtS(st.Mono-submitAt)))
				b.stopJob(t, j, 30*time.Second)
			}
			b.progress("start run %d/%d: job submit → workload: %s", run, b.cfg.Runs, strings.Join(line, ", "))
		})
	}
}

// rotate returns vs rotated left by k.
func rotate(vs []string, k int) []string {
	k %= len(vs)
	return append(slices.Clone(vs[k:]), vs[:k]...)
}

// procStart runs the variant as a plain process against the agent's HTTP
// address on a free lock and returns fork → workload start record.
func (b *bench) procStart(t *testing.T, v string) int64 {
	n := b.seq.Add(1)
	record := filepath.Join(b.records, fmt.Sprintf("proc-start-%s-%d.jsonl", slug(v), n))
	marker := fmt.Sprintf("bench-proc-start-%d-%d", n, time.Now().UnixNano())
	path := fmt.Sprintf("bench/proc-start-%d/lock", n)
	argv := b.workloadArgs(record, marker)
	switch v {
	case VariantAnchor:
		argv = append(append([]string{b.nomadBin}, varLockArgs(path)...), argv...)
	case VariantLock:
		argv = append(append([]string{b.lockBin}, lockArgs(path)...), argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(harness.WithoutNomadEnv(os.Environ()), b.a.Env()...)
	t0 := harness.MonoNow()
	p := harness.StartProcess(t, cmd)
	st := waitStart(t, record, 0, 30*time.Second)
	if _, clean := stopProcess(p, 10*time.Second); !clean {
		b.rep.Note("%s as a plain process did not exit within 10 s of SIGTERM; the bench SIGKILLed its process group.", v)
	}
	return st.Mono - t0
}

// footprint measures what a holding supervisor costs in memory and CPU
// (section TitleFootprint).
func (b *bench) footprint(t *testing.T) {
	hwm := map[string]*Row{}
	for _, v := range lockVariants {
		var g *Goal
		if v == VariantLock {
			g = rssGoal()
		}
		hwm[v] = b.row(TitleFootprint, "supervisor peak RSS while holding (VmHWM)", v, MiB, AggStats, g)
		hwm[v].Chart = "supervisor\npeak RSS"
	}
	plugin := b.row(TitleFootprint, "plugin process peak RSS (VmHWM, one per agent)", VariantDriver, MiB, AggStats, nil)
	cpu := map[string]*Row{}
	for _, v := range lockVariants {
		cpu[v] = b.row(TitleFootprint, "supervisor CPU while holding (% of one core)", v, Percent, AggStats, nil)
		cpu[v].Chart = "supervisor\nCPU"
	}
	for _, s := range []struct{ v, path, what string }{
		{VariantAnchor, b.nomadBin, "bin/nomad"},
		{VariantLock, b.lockBin, "bin/lock"},
		{VariantDriver, b.pluginBin, "bin/plugins/nomad-driver-singleton"},
	} {
		r := b.row(TitleFootprint, "binary size", s.v, MiB, AggStats, nil)
		r.Planned = 1
		r.Note = s.what
		r.Chart = "binary\nsize"
		if fi, err := os.Stat(s.path); err == nil {
			add(r, float64(fi.Size())/(1<<20))
		} else {
			t.Errorf("binary size: %v", err)
		}
	}
	for run := 1; run <= b.cfg.Runs; run++ {
		var names []string
		var fns []func(*testing.T)
		for _, v := range lockVariants {
			names = append(names, fmt.Sprintf("run%d/%s", run, slug(v)))
			fns = append(fns, func(t *testing.T) {
				j := b.newJob("footprint", v, 1)
				b.register(t, j)
				st := waitStart(t, j.record, 0, 60*time.Second)
				sup := b.supervisorPID(t, j, st.AllocID)
				// CPU from one second after the start (startup excluded) to
				// the end of the hold: renews and idle runtime only.
				time.Sleep(time.Second)
				meter := startCPU(sup)
				time.Sleep(b.cfg.FootprintHold - time.Second)
				add(cpu[v], meter.percent())
				m, err := readMiB(sup, "VmHWM")
				if err != nil {
					t.Fatalf("read VmHWM of %d: %v", sup, err)
				}
				add(hwm[v], m)
				b.progress("footprint %s run %d/%d: supervisor VmHWM %s, CPU while holding %s", v, run, b.cfg.Runs,
					MiB.Format(m), Percent.Format(cpu[v].Values[len(cpu[v].Values)-1]))
				if v == VariantDriver {
					procs, err := harness.PluginProcs(b.a.Client().PID(), b.pluginBin)
					if err != nil || len(procs) != 1 {
						t.Errorf("plugin process: %v (err %v)", procs, err)
					} else if pm, err := readMiB(procs[0].PID, "VmHWM"); err == nil {
						add(plugin, pm)
					}
				}
				b.stopJob(t, j, 30*time.Second)
			})
		}
		runConcurrently(t, names, fns)
	}
}

// lb measures lock acquired → LB ADD SUCCESS (section TitleLB). (b) and (c)
// register with the reference LB API (examples/lbapi), served from this
// process on a free port: once with its worker every second, as Baragon's
// runs, and once every 50 ms (lbapi's default), which shows what our side
// costs. The variants and both servers of one run go concurrently; the LB's
// worker phase is random with respect to the acquire anyway.
func (b *bench) lb(t *testing.T) {
	const metric = "lock acquired → LB ADD SUCCESS"
	na := &Row{Scenario: TitleLB, Metric: metric, Variant: VariantAnchor, Status: "n/a: nomad var lock has no LB integration"}
	out, _ := exec.Command(b.lockBin, "-h").CombinedOutput()
	if !strings.Contains(string(out), "-lb-uri") {
		r := &Row{Scenario: TitleLB, Metric: metric, Variant: "(b) lock, (c) singleton driver",
			Status: "not yet: this `lock` has no LB support (`lock -h` lists no -lb-uri)"}
		b.rep.Add(r)
		b.progress("LB: %s", r.Status)
		return
	}
	b.rep.Add(na)
	type server struct {
		label string
		srv   *lbapi.Server
		uri   string
		rows  map[string]*Row
	}
	var servers []*server
	for _, w := range []struct {
		label    string
		interval time.Duration
	}{{"LB worker every 1 s, as Baragon", time.Second}, {"LB worker every 50 ms", 50 * time.Millisecond}} {
		srv, err := lbapi.NewServer(lbapi.Options{Groups: []lbapi.Group{{Name: lbGroup}}, WorkerInterval: w.interval})
		if err != nil {
			t.Fatalf("lbapi: %v", err)
		}
		base, err := srv.Start("127.0.0.1:0")
		if err != nil {
			_ = srv.Close()
			t.Fatalf("lbapi: %v", err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		sv := &server{label: w.label, srv: srv, uri: srv.RequestURL(base), rows: map[string]*Row{}}
		for _, v := range []string{VariantLock, VariantDriver} {
			sv.rows[v] = b.row(TitleLB, metric, v, Seconds, AggStats, nil)
			sv.rows[v].Note = w.label
		}
		servers = append(servers, sv)
	}
	for run := 1; run <= b.cfg.Runs; run++ {
		var names []string
		var fns []func(*testing.T)
		for _, sv := range servers {
			for _, v := range []string{VariantLock, VariantDriver} {
				names = append(names, fmt.Sprintf("run%d/%s/%s", run, slug(v), strings.Fields(sv.label)[3]))
				fns = append(fns, func(t *testing.T) {
					j := b.newJob("lb", v, 1)
					j.lbURI, j.lbService = sv.uri, j.id
					b.register(t, j)
					st := waitStart(t, j.record, 0, 60*time.Second)
					fence, err := strconv.ParseUint(st.Fence, 10, 64)
					if err != nil {
						t.Fatalf("workload has no fence: %q", st.Fence)
					}
					id := lbhook.RequestID(st.AllocID, lbhook.KindAdd, fence, 1)
					deadline := time.Now().Add(60 * time.Second)
					var state string
					for {
						state, _ = sv.srv.RequestState(id)
						if state == "SUCCESS" {
							break
						}
						if state == "FAILED" || state == "CANCELED" || state == "INVALID_REQUEST_NOOP" || time.Now().After(deadline) {
							t.Fatalf("LB request %s: state %q", id, state)
						}
						time.Sleep(2 * time.Millisecond)
					}
					d := harness.MonoNow() - st.Mono
					add(sv.rows[v], secondsOf(d))
					b.progress("LB %s run %d/%d (%s): acquired → ADD SUCCESS %s", v, run, b.cfg.Runs, sv.label, fmtS(d))
					b.stopJob(t, j, 30*time.Second)
				})
			}
		}
		runConcurrently(t, names, fns)
	}
}
