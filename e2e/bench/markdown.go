package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"
)

// Scenario titles: the table's section headings, in order.
const (
	TitleHandover  = "1. Graceful handover"
	TitleCrash     = "2. Crash takeover"
	TitleStart     = "3. Uncontended start"
	TitleFootprint = "4. Footprint"
	TitleScale     = "5. Scale"
	TitleLB        = "6. LB registration"
	TitleHAProxy   = "7. Handover and crash through HAProxy"
	TitleSemaphore = "8. Semaphore: a slot's handover and crash takeover"
	TitleUpdate    = "9. Rolling update"
	TitleLeaseCost = "10. Lease mode: what the heartbeats cost the servers"
	TitleNodeDeath = "11. Node death: takeover when the holder's whole node dies"
	TitleMetrics   = "12. Metrics: what the plugin's metrics_addr costs"
)

// Image file names, next to the Markdown file.
const (
	TimelineImage = "benchmarks-timeline.png"
	RatiosImage   = "benchmarks-ratios.png"
)

// Methods says how each scenario is measured, for the report.
var Methods = map[string]string{
	TitleMetrics: `Two dev agents with the plugin, in the same run: one without and one with
metrics_addr (docs/operations.md), where each supervisor writes its count to
its state dir and the plugin serves /metrics. On each, graceful handovers as
in section 1 (a holder job and a standby job on one lock; the holder's job
stopped once the standby has waited 1.5 s), one at a time, the two agents
alternating which goes first; and a job of 10 allocations on one lock (a
holder and nine standbys), both agents at once, whose supervisors' VmRSS is
read after the holder has held for the footprint hold (the median of the
ten), with the holder's VmHWM and the plugin's VmRSS. The cost rows are the
median with metrics over the median without, less one. Last, the agent with
metrics runs a job of 100 allocations on one lock (10 in quick mode) and,
once its /metrics lists them all, times 20 scrapes of it, one every 100 ms,
from the request to the whole answer read.`,
	TitleNodeDeath: `One server and two clients, each client an agent in a network namespace
of its own; a job of count = 2 with one allocation on each client
(distinct_hosts), TTL 10s, delay 1s. Once the standby waits (and, in lease
mode, its plugin has seen the holder's heartbeat change), and after a random
wait over one renew period ((a): over its 1.1×TTL poll), every process of
the holder's client (agent, plugin, supervisors, guards, workloads) is
SIGSTOPped at once and then SIGKILLed, as a node dies. The time is from the
freeze to the standby's workload's start record. (a) and (c) wait for the
server to expire the lock (2×TTL after the last renew, plus the delay; (a)
then for its next 1.1×TTL poll); in lease mode (docs/lease.md) the
standby's plugin releases the dead holder's lock once its heartbeat has not
changed for L (9 s by default, 4 s with lease_profile = "aggressive"). The
variants run one after another, alternating which goes first; the client
is started again after each run. Without lease mode the time depends on
where in the renew period the node died: from 2×TTL + delay − the renew
interval to 2×TTL + delay (21 s) for (c) (renew every TTL/2), and from
14 s to 32 s for (a) (renew every 0.7×TTL, then its standby's 1.1×TTL
poll), so a few runs compare (a) and (c) only roughly.`,
	TitleLeaseCost: `N locks held at once by lockclient leases in the bench
process, against the first server of a three-server cluster (one client, no
jobs), plain and in lease mode (docs/lease.md: the same lock plus a heartbeat
every second, a check-and-set write of one variable). A renew resets a timer
on the leader and writes nothing to Raft; each heartbeat is one Raft entry.
Over a window of whole renew periods (at least the hold time), the leader's
last Raft index gives the entries per second; the leader's and the three
servers' CPU come from their threads' schedstat; the mean commit time is the
change of the leader's raft.commitTime summary (sum over count); snapshots per
hour are derived: entries per hour over raft_snapshot_threshold (8192, checked
every 120 to 240 s). The variants alternate which runs first. Every process
of the cluster, and the bench, share the machine's cores.`,
	TitleHandover: `The testworkload appends a start record with a CLOCK_MONOTONIC timestamp
as it starts; a pidfd opened on the old workload before the stop gives the
moment it exited. The gap is from that exit to the new workload's start
record (negative, and counted as an overlap, if the old one outlived the new
one's start). "Holder stopped"
(the goal): the holder is the only allocation of its job and the standby is
the only allocation of a second job on the same lock; once the standby has
run for 1.5 s (so (b) and (c) have parked their blocking query), the holder's
job is stopped, so no replacement allocation competes; the standby's job then
holds, and the next run adds a new standby job. (a)'s standby polls every
1.1×TTL from its own start, so for (a) each run also waits a random 0 to
1.1×TTL before the stop, to sample that phase fairly. "Alloc stop in a count =
2 group" is the other common case: ` + "`nomad alloc stop`" + ` on the holder of a
two-allocation group; Nomad starts a replacement allocation at once, which
competes for the freed lock with the waiting standby. "Lock step-down" is a
switchover: a count = 2 group of (b), (c) or (d); once its standby's record
(written as it begins to wait) is 1.5 s old, ` + "`lock step-down <path>`" + ` against
the agent's address; the former holder's allocation runs on and is the next
run's standby ((d): Nomad restarts its allocation, which the command asks
for, and the gate's clean release waits until the servers show that
restart). "Command start" is when the bench started the command. (a) has no
step-down. Variants run one after
another, so that sub-second gaps are not disturbed by another variant's work
on the 2 cores. (d) is a gate (a ` + "`singleton`" + ` task with ` + "`config { gate = true }`" + `,
a prestart sidecar) holding the lock for a docker task of its group, which
runs the same testworkload (exiting on SIGTERM) in a container of the
harness's private dockerd; its old workload is the container's process, seen
from the host. Nomad stops the docker task first, then the gate, which marks
its release clean; the standby's gate then holds, and Nomad creates and starts
the standby's container: that start is part of (d)'s gap. A standby of (d)
counts as waiting once its gate's "Gate waiting for lock" event is 1.5 s old.`,
	TitleCrash: `A service job with count = 2 per variant, without restarts or
rescheduling. Once the standby has waited 1.5 s, the holder's supervisor gets
SIGKILL: the ` + "`nomad var lock`" + ` process for (a), the ` + "`lock`" + ` process for
(b), the task's ` + "`__singleton-supervise`" + ` process for (c). Takeover is
measured from the kill to the new workload's start record. A pidfd opened on
the old workload process before the kill gives the moment it exited (poll
wake-up, microseconds late at most); "overlap" counts runs where it exited
after the new workload's start record, or not at all. The
variants of a run go concurrently: each mostly waits on a server-side timer,
which concurrency does not change. Each run kills at a random moment, uniform
over one renew period ((a): over its 1.1×TTL poll period), so that the renew
phase is sampled fairly rather than always just after the acquire. For (a)
and (b) the server expires the lock 2×TTL after the last renew and then waits
the lock delay: (b) renews every TTL/2 and wakes its standby with a blocking
query; (a) renews every 0.7×TTL and its standby polls every 1.1×TTL. For (c)
the plugin sees its supervisor die, confirms that every process of the task
is gone and releases the lock on the supervisor's behalf, so the server timer
does not come into play (it would if the plugin or the node died too, which
this scenario does not do). For (d) the SIGKILL goes to the gate's
supervisor: the gate fails, Nomad kills its docker task, and nobody releases
the lock (the plugin cannot prove another driver's task dead), so (d) waits
for the server's expiry as (b) does, then for the start of the standby's
container; it runs concurrently with the others.`,
	TitleStart: `Process start → workload start: ` + "`lock`" + ` and ` + "`nomad var lock`" + `
(shell mode, its default) run directly (not under Nomad) against the agent's
HTTP address, on a free lock, each wrapping the testworkload; the clock starts
just before fork and stops at the workload's start record. "plain process"
starts the testworkload itself. Job submit → workload start: the clock starts
just before the job register call and stops at the start record, for a plain
raw_exec job running the testworkload and for (a), (b), (c). Everything runs
one at a time, and each job is stopped before the next starts.`,
	TitleFootprint: `One single-allocation job per variant holds a free lock for the
hold window (two renews or more); then VmHWM (peak RSS) of the supervisor
process is read from /proc: the ` + "`nomad var lock`" + ` process, the ` + "`lock`" + `
process, the ` + "`__singleton-supervise`" + ` process. For (c) the plugin process
(one per agent, shared by all tasks) is reported too, VmHWM over its whole
life up to that moment. Supervisor CPU is its CPU time (from
/proc/<pid>/task/*/schedstat) from one second after the workload started to
the end of the hold, as % of one core: renews, the parked blocking query and
the runtime's own housekeeping. The variants of a run go concurrently (memory is not
timing-sensitive). Binary sizes are the files under bin/ as ` + "`make build`" + `
and ` + "`make nomad`" + ` produce them (both stripped of nothing; nomad is
Nomad's normal build). MiB = 2^20 bytes.`,
	TitleScale: `N leases on N distinct paths on one dev agent, held for the hold window.
(a) N ` + "`nomad var lock`" + ` processes and (b) N ` + "`lock`" + ` processes each wrap a
testworkload and talk to the agent's HTTP address; "(b) lockclient
goroutines" are N leases of the lockclient package in the bench process (the
same code ` + "`lock`" + ` runs), which is how N = 1000 fits in memory. Each run
gets a fresh agent (quick mode: one per N) with log level INFO,
Prometheus metrics on, and limits { http_max_conns_per_client = 0 }: every
lease here arrives from 127.0.0.1, and Nomad's default of 100 connections per
client address would cap the test at ~50 leases; in production each holder
talks to its own client agent over the Task API socket. The window starts
half a renew period after the last acquisition and lasts the hold time
rounded up to whole renew periods (HOLD=12s: 15 s for (b), 14 s for (a)), so
every lease renews equally often in it. Renew rate is the server's count of
lock renew RPCs (nomad.variables.lock.renew, from its Prometheus metrics)
over the window divided by its length; expected is N/(TTL/2) for (b) and
N/(0.7×TTL) for (a). Spurious losses are leases that ended during the window ((b): the
process exited or its workload stopped; goroutines: Lost() fired). Renew
errors are "renew failed" log lines (not available for (a)). Agent CPU and
holders' CPU are the CPU time of the agent, and of the N supervisor
processes (or, for goroutines, of the bench process), over the window as % of
one core, from /proc/<pid>/task/*/schedstat; "rest of the machine" is the
whole machine's CPU use over the window (/proc/stat) minus those two: the
workloads and guards of process variants, the bench's own sampling, and
anyone else's work on the machine. Agent RSS is VmRSS at the end of the
window. CPU percentages compare variants within one run; between runs on
this VM they moved by up to 5× for the same work (CPU time per request
depends on how busy, hence how fast, the cores are), so do not compare them
across reports. Time to acquire all N runs from the first spawn to the last
acquisition (for processes: the last workload start record). ` + "`lock`" + `
processes run only up to N = 100 by default (BENCH_SCALE_PROCS_MAX): here
each lease is three Go processes (lock, its process-group guard, the
workload) on the same 2 cores as the agent. In a trial at N = 500
(` + "`BENCH_SCALE_PROCS_MAX=500 make bench QUICK=1 SCENARIOS=scale SCALE=500`" + `)
starting 1,500 processes kept both cores saturated for about 90 s, the agent
answered renews later than their 2.5 s deadline, and 365 of the 500 ` + "`lock`" + `
processes fenced themselves and stopped their workloads, as designed, while
500 lockclient leases on the same agent right after renewed at the expected
rate with no loss. That measures the bench machine, not the agent: a real
deployment spreads the holders over many client nodes.`,
	TitleLB: `(b) ` + "`lock`" + ` with -lb-* flags under raw_exec and (c) the driver with a
load_balancer block register a port with the reference LB API
(examples/lbapi, served by the bench process on a free port), without a
health check. The clock starts at the workload's start record (the
supervisor starts the workload the moment it holds the lock, then sends the
ADD) and stops when the LB reports the request ` + "`<alloc>-ADD-<fence>`" + `
SUCCESS (read from the server every 2 ms). The LB's worker finishes
requests on its own tick: once with a 1 s worker, as Baragon runs it, which
then dominates; once with a 50 ms worker, which shows our side's share. Both
variants and both servers of one run go concurrently. (a) has no LB
integration.`,
	TitleUpdate: `A service job with count = 2 per variant (a holder and a warm
standby) and an ` + "`update`" + ` block with ` + "`max_parallel = 1`" + ` and ` + "`min_healthy_time = \"2s\"`" + `
goes through one rolling update per run: each changes the workload's
arguments (a version tag), so Nomad replaces both allocations, lowest name
index first (docs/updates.md). The next update is submitted once the
deployment is successful and a workload of the new version runs. A process
sampler and the workloads' start and stop records give each workload's run;
a handover is one workload's end followed by the next one's start, counted
in the update it falls in, and "time without a holder" adds up its gaps.
(c) runs twice: before, with ` + "`update_grace = \"0s\"`" + ` (the rule off: a
standby takes a free lock at once, as before it), and after, with the
default ` + "`update_grace`" + ` (10 s: an old-version standby gives way to a
new-version successor). The variants run one after another.`,
	TitleHAProxy: `What a client sees of a graceful handover and of a crash through a real load balancer.
HAProxy (Debian's 2.6.12, started by the bench with one backend per job, each
a pool of server slots that the LB API re-points at run time, with
` + "`retries 3`" + ` and ` + "`option redispatch 1`" + `) is driven by the
reference LB API (examples/lbapi with its HAProxy backend, in the bench
process, worker every 50 ms: a request takes three worker runs, so
Baragon's 1 s worker would stretch the REMOVE and the ADD to 2–3 s each). (b) ` + "`lock`" + ` with -lb-* and -health-* flags under raw_exec and (c) the
driver with load_balancer and health_check blocks run the testworkload, which
answers every HTTP request with its allocation ID, in a count = 2 group.
Once the standby has waited 1.5 s, a client loop on loopback starts sending
GET requests through HAProxy's frontend, one at a time, every 5 ms, and
300 ms later either ` + "`nomad alloc stop`" + ` stops the holder (graceful, the
first runs) or its supervisor gets SIGKILL (crash, the next runs, on the
same job); the loop ends after 200 answers in a row from someone else.
Graceful: the old holder's REMOVE lands before its workload is signalled, so
HAProxy answers 503 (no server) until the next holder has the lock, passes
its health check (every 200 ms) and its ADD has landed: those are the failed
requests. Crash: the workload dies with its supervisor while still in
HAProxy; a request sent to it is refused and HAProxy retries it (1 s apart,
on another server if there is one) until the new holder's ADD swaps the
dead upstream out, so requests wait rather than fail when the takeover is
fast ((c): the plugin releases the lock for the dead supervisor), and fail
after three retries when it is slow ((b): the server expires the lock after
2×TTL + delay). The longest stretch with no backend is the time from the end
of the last answer before failures to the start of the first answer after
them (an upper bound within the 5 ms pacing); "→ first answer" ends when the
client received it. HAProxy's process must be the same at the end. The
variants run one after another.`,
	TitleSemaphore: `A slot of a semaphore of 2 (` + "`lock -n 2`" + ` under raw_exec, the driver
with ` + "`lock { holders = 2 }`" + `) beside the single lock's (b) and (c), measured
in the same run and the same way as sections 1 and 2. Handover: for the
single lock, as "holder stopped" in section 1; for a slot, two jobs of one
allocation each hold the two slots, a standby job of one allocation finds
both held and waits (one blocking query per slot), and once it has waited
1.5 s one holder's job is stopped (the slots in turn); the gap runs from the
old workload's exit (pidfd) to the standby's start record, which must name
the freed slot. One variant after another. Crash: for the single lock, as
section 2; for a slot, a job of three allocations (no restarts, no
rescheduling) holds both slots with one standby, and the supervisor of one
slot's holder (the slots in turn) gets SIGKILL at a random moment of its
renew period; takeover runs to the standby's start record on that slot. The
four variants of a run go concurrently. A slot is a plain lock at
<prefix>/slot-<i>, so its figures should be the single lock's: (b) waits for
the server's expiry, (c)'s plugin releases at once.`,
}

// WriteDoc writes the Markdown report to mdPath, with its two pictures next
// to it. It returns the paths written.
func WriteDoc(rep *Report, mdPath string) ([]string, error) {
	dir := filepath.Dir(mdPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written, images []string
	var imgErrs []string
	if tls := rep.Timelines(); len(tls) > 0 {
		p := filepath.Join(dir, TimelineImage)
		if err := WriteTimelines(p, tls); err != nil {
			imgErrs = append(imgErrs, fmt.Sprintf("timeline: %v", err))
		} else {
			written, images = append(written, p), append(images, TimelineImage)
		}
	}
	if bars := RatioBars(rep.Rows()); len(bars) > 0 {
		p := filepath.Join(dir, RatiosImage)
		if err := WriteRatios(p, bars); err != nil {
			imgErrs = append(imgErrs, fmt.Sprintf("ratios: %v", err))
		} else {
			written, images = append(written, p), append(images, RatiosImage)
		}
	}
	md := rep.Markdown(images)
	tmp := mdPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(md), 0o644); err != nil {
		return written, err
	}
	if err := os.Rename(tmp, mdPath); err != nil {
		return written, err
	}
	written = append([]string{mdPath}, written...)
	if len(imgErrs) > 0 {
		return written, fmt.Errorf("pictures: %s", strings.Join(imgErrs, "; "))
	}
	return written, nil
}

// RatioBars picks the rows for the ratio chart: those with a Chart label,
// for (b) and (c), with an anchor to compare with.
func RatioBars(rows []*Row) []RatioBar {
	var out []RatioBar
	for _, r := range rows {
		if r.Chart == "" || (r.Variant != VariantLock && r.Variant != VariantDriver) {
			continue
		}
		if x, ok := Ratio(rows, r); ok {
			out = append(out, RatioBar{Metric: r.Chart, Variant: r.Variant, Ratio: x})
		}
	}
	return out
}

// NotBetter lists the time, memory and CPU rows where a variant's median
// is above 1.05× the anchor's: the places where we cost more.
func NotBetter(rows []*Row) []string {
	var out []string
	for _, r := range rows {
		if IsAnchor(r.Variant) || r.Variant == VariantPlainExec || r.Variant == VariantRawExec {
			continue
		}
		if r.Unit != Seconds && r.Unit != MiB && r.Unit != Percent {
			continue
		}
		if x, ok := Ratio(rows, r); ok && x > 1.05 {
			a := anchorOf(rows, r)
			out = append(out, fmt.Sprintf("%s, %s: %s %s vs %s (%s)", r.Scenario, r.Metric, r.Variant,
				r.Unit.Format(r.Summary().Median), r.Unit.Format(a.Summary().Median), formatRatio(x)))
		}
	}
	return out
}

// Markdown renders the whole report; images are file names relative to it.
func (rep *Report) Markdown(images []string) string {
	rows := rep.Rows()
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	p("# Benchmarks: `lock` and the `singleton` driver against `nomad var lock`")
	p("")
	p("Generated by `%s` on %s in %s. Do not edit by hand: run the command again.",
		rep.Config.Command, rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Took.Round(time.Second))
	p("")
	scen := "every scenario"
	if !rep.Config.AllEnabled() {
		scen = "only " + strings.Join(rep.Config.Scenarios, ", ")
	}
	mode := ""
	if rep.Config.Quick {
		mode = " **Quick (smoke) mode: one run and small N; not a benchmark.**"
	}
	p("%d run(s) per scenario and variant, %s, scale N = %s, scale hold window %s, footprint hold %s; lock TTL %s and delay %s throughout.%s",
		rep.Config.Runs, scen, joinInts(rep.Config.Scale), rep.Config.Hold, rep.Config.FootprintHold, TTL, LockDelay, mode)
	p("Variants: **(a)** `nomad var lock` under raw_exec (the anchor: \"vs (a)\" is the median over (a)'s median), " +
		"**(b)** `lock` under raw_exec, **(c)** the `singleton` task driver, **(d)** (handover and crash only) a `singleton` gate " +
		"holding the lock for a docker task of its group; in section 8, (b) and (c) also hold one slot of a semaphore of 2 " +
		"(`lock -n 2`, `lock { holders = 2 }`).")
	p("")

	p("## Goals")
	p("")
	p("| scenario | goal | variant | result | measured | what bounds it |")
	p("|---|---|---|---|---|---|")
	for _, r := range rows {
		switch {
		case r.Status != "":
			p("| %s | %s | %s | %s | – | – |", mdEscape(r.Scenario), mdEscape(r.Metric), mdEscape(r.Variant), mdEscape(r.Status))
		case r.Goal != nil:
			p("| %s | %s %s | %s | **%s** | %s | %s |", mdEscape(r.Scenario), mdEscape(r.Metric), mdEscape(r.Goal.Text),
				mdEscape(r.Variant), mdEscape(r.Verdict()), mdEscape(measuredText(r)), mdEscape(r.Goal.Bound))
		}
	}
	p("")

	if worse := NotBetter(rows); len(worse) > 0 {
		p("Where (b) or (c) is not better than `nomad var lock` (median ratio above 1.05 for a time, memory or CPU figure):")
		p("")
		for _, w := range worse {
			p("- %s", w)
		}
		p("")
	}

	if len(images) > 0 {
		p("## Pictures")
		p("")
		for _, img := range images {
			switch img {
			case TimelineImage:
				p("![Timeline of a handover and a crash for each variant](%s)", img)
				p("")
				p("Per variant, a holder job of one allocation and a standby job of two, on one lock. At the first dashed " +
					"line the holder's job is stopped (graceful handover); at the second, the new holder's supervisor gets " +
					"SIGKILL (crash). " +
					"The top lane shows the lock as the server holds it, in the colour of the allocation holding it; " +
					"a faded, dashed box is a lock still held for a supervisor that was killed, until the server " +
					"expires it (2×TTL after the last renew, plus the lock delay). The other lanes show each " +
					"allocation's supervisor waiting (thin grey) and its workload running (thick).")
			case RatiosImage:
				p("![Median of each variant relative to nomad var lock](%s)", img)
				p("")
				p("Each bar is a variant's median divided by `nomad var lock`'s median for the same metric (the dashed " +
					"line at 1), on a log scale: 0.1× is ten times less time (or memory, or CPU) than `nomad var lock`, 2× twice as much.")
			}
			p("")
		}
	}

	p("## Results")
	p("")
	for _, sc := range scenarios(rows) {
		p("### %s", sc)
		p("")
		p("| %s |", strings.Join(tableHeader, " | "))
		p("|---|---|--:|--:|--:|--:|--:|---|")
		for _, r := range rows {
			if r.Scenario != sc {
				continue
			}
			cs := cells(rows, r)
			for i := range cs {
				cs[i] = mdEscape(cs[i])
			}
			p("| %s |", strings.Join(cs, " | "))
		}
		p("")
		if m := Methods[sc]; m != "" {
			p("*How:* %s", strings.Join(strings.Fields(m), " "))
			p("")
		}
	}

	if notes := rep.Notes(); len(notes) > 0 {
		p("## Observations from this run")
		p("")
		for _, n := range notes {
			p("- %s", n)
		}
		p("")
	}

	m := rep.Machine
	p("## Machine")
	p("")
	p("| | |")
	p("|---|---|")
	p("| CPU | %s |", mdEscape(m.CPUModel))
	p("| cores | %d |", m.Cores)
	p("| memory | %s |", m.Memory)
	p("| kernel | %s |", mdEscape(m.Kernel))
	p("| OS | %s |", mdEscape(m.OS))
	p("| cgroups | %s |", m.Cgroups)
	p("| Nomad | %s (bin/nomad, built from the pinned module) |", mdEscape(m.Nomad))
	p("| lock | %s |", mdEscape(m.Lock))
	p("| Go | %s |", m.Go)
	p("| commit | %s |", mdEscape(m.Commit))
	p("| load average (1, 5, 15 min) | %s at the start, %s at the end |", m.LoadAtStart, m.LoadAtEnd)
	p("")
	p("## Reproduce")
	p("")
	p("```sh")
	p("%s", rep.Config.Command)
	p("```")
	p("")
	p("`make bench` builds bin/lock, the plugin and bin/nomad, compiles the e2e/bench test binary and runs "+
		"`TestBench` with BENCH=1; it starts its own `nomad agent -dev` instances on free loopback ports and "+
		"stops them and everything they ran at the end. Variables: RUNS (default 5), SCALE (default 100,500,1000), "+
		"HOLD (scale window, default 12s), SCENARIOS (default all: %s), QUICK=1 (smoke: one run, N=10, written to "+
		"bin/bench-quick/ instead of docs/).", strings.Join(AllScenarios, ","))
	p("")

	p("## Raw values")
	p("")
	p("<details><summary>Every run, in run order</summary>")
	p("")
	p("| scenario | metric | variant | values |")
	p("|---|---|---|---|")
	for _, r := range rows {
		if r.Status != "" {
			continue
		}
		vs := make([]string, len(r.Values))
		for i, v := range r.Values {
			vs[i] = r.Unit.Format(v)
		}
		p("| %s | %s | %s | %s |", mdEscape(r.Scenario), mdEscape(r.Metric), mdEscape(r.Variant), mdEscape(strings.Join(vs, ", ")))
	}
	p("")
	p("</details>")
	return withTOC(b.String())
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// Seconds converts CLOCK_MONOTONIC nanoseconds to seconds.
func secondsOf(ns int64) float64 { return float64(ns) / 1e9 }

// nan is a run that could not measure.
var nan = math.NaN()

// withTOC puts a table of contents of md's "## " and "### " headings before
// its first "## " heading, linked by the anchors GitHub gives them.
func withTOC(md string) string {
	lines := strings.Split(md, "\n")
	var toc []string
	first := -1
	inFence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		level, text, ok := strings.Cut(l, " ")
		if inFence || !ok || (level != "##" && level != "###") {
			continue
		}
		if first < 0 {
			first = i
		}
		indent := ""
		if level == "###" {
			indent = "  "
		}
		toc = append(toc, fmt.Sprintf("%s- [%s](#%s)", indent, text, headingAnchor(text)))
	}
	if first < 0 {
		return md
	}
	out := append(append(append([]string{}, lines[:first]...), toc...), "")
	return strings.Join(append(out, lines[first:]...), "\n")
}

// headingAnchor is the anchor GitHub gives a heading of plain text and code
// spans: lower case, letters, digits, '-' and '_' kept, spaces turned into
// '-', the rest dropped.
func headingAnchor(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
