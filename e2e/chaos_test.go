package e2e

// The fault matrix: every row injects one fault into a running singleton
// (a count=2 job: one holder, one standby) on a real agent, K times, and
// records for every trial the number of overlapping workload intervals (must
// be 0), fence violations (fences must strictly increase from holder to
// holder), the takeover time, and any load balancer state lost. Every trial
// goes through harness.CheckNoOverlap (records + sampler + fences).
//
// `go -C e2e test .` runs each row once (the reduced set of `make e2e`);
// `make chaos` runs CHAOS_TRIALS (default 3) trials per row and writes the
// matrix to CHAOS_REPORT (docs/reliability.md).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

const (
	// chaosTrialsEnv sets the trials per row (default 1).
	chaosTrialsEnv = "CHAOS_TRIALS"
	// chaosReportEnv names the markdown file the matrix is written to.
	chaosReportEnv = "CHAOS_REPORT"
	// chaosTakeoverBound is the loose bound on any takeover that has to
	// wait for the server to expire the lock (2×TTL + delay = 21s).
	chaosTakeoverBound = 2*drvTTL + drvDelay + 30*time.Second
	// chaosConcurrency bounds how many rows share the dev agent at once.
	chaosConcurrency = 3
)

// chaosTrial is the outcome of one trial of one row.
type chaosTrial struct {
	Overlaps int // overlapping pairs of workload intervals (at least 1 if the sampler saw two allocations at once)
	Fences   int // fence violations
	// Takeover is fault → first start of the next holder; -1 when the row
	// expects no failover (then Recovery may be set).
	Takeover time.Duration
	Recovery time.Duration // e.g. plugin relaunched, agent ready again; -1 if none
	LBLost   int           // LB upstreams wrong after convergence (dead holder left, holder missing, unmanaged touched)
	Failed   bool
	Note     string
}

// chaosRow is one row of the matrix.
type chaosRow struct {
	ID, Fault, Variant, Proves string
	// Skip, if set, is why the row cannot run here, as measured by the test.
	Skip string
}

type chaosRowResult struct {
	Row    chaosRow
	Trials []chaosTrial
}

var chaosResults = struct {
	sync.Mutex
	rows  map[string]*chaosRowResult
	order []string
}{rows: map[string]*chaosRowResult{}}

func chaosRecord(row chaosRow, tr *chaosTrial) {
	chaosResults.Lock()
	defer chaosResults.Unlock()
	r, ok := chaosResults.rows[row.ID]
	if !ok {
		r = &chaosRowResult{Row: row}
		chaosResults.rows[row.ID] = r
		chaosResults.order = append(chaosResults.order, row.ID)
	}
	if tr != nil {
		r.Trials = append(r.Trials, *tr)
	}
}

func chaosTrials(t *testing.T) int {
	s := os.Getenv(chaosTrialsEnv)
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 50 {
		t.Fatalf("%s=%q: want a number of trials from 1 to 50", chaosTrialsEnv, s)
	}
	return n
}

// chaosRunRow runs the row as a subtest named after it (see chaosRunTrials).
func chaosRunRow(t *testing.T, row chaosRow, trials int, trial func(t *testing.T, n int, tr *chaosTrial)) {
	t.Run(row.ID, func(t *testing.T) { chaosRunTrials(t, row, trials, trial) })
}

// chaosRunRowsApart runs each row as a parallel subtest on a cluster of its
// own (newAgent), its trials one after another. For rows whose fault hits a
// whole client (its plugin, its agent) or the servers: they cannot share
// one, and side by side they take the time of the longest row, not the sum
// of them all (TestChaos/cluster took six minutes one row after another).
func chaosRunRowsApart(t *testing.T, rows []chaosRowTrial, trials int, newAgent func(t *testing.T) *harness.Agent) {
	for _, r := range rows {
		t.Run(r.row.ID, func(t *testing.T) {
			t.Parallel()
			var a *harness.Agent
			if r.row.Skip == "" {
				a = newAgent(t)
			}
			chaosRunTrials(t, r.row, trials, func(t *testing.T, n int, tr *chaosTrial) { r.trial(t, a, n, tr) })
		})
	}
}

// chaosRunTrials runs trials of row one after another, each as a subtest,
// and records their outcomes. A row with Skip set is recorded and skipped.
func chaosRunTrials(t *testing.T, row chaosRow, trials int, trial func(t *testing.T, n int, tr *chaosTrial)) {
	if row.Skip != "" {
		chaosRecord(row, nil)
		t.Skip(row.Skip)
	}
	{
		for n := 1; n <= trials; n++ {
			tr := &chaosTrial{Takeover: -1, Recovery: -1}
			t.Run(fmt.Sprintf("trial%d", n), func(t *testing.T) {
				defer func() { tr.Failed = t.Failed() }()
				trial(t, n, tr)
			})
			tr.Failed = tr.Failed || t.Failed()
			chaosRecord(row, tr)
			t.Logf("row %s trial %d: overlaps=%d fences=%d takeover=%s recovery=%s lb_lost=%d failed=%v %s",
				row.ID, n, tr.Overlaps, tr.Fences, tr.Takeover, tr.Recovery, tr.LBLost, tr.Failed, tr.Note)
		}
	}
}

// chaosCheck is harness.CheckNoOverlap (which fails the test on any overlap
// or fence violation) plus the counts for the matrix.
func chaosCheck(t *testing.T, tr *chaosTrial, recs []harness.Record, sum harness.SampleSummary, known ...harness.KnownEnd) []harness.Interval {
	t.Helper()
	ivs := harness.CheckNoOverlap(t, recs, sum, known...)
	// Overlapping interval pairs; a sampler snapshot with two allocations'
	// workloads alive counts as one overlap if the records missed it.
	tr.Overlaps += max(len(harness.Overlaps(ivs)), min(1, len(sum.Over(1))))
	tr.Fences += len(harness.FenceViolations(ivs))
	tr.Overlaps += chaosDaemonOverlaps(t, recs, sum, known...)
	return ivs
}

// chaosDaemonOverlaps fails the test for every daemon (a workload's
// grandchild) whose life overlapped a process of another allocation; a
// SIGKILLed daemon's end comes from the sampler. Rows without daemons have
// none.
func chaosDaemonOverlaps(t *testing.T, recs []harness.Record, sum harness.SampleSummary, known ...harness.KnownEnd) int {
	t.Helper()
	var all []harness.Record
	daemons := map[string]bool{}
	for _, r := range recs {
		if r.Role == "child" {
			daemons[r.Instance] = true
			r.Role = harness.RoleMain
		}
		all = append(all, r)
	}
	if len(daemons) == 0 {
		return 0
	}
	n := 0
	for _, o := range harness.Overlaps(harness.Intervals(all, sum.GoneByPIDOr(known...))) {
		if o.A.AllocID != o.B.AllocID && (daemons[o.A.Instance] || daemons[o.B.Instance]) {
			t.Errorf("a daemon overlapped a process of another allocation for %s: %+v and %+v", o.For, o.A, o.B)
			n++
		}
	}
	return n
}

// TestChaos runs the fault matrix. Rows that only disturb their own job
// share a dev agent; rows that disturb the client itself (plugin kill,
// agent restart, agent pause), cut it off or elect leaders run side by
// side, each on a cluster of its own (chaosRunRowsApart); the node-death
// rows share one, one after another.
func TestChaos(t *testing.T) {
	t.Parallel()
	harness.SkipOutsideSmoke(t) // its agents start in its subtests
	trials := chaosTrials(t)
	harness.BuildTestWorkload(t)
	began := time.Now()
	load, _ := os.ReadFile("/proc/loadavg")
	t.Cleanup(func() {
		took := time.Since(began)
		harness.Measure(t, "chaos_total", took)
		if path := os.Getenv(chaosReportEnv); path != "" {
			if err := os.WriteFile(path, []byte(chaosReport(trials, took, strings.TrimSpace(string(load)))), 0o644); err != nil {
				t.Errorf("write %s: %v", path, err)
			} else {
				t.Logf("wrote %s", path)
			}
		}
	})

	t.Run("dev", func(t *testing.T) {
		t.Parallel()
		a := harness.StartAgent(t, drvAgentOptions(t, true))
		sem := make(chan struct{}, chaosConcurrency)
		var subs []subtest
		add := func(row chaosRow, trial func(t *testing.T, n int, tr *chaosTrial)) {
			subs = append(subs, subtest{row.ID, func(t *testing.T) {
				sem <- struct{}{}
				defer func() { <-sem }()
				chaosRunTrials(t, row, trials, trial)
			}})
		}
		for _, v := range []string{"driver", "lock", chaosDaemon} {
			for _, target := range []string{"workload", "supervisor", "both"} {
				row := chaosRow{ID: fmt.Sprintf("1-%s-%s", target, v), Variant: chaosVariantName(v),
					Fault: "SIGKILL of the " + map[string]string{"workload": "workload", "supervisor": "supervisor", "both": "supervisor and the workload together"}[target],
					Proves: map[string]string{
						"workload": "the supervisor sees its child die, releases at once, the standby takes over",
						"supervisor": map[string]string{
							"driver": "the workload dies with its supervisor (process-group guard); the plugin proves the task dead and releases on its behalf, so the standby takes over at once",
							"lock":   "the workload dies with its supervisor (process-group guard); nobody can release, so the standby takes over when the server expires the lock (2×TTL + delay)",
						}[v],
						"both": "no orphan, no overlap; the standby takes over",
					}[target]}
				if v == chaosDaemon {
					row.Proves = "the workload's daemon (its own session, SIGTERM ignored) is in the task cgroup: it is killed, and proven dead, before the lock is released; no process of the old allocation runs beside the new one"
				}
				add(row, func(t *testing.T, n int, tr *chaosTrial) { chaosKillTrial(t, a, v, target, n, tr) })
			}
			row := chaosRow{ID: "2-sigstop-" + v, Variant: chaosVariantName(v),
				Fault: "SIGSTOP of the supervisor past TTL, then SIGCONT",
				Proves: map[string]string{
					"driver": "the plugin's watchdog kills the workload by the fence deadline, before the server can expire the lock; after SIGCONT the old holder never runs again",
					"lock":   "the process-group guard kills the workload at the stop deadline (before server expiry); after SIGCONT the old holder never runs again",
				}[v]}
			if v == chaosDaemon {
				row.Proves = "the plugin's watchdog kills everything in the task cgroup, the workload's daemon included, by the fence deadline; after SIGCONT no process of the old holder runs again"
			}
			add(row, func(t *testing.T, n int, tr *chaosTrial) { chaosStopTrial(t, a, v, n, tr) })
		}
		add(chaosRow{ID: "2-sigstop-in-delay-lock", Variant: chaosVariantName("lock") + ", count = 3, ttl 10s, delay 10s, workloads that take 3s to stop",
			Fault: "SIGSTOP of the holder's `lock` just after a renew, SIGCONT inside [2×TTL, 2×TTL + delay] after it, while the server's expiry is pending",
			Proves: "the thawed holder leaves its lock to expire instead of releasing it (a release would let the pending expiry clear the next holder's lock, " +
				"and a third holder start beside it: 2.8s of overlap measured without the rule); the next holder takes over at the expiry (docs/expiry.md)"},
			func(t *testing.T, n int, tr *chaosTrial) {
				expiryFrozenTrial(t, a, "lock", chaosName("exp", "lock", n), tr)
			})
		for _, f := range chaosLBFaults {
			row := chaosRow{ID: "7-lb-" + f.name, Variant: chaosVariantName("driver") + " + LB",
				Fault:  "LB API " + f.desc + " during ADD and during REMOVE",
				Proves: "registration converges when the LB recovers; no upstream left for the dead holder; the unmanaged upstream is untouched"}
			add(row, func(t *testing.T, n int, tr *chaosTrial) { chaosLBTrial(t, a, f, n, tr) })
		}
		runConcurrently(t, subs)
	})

	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		var rows []chaosRowTrial
		for _, spec := range []chaosRowSpec{
			{ID: "3-plugin-kill", Variant: chaosDriverOf,
				Fault:  "SIGKILL of the plugin process",
				Proves: "Nomad relaunches the plugin, which recovers the task: same workload, same lock ID and fence, no failover",
				DaemonProves: "the workload's daemon (its own session, SIGTERM ignored) runs on in the task cgroup, untouched by the plugin's " +
					"recovery, and no process of another allocation starts",
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosPluginKillTrial(t, a, p[0], n, tr)
				}},
			{ID: "4-agent-restart-driver", Variant: chaosDriverOf,
				Fault:        "client agent stopped right after a renew and started again after the renew interval, within the fence deadline (TTL 20s, non-dev, data dir)",
				Proves:       "the supervisor rides out a failed renew and the plugin recovers the task: same workload, same lock ID, no failover",
				DaemonProves: "the workload's daemon runs on untouched, and no process of another allocation starts",
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosAgentRestartTrial(t, a, p[0], n, tr)
				}},
			{ID: "4-agent-restart-lock", Variant: chaosLockOf,
				Fault:        "client agent stopped and started again at once (non-dev, data dir)",
				Proves:       "`lock` rides out the Task API outage: same workload, no failover (asserted when the outage is under TTL/2 - margin)",
				DaemonProves: "the workload's daemon, re-parented to `lock` (a child subreaper), runs on untouched",
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosLockRestartTrial(t, a, p[1], n, tr)
				}},
			{ID: "5-agent-pause", Variant: chaosBothOf,
				Fault:        "client agent SIGSTOPped past TTL (Task API hangs), then SIGCONT",
				Proves:       "each holder self-fences by its deadline while the agent is frozen; after SIGCONT exactly one holder per job",
				DaemonProves: chaosSelfFenceDaemons + ", before the server can expire the lock",
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosAgentPauseTrial(t, a, p, n, tr)
				}},
		} {
			rows = append(rows, spec.rows()...)
		}
		rows = append(rows, chaosRowTrial{chaosRow{ID: "2-sigstop-in-delay-driver",
			Variant: chaosVariantName("driver") + ", count = 3, ttl 10s, delay 10s, workloads that take 3s to stop",
			Fault: "SIGSTOP of the holder's supervisor and of the plugin just after a renew; the plugin thawed inside [2×TTL, 2×TTL + delay] " +
				"after it, while the server's expiry is pending, then the supervisor",
			Proves: "the plugin's watchdog kills the frozen supervisor, and its crash release, judging by the last renew the supervisor recorded, " +
				"leaves the lock to expire (a release would let the pending expiry clear the next holder's lock: 2.9s of overlap measured without the rule); " +
				"the next holder takes over at the expiry (docs/expiry.md)"},
			func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
				expiryFrozenTrial(t, a, "driver", chaosName("exp", "driver", n), tr)
			}})
		rows = append(rows, chaosRowTrial{chaosRow{ID: "2-sigstop-in-delay-driver-plugin-restart",
			Variant: chaosVariantName("driver") + ", count = 3, ttl 10s, delay 10s, workloads that take 3s to stop",
			Fault: "SIGSTOP of the holder's supervisor and of the plugin just after a renew; the plugin SIGKILLed inside [2×TTL, 2×TTL + delay] " +
				"after it, while the server's expiry is pending: Nomad relaunches it",
			Proves: "the relaunched plugin recovers the task from its state dir, its watchdog kills the frozen supervisor, and its crash release, " +
				"judging by the last renew recorded there (CLOCK_BOOTTIME, shared by every process), leaves the lock to expire; " +
				"the next holder takes over at the expiry (docs/expiry.md)"},
			func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
				expiryFrozenTrial(t, a, "driver-restart", chaosName("exr", "driver", n), tr)
			}})
		gateRecords := chaosGateRecords(t)
		rows = append(rows, chaosRowTrial{chaosRow{ID: "2-sigstop-in-delay-gate",
			Variant: chaosGateKindName("raw_exec") + ", count = 3, ttl 10s, delay 10s, apps that take 3s to stop",
			Fault: "SIGSTOP of the holder's gate supervisor and of the plugin just after a renew; the plugin thawed inside [2×TTL, 2×TTL + delay] " +
				"after it, while the server's expiry is pending; the supervisor once the plugin's watchdog has killed it",
			Proves: "the plugin's watchdog kills the gated app and the frozen gate, and its crash release, judging by the last renew the gate " +
				"recorded, leaves the lock to expire instead of releasing it; the next gate's app starts at the expiry, never beside another (docs/expiry.md)"},
			func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
				expiryFrozenGateTrial(t, a, gateRecords, chaosName("exg", "gate", n), tr)
			}})
		chaosRunRowsApart(t, rows, trials, func(t *testing.T) *harness.Agent {
			return harness.StartAgent(t, drvAgentOptions(t, false))
		})
	})

	t.Run("partition", func(t *testing.T) {
		t.Parallel()
		fault := "client cut off from the server (its veth link down; server and two clients as separate agents, clients in network namespaces), count = 1, "
		proves := "each holder self-fences by its deadline while cut off; the replacement on the second client takes over only after that; "
		var d *harness.Docker
		records := ""
		daemonProves := chaosSelfFenceDaemons + ", so no process of the cut-off allocation runs beside the replacement"
		var rows []chaosRowTrial
		for _, spec := range []chaosRowSpec{
			{ID: "6-partition-stop", Variant: chaosBothOf,
				Fault: fault + fmt.Sprintf("stop_on_client_after = %s; healed once the replacement holds", chaosPartitionStopAfter),
				Proves: proves + "the cut-off client stops its allocations on its own; after the heal exactly one holder per job, the replacement. " +
					"Takeover is bound by Nomad: it places the replacement only at lost + stop_on_client_after + kill_timeout",
				DaemonProves: daemonProves,
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosPartitionTrial(t, a, chaosPartitionStopAfter, p, n, tr)
				}},
			{ID: "6-partition-lost", Variant: chaosBothOf,
				Fault: fault + "no disconnect block: Nomad replaces the allocation as soon as the node is down; healed once the replacement holds",
				Proves: proves + "only the lock keeps the old allocation (still running, cut off, waiting for the lock) and the replacement apart; " +
					"after the heal the old allocation is stopped and the replacement stays the one holder",
				DaemonProves: daemonProves,
				Trial: func(t *testing.T, a *harness.Agent, p [2]string, n int, tr *chaosTrial) {
					chaosPartitionTrial(t, a, 0, p, n, tr)
				}},
		} {
			rows = append(rows, spec.rows()...)
		}
		rows = append(rows, []chaosRowTrial{
			{chaosRow{ID: "8-gate-partition-docker", Variant: chaosGateKindName("docker"),
				Fault: fault + "no disconnect block; the gate's containers run in the host's network namespace (network_mode host) " +
					"and their client reaches dockerd by its socket, which the cut leaves alone; healed once the replacement holds",
				Proves: "the cut-off gate self-fences at its fence deadline and kills its app itself (paused, SIGKILLed, proven gone) " +
					"before the server can expire the lock; the replacement on the second client starts its app once the lock has " +
					"expired and the servers have lost the first client, without waiting for Nomad's report of the old app; " +
					"after the heal the replacement stays the one holder"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					chaosGatePartitionTrial(t, a, d, records, false, n, tr)
				}},
			{chaosRow{ID: "8-gate-partition-docker-nomad-service", Variant: chaosGateKindName("docker") + ", with a Nomad service (provider \"nomad\")",
				Fault: fault + "no disconnect block; as 8-gate-partition-docker, but the gated app registers a Nomad service; healed once the replacement holds",
				Proves: "the same as 8-gate-partition-docker, as fast: Nomad runs a task's pre-kill hooks before it kills it, and the " +
					"Nomad service deregistration there is an RPC to the servers that the cut-off client cannot reach (it blocks until " +
					"the connection fails), but the gate kills the app itself, without Nomad's client"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					chaosGatePartitionTrial(t, a, d, records, true, n, tr)
				}},
		}...)
		if skip := chaosPartitionSkip(); skip != "" {
			for _, r := range rows {
				r.row.Skip = skip
				chaosRunRow(t, r.row, trials, nil)
			}
			return
		}
		d, records = harness.StartDocker(t), chaosGateRecords(t)
		chaosRunRowsApart(t, rows, trials, func(t *testing.T) *harness.Agent {
			opts := chaosPartitionAgentOptions(t)
			opts.Docker = d
			return harness.StartAgent(t, opts)
		})
	})

	// Row 10: the holder's node dies, with and without lease mode
	// (docs/lease.md), on a server and two clients in network namespaces.
	t.Run("node-death", func(t *testing.T) {
		t.Parallel()
		fault := "every process of the holder's client (agent, plugin, supervisors, guards, workloads) SIGSTOPped at once, then SIGKILLed; " +
			"a driver job of count = 2, one allocation on each client (distinct_hosts), TTL 10s, delay 1s"
		var gateRecords string
		rows := []chaosRowTrial{
			{chaosRow{ID: "10-node-death-lease", Variant: "driver, lock { mode = \"lease\" } (default profile, L = 9s)",
				Fault: fault,
				Proves: "the standby's plugin sees the holder's heartbeat unchanged for L, seals it and releases the lock with the escrowed lock ID " +
					"while the server's expiry cannot have begun; the standby's workload starts in about L, no overlap (docs/lease.md)"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseNodeDeathTrial(t, a, leaseLockBlock, chaosName("ndl", "driver", n), tr)
				}},
			{chaosRow{ID: "10-node-death-lease-aggressive", Variant: "driver, lock { mode = \"lease\", lease_profile = \"aggressive\" } (L = 4s)",
				Fault:  fault,
				Proves: "as 10-node-death-lease, with R 500ms, D 2s, K 1s: the standby's workload starts in about 4 s, no overlap"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseNodeDeathTrial(t, a, aggressiveLockBlock, chaosName("nda", "driver", n), tr)
				}},
			{chaosRow{ID: "10-partition-lease", Variant: "driver, lock { mode = \"lease\" } (default profile, L = 9s)",
				Fault: "the holder's client cut off from the server and the other client (its veth link down), everything on it running; " +
					"a driver job of count = 2, one allocation on each client (distinct_hosts), TTL 10s, delay 1s",
				Proves: "the cut-off holder, alive, cannot write its heartbeat, fences itself D after the last acknowledged one and has " +
					"its workload dead by D + K; the standby takes over after L, never beside it"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseTrial(t, a, leasePartition, leaseLockBlock, chaosName("npl", "driver", n), tr)
				}},
			{chaosRow{ID: "10-node-death-lease-gate", Variant: "gate + raw_exec app, lock { mode = \"lease\" } (default profile, L = 9s)",
				Fault: strings.Replace(fault, "a driver job", "a gate job", 1),
				Proves: "as 10-node-death-lease for a gate: the standby gate's plugin takes the lock over after L, and the new gate, finding " +
					"the old heartbeat sealed, starts its app at once; no overlap on the apps' own records (docs/gate.md#lease-mode)"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseGateTrial(t, a, leaseNodeDeath, gateRecords, "raw_exec", chaosName("ndg", "gate", n), tr)
				}},
			{chaosRow{ID: "10-partition-lease-gate", Variant: "gate + raw_exec app, lock { mode = \"lease\" } (default profile, L = 9s)",
				Fault: "the gate holder's client cut off from the server and the other client (its veth link down), everything on it running; " +
					"a gate job of count = 2, one allocation on each client (distinct_hosts), TTL 10s, delay 1s",
				Proves: "the cut-off gate fences itself D after its last acknowledged heartbeat and kills its app itself by D + K; the standby " +
					"gate takes over after L, its app never beside the old one"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseGateTrial(t, a, leasePartition, gateRecords, "raw_exec", chaosName("npg", "gate", n), tr)
				}},
			{chaosRow{ID: "10-freeze-lease", Variant: "driver, lock { mode = \"lease\" } (default profile, L = 9s)",
				Fault: fmt.Sprintf("the holder's whole task frozen for %s, longer than L: its workload by the task's cgroup freezer, its supervisor and "+
					"process-group guard (outside that cgroup) by SIGSTOP; the client's agent and the plugin run on; then thawed", leaseFreezeFor),
				Proves: "the kill path that runs on time, the holder node's plugin watchdog, kills the frozen workload (SIGKILL, then a thaw of its cgroup) " +
					"once the published fence deadline (D after the last heartbeat) has passed, before the standby takes over; after the thaw " +
					"nothing of the old holder runs again. A freeze of every process of the node, the plugin included, is a pause of the whole " +
					"host: not covered, see docs/lease.md"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseTrial(t, a, leaseFreeze, leaseLockBlock, chaosName("nfz", "driver", n), tr)
				}},
			{chaosRow{ID: "10-node-death-lock", Variant: "driver, the plain lock", Fault: fault,
				Proves: "the baseline: the standby waits for the server to expire the lock (2×TTL + delay after the last renew); no overlap"},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseNodeDeathTrial(t, a, plainLockBlock, chaosName("ndp", "driver", n), tr)
				}},
		}
		if skip := chaosPartitionSkip(); skip != "" {
			for _, r := range rows {
				r.row.Skip = skip
				chaosRunRow(t, r.row, trials, nil)
			}
			return
		}
		// The rows share one cluster, one after another: each brings the
		// dead node back (its recovery is measured), and side by side they
		// would not shorten the suite (the longest chain is elsewhere).
		a := harness.StartAgent(t, leaseAgentOptions(t))
		gateRecords = chaosGateRecords(t)
		for _, r := range rows {
			chaosRunRow(t, r.row, trials, func(t *testing.T, n int, tr *chaosTrial) { r.trial(t, a, n, tr) })
		}
	})

	// Row 9: Nomad leader elections, on a cluster of three servers.
	t.Run("election", func(t *testing.T) {
		t.Parallel()
		a := harness.StartAgent(t, chaosElectionAgentOptions(t))
		chaosRunRow(t, chaosRow{ID: "9-leader-election", Variant: chaosBothOf(chaosPlain),
			Fault: fmt.Sprintf("the Raft leader of three servers SIGKILLed and started again with its data dir, %d times (the next once every "+
				"holder has renewed again), while the holders renew (TTL 10s, renew every %s), %d probes renew locks of their own every %s, and %d periodic jobs launch every %s", chaosElections, chaosElectionRenew, chaosProbes, chaosProbeEvery, chaosPeriodicJobs, chaosPeriodicEvery),
			Proves: "a healthy holder keeps its lock across leader elections (one workload start per job, same lock): " +
				"a renew that the new leader answers 409 before it has restored its lock timers is told apart from a real loss; no overlap"},
			trials, func(t *testing.T, n int, tr *chaosTrial) { chaosElectionTrial(t, a, n, tr) })
	})

	// Row 10, leader elections during a lease: three servers, one client.
	t.Run("lease-election", func(t *testing.T) {
		t.Parallel()
		fault := fmt.Sprintf("the Raft leader of three servers SIGKILLed and started again with its data dir, %d times (the next once a "+
			"heartbeat has been written since), while a lease-mode driver job of count = 2 on one client holds (TTL 10s, delay 1s)", leaseElections)
		var rows []chaosRowTrial
		for _, r := range []struct{ id, variant, block, proves string }{
			{"10-leader-election-lease", "driver, lock { mode = \"lease\" } (default profile, D = 6s, L = 9s)", leaseLockBlock,
				"an election shorter than D leaves the holder alone; one longer may fence it (a spurious fence, counted), and then the standby " +
					"takes over after L, cleanly; never two workloads at once"},
			{"10-leader-election-lease-aggressive", "driver, lock { mode = \"lease\", lease_profile = \"aggressive\" } (D = 2s, L = 4s)", aggressiveLockBlock,
				"as 10-leader-election-lease; with D = 2s most elections fence the holder (the profile's stated cost): every handover clean, no overlap"},
		} {
			rows = append(rows, chaosRowTrial{chaosRow{ID: r.id, Variant: r.variant, Fault: fault, Proves: r.proves},
				func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
					leaseElectionTrial(t, a, r.block, chaosName(map[bool]string{true: "lea", false: "led"}[r.block == aggressiveLockBlock], "driver", n), tr)
				}})
		}
		chaosRunRowsApart(t, rows, trials, func(t *testing.T) *harness.Agent {
			return harness.StartAgent(t, leaseElectionAgentOptions(t))
		})
	})

	// Row 8, a gate's tasks dead for good (issue 35): restarts of the
	// holder's gate, in lock and lease mode, one the restarted gate cannot
	// take over, and a gated app whose restart is pending at a loss; on a
	// dev agent of its own with a Docker engine and a release token.
	t.Run("gate-restart", func(t *testing.T) {
		t.Parallel()
		a, d := gateDockerAgent(t, true)
		records := chaosGateRecords(t)
		var subs []subtest
		add := func(row chaosRow, trial func(t *testing.T, n int, tr *chaosTrial)) {
			subs = append(subs, subtest{row.ID, func(t *testing.T) { chaosRunTrials(t, row, trials, trial) }})
		}
		variant := func(mode, kind string) string {
			return chaosGateKindName(kind) + map[string]string{"lock": "", "lease": `, lock { mode = "lease" }`}[mode] +
				`, the app's restart { delay = "15s" }`
		}
		for _, mode := range []string{"lock", "lease"} {
			for _, kind := range []string{"raw_exec", "docker"} {
				add(chaosRow{ID: "8-gate-restart-" + mode + "-" + strings.ReplaceAll(kind, "_", "-"), Variant: variant(mode, kind),
					Fault: "restart of the holder's gate (`nomad alloc restart <alloc> gate`), then a re-render of the gate's template " +
						"(`nomad var put` of the job variable it reads, change_mode restart); 45 s watched after each",
					Proves: "the gate keeps its lease and kills nothing; the restarted gate takes the lease over (same lock ID), the app runs " +
						"on unsignalled, the standby never starts its app (before, in lease mode: the app SIGKILLed, the lock released, and " +
						"Nomad's restart of the app 15 s later beside the next holder's: 29.1 s of two apps)"},
					func(t *testing.T, n int, tr *chaosTrial) { gateRestartTrial(t, a, d, records, mode, kind, n, tr) })
			}
		}
		for _, c := range []struct{ mode, kind string }{{"lock", "raw_exec"}, {"lease", "docker"}} {
			add(chaosRow{ID: "8-gate-restart-not-taken-over-" + c.mode + "-" + strings.ReplaceAll(c.kind, "_", "-"), Variant: variant(c.mode, c.kind),
				Fault: "restart of the holder's gate held back in its prestart (restart { render_templates = true }, the variable its " +
					"template reads deleted) past the kept lease's fence deadline, then the variable put back",
				Proves: "the plugin's warden stops the app at the fence deadline (its kill_signal, then SIGKILL), before the lock can pass; " +
					"the restarted gate finds no lease to take over and fails for good; the standby's app starts only once Nomad reports " +
					"the old app dead for good, and the old app never starts again"},
				func(t *testing.T, n int, tr *chaosTrial) {
					gateAdoptFailsTrial(t, a, d, records, c.mode, c.kind, n, tr)
				})
		}
		for _, kind := range []string{"raw_exec", "docker"} {
			add(chaosRow{ID: "8-gate-pending-restart-lock-lost-" + strings.ReplaceAll(kind, "_", "-"),
				Variant: chaosGateKindName(kind) + fmt.Sprintf(`, the group's shutdown_delay = %q, the app's restart { delay = %q }`,
					gatePendingGroupDelay, gatePendingRestart),
				Fault: fmt.Sprintf("the holder's app crashes on its own (SIGKILL); %s later, its restart pending, the lock is released "+
					"behind the holder's back", gatePendingLossAfter),
				Proves: "the gate kills nothing (nothing runs) and fails; Nomad restarts the app before its own kill of the allocation " +
					"(after the group's shutdown_delay) begins, and the warden kills it; the next gate starts its app only once Nomad " +
					"reports the old one dead for good (before: at once, beside the restarted app)"},
				func(t *testing.T, n int, tr *chaosTrial) { gatePendingRestartTrial(t, a, d, records, kind, n, tr) })
		}
		runConcurrently(t, subs)
	})

	// Row 8, the Docker engine frozen while the gate kills: it freezes
	// the engine the whole binary shares, so it runs here, before the
	// parallel groups, and only in `make chaos` (TestChaos alone; in
	// `make test` TestGateDockerdFrozen runs it, before the parallel tests).
	frozen := chaosRow{ID: "8-gate-dockerd-frozen-lock-lost-docker", Variant: chaosGateKindName("docker"),
		Fault: fmt.Sprintf("dockerd SIGSTOPped (its containers run on) and the lock released behind the holder's back; thawed %s later",
			gateDockerdFrozenFor),
		Proves: "the gate's kill hangs, is retried for 10 s and given up; the gate fails without a clean release; the next gate " +
			"waits for Nomad to report the old app dead, which the warden or Nomad's kill ends once the engine answers (before: " +
			"the next gate started at once, beside the old app)"}
	if os.Getenv(chaosReportEnv) == "" {
		frozen.Skip = "runs in `make chaos` alone (it freezes the Docker engine every test of the binary shares); `make test` runs TestGateDockerdFrozen"
	}
	t.Run("gate-engine", func(t *testing.T) {
		chaosRunTrials(t, frozen, trials, func(t *testing.T, n int, tr *chaosTrial) {
			a, d := gateDockerAgent(t, false)
			gateDockerdFrozenTrial(t, a, d, chaosGateRecords(t), n, tr)
		})
	})

	// Row 8: the gate, with a docker gated app (and raw_exec where the
	// fault is the gate's), on a dev agent of its own with a Docker engine.
	t.Run("gate", func(t *testing.T) {
		t.Parallel()
		d := harness.StartDocker(t)
		opts := drvAgentOptions(t, true)
		opts.Docker = d
		a := harness.StartAgent(t, opts)
		records := chaosGateRecords(t)
		sem := make(chan struct{}, chaosConcurrency)
		var subs []subtest
		for _, f := range chaosGateFaults {
			for _, kind := range f.kinds {
				row := chaosRow{ID: "8-gate-" + f.name + "-" + strings.ReplaceAll(kind, "_", "-"), Variant: chaosGateKindName(kind),
					Fault: f.fault, Proves: f.proves}
				subs = append(subs, subtest{row.ID, func(t *testing.T) {
					sem <- struct{}{}
					defer func() { <-sem }()
					chaosRunTrials(t, row, trials, func(t *testing.T, n int, tr *chaosTrial) {
						chaosGateTrial(t, a, d, records, f, kind, n, tr)
					})
				}})
			}
		}
		runConcurrently(t, subs)
	})
}

// chaosDaemon and chaosLockDaemon are the driver and `lock` running a
// workload that daemonizes (chaosDaemonArgs).
const (
	chaosDaemon     = "driver-daemon"
	chaosLockDaemon = "lock-daemon"
)

// chaosDaemonArgs: the workload's main process starts a grandchild in a
// session of its own that ignores SIGTERM, and both run until killed.
var chaosDaemonArgs = []string{"-children", "1", "-daemon", "-ignore-term"}

func chaosIsDaemon(v string) bool { return v == chaosDaemon || v == chaosLockDaemon }
func chaosIsDriver(v string) bool { return v == "driver" || v == chaosDaemon }

// chaosSelfFenceDaemons is what a self-fence does to daemons, for the rows
// whose fault cuts the supervisors off from the server.
const chaosSelfFenceDaemons = "the self-fence kills the daemons too, the driver's through the task cgroup, `lock`'s through its " +
	"subreaper tree: they ignore SIGTERM, so they get SIGKILL when the grace (kill_timeout, cut short by the stop deadline) runs out " +
	"(the self-fence measured is the holder's last process gone)"

// chaosRowTrial is a row and its trial, which runs on the agent a.
type chaosRowTrial struct {
	row   chaosRow
	trial func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial)
}

// chaosRowSpec is a row whose fault hits the driver, `lock` or both, and
// its twin with a daemonizing workload (chaosDaemonArgs): ID + "-daemon",
// run with the variants chaosDaemons instead of chaosPlain.
type chaosRowSpec struct {
	ID, Fault, Proves string
	// DaemonProves is what the twin proves besides Proves.
	DaemonProves string
	// Variant names the variant(s) the trial runs of its pair.
	Variant func(pair [2]string) string
	// Trial runs one trial on a with the driver variant pair[0] and the
	// lock variant pair[1] (each as the row needs).
	Trial func(t *testing.T, a *harness.Agent, pair [2]string, n int, tr *chaosTrial)
}

// chaosPlain and chaosDaemons are the (driver, lock) variant pairs.
var (
	chaosPlain   = [2]string{"driver", "lock"}
	chaosDaemons = [2]string{chaosDaemon, chaosLockDaemon}
)

// rows are the row and its daemonizing twin.
func (r chaosRowSpec) rows() []chaosRowTrial {
	var out []chaosRowTrial
	for _, pair := range [][2]string{chaosPlain, chaosDaemons} {
		row := chaosRow{ID: r.ID, Fault: r.Fault, Variant: r.Variant(pair), Proves: r.Proves}
		if pair == chaosDaemons {
			row.ID += "-daemon"
			row.Proves += "; " + r.DaemonProves
		}
		out = append(out, chaosRowTrial{row, func(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) { r.Trial(t, a, pair, n, tr) }})
	}
	return out
}

func chaosDriverOf(pair [2]string) string { return chaosVariantName(pair[0]) }
func chaosLockOf(pair [2]string) string   { return chaosVariantName(pair[1]) }
func chaosBothOf(pair [2]string) string {
	if pair == chaosDaemons {
		return "driver and lock, daemonizing workloads (same fault)"
	}
	return "driver and lock (same fault)"
}

func chaosVariantName(v string) string {
	name := "`lock` under raw_exec"
	if chaosIsDriver(v) {
		name = "singleton driver"
	}
	if chaosIsDaemon(v) {
		name += ", daemonizing workload"
	}
	return name
}

// chaosPartitionSkip says why row 6 cannot run here ("" if it can), as
// measured: it needs root, ip and nsenter, and must be able to create a
// network namespace. The probe runs once per test binary: tests that ask at
// the same time must not race on its namespace's name (one of them then
// skipped).
func chaosPartitionSkip() string {
	netnsProbe.Do(func() { netnsProbeSkip = probeNetns() })
	return netnsProbeSkip
}

var (
	netnsProbe     sync.Once
	netnsProbeSkip string
)

func probeNetns() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found (Debian packages iproute2, util-linux)"
		}
	}
	name := fmt.Sprintf("chaosprobe%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("`ip netns add` fails here: %v %s", err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("`ip netns delete` fails here: %v %s", err, strings.TrimSpace(string(out)))
	}
	return ""
}

// chaosSubject is one singleton job under test: the driver or `lock` under
// raw_exec, count=2, with a daemonizing workload or not.
type chaosSubject struct {
	variant string
	a       *harness.Agent
	drv     *drvJob  // driver
	sc      scenario // lock
}

// newChaosSubject starts the job; lockBlock optionally replaces the driver
// job's lock block.
func newChaosSubject(t *testing.T, a *harness.Agent, variant, name string, lockBlock ...string) *chaosSubject {
	return startChaosSubject(t, a, variant, name, 2, "", lockBlock...)
}

// startChaosSubject starts a job of count allocations with groupExtra
// (group-level HCL, e.g. a disconnect block) in its group.
func startChaosSubject(t *testing.T, a *harness.Agent, variant, name string, count int, groupExtra string, lockBlock ...string) *chaosSubject {
	s := &chaosSubject{variant: variant, a: a}
	var args []string
	if chaosIsDaemon(variant) {
		args = chaosDaemonArgs
	}
	if chaosIsDriver(variant) {
		s.drv = newDrvJob(t, name, count)
		s.drv.args = args
		s.drv.groupExtra = groupExtra
		if len(lockBlock) > 0 {
			s.drv.lockBlock = lockBlock[0]
		}
		s.drv.run(t, a)
	} else {
		s.sc = newScenario(t, name)
		g := s.sc.lockGroup(t, count, nil, args)
		g.extra = groupExtra
		a.RunJobHCL(t, jobHCL(s.sc.job, "service", g))
		t.Cleanup(func() { _ = a.Purge(s.sc.job) })
	}
	return s
}

func (s *chaosSubject) jobID() string {
	if s.drv != nil {
		return s.drv.id
	}
	return s.sc.job
}
func (s *chaosSubject) marker() string {
	if s.drv != nil {
		return s.drv.marker
	}
	return s.sc.marker
}
func (s *chaosSubject) recordPath() string {
	if s.drv != nil {
		return s.drv.record
	}
	return s.sc.record
}
func (s *chaosSubject) lockPath() string {
	if s.drv != nil {
		return s.drv.lockPath()
	}
	return s.sc.path
}

func (s *chaosSubject) records(t *testing.T) []harness.Record { return readRecords(t, s.recordPath()) }

// isWorkload selects the processes the sampler watches: the main workloads,
// and with a daemonizing workload the daemons too (two allocations'
// processes must never run at once).
func (s *chaosSubject) isWorkload(p harness.Proc) bool {
	if chaosIsDaemon(s.variant) {
		return p.IsTestWorkload()
	}
	return p.IsMainWorkload()
}

func (s *chaosSubject) sampler(t *testing.T) *harness.Sampler {
	return harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker(), Filter: s.isWorkload})
}

// workloads are the live processes isWorkload selects.
func (s *chaosSubject) workloads(t *testing.T) []harness.Proc {
	t.Helper()
	procs, err := harness.FindProcs(s.marker())
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(procs, func(p harness.Proc) bool { return !s.isWorkload(p) })
}

// watch returns the holder's processes, its main workload and, with a
// daemonizing workload, its daemon (waited for), once smp has seen them
// all: their exits are then dated by pidfds.
func (s *chaosSubject) watch(t *testing.T, smp *harness.Sampler, holder harness.Record) []harness.Record {
	t.Helper()
	procs := []harness.Record{holder}
	if chaosIsDaemon(s.variant) {
		procs = append(procs, harness.WaitRecord(t, s.recordPath(), 30*time.Second, func(r harness.Record) bool {
			return r.Event == harness.EventStart && r.Role == "child" && r.AllocID == holder.AllocID && r.Mono >= holder.Mono
		}))
	}
	smp.WaitSeen(t, 30*time.Second, chaosPIDs(procs)...)
	return procs
}

func chaosPIDs(recs []harness.Record) []int {
	pids := make([]int, len(recs))
	for i, r := range recs {
		pids[i] = r.PID
	}
	return pids
}

// holder waits until both allocations run, one workload holds the lock and
// the other allocation waits for it, and returns the holder's start record.
func (s *chaosSubject) holder(t *testing.T) harness.Record {
	t.Helper()
	s.a.WaitAllocs(t, s.jobID(), 2, api.AllocClientStatusRunning, 90*time.Second)
	first := waitMainStart(t, s.recordPath(), 90*time.Second, nil)
	if s.drv != nil {
		for _, id := range drvRunning(t, s.a, s.drv.id) {
			if id != first.AllocID {
				drvWaitEvent(t, s.a, id, 60*time.Second, "Waiting for lock", "held by alloc "+drvShort(first.AllocID))
			}
		}
		return first
	}
	// lock: both allocations' lock processes are up (one holds, one waits).
	deadline := time.Now().Add(60 * time.Second)
	for {
		procs, err := harness.FindProcs(s.marker())
		if err != nil {
			t.Fatal(err)
		}
		allocs := map[string]bool{}
		for _, p := range procs {
			if isLockExe(p) {
				allocs[p.AllocID] = true
			}
		}
		if len(allocs) >= 2 {
			return first
		}
		if time.Now().After(deadline) {
			t.Fatalf("want a lock process in each of 2 allocations, found %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// supervisor is the PID of the holder's supervisor (driver) or lock process.
func (s *chaosSubject) supervisor(t *testing.T, holder harness.Record) int {
	t.Helper()
	if s.drv != nil {
		return drvSupervisor(t, holder.AllocID).PID
	}
	lock, _ := lockOf(t, s.marker(), holder.PID)
	return lock.PID
}

// next waits for the start of a workload other than first.
func (s *chaosSubject) next(t *testing.T, first harness.Record, timeout time.Duration) harness.Record {
	t.Helper()
	return waitMainStart(t, s.recordPath(), timeout, func(r harness.Record) bool { return r.Instance != first.Instance })
}

// purge stops the job and waits (bounded) until its processes are gone, so
// the next trial starts on a quiet agent.
func (s *chaosSubject) purge(t *testing.T) {
	_ = s.a.Purge(s.jobID())
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		if procs, err := harness.FindProcs(s.marker()); err == nil && len(procs) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("processes of %s still alive 45s after the purge", s.jobID())
}

func chaosName(prefix, v string, n int) string {
	kind := v[:1]
	if chaosIsDaemon(v) {
		kind += "x"
	}
	return fmt.Sprintf("c%s-%s%d", prefix, kind, n)
}

// chaosKillTrial (row 1): SIGKILL the holder's workload, supervisor or both.
func chaosKillTrial(t *testing.T, a *harness.Agent, v, target string, n int, tr *chaosTrial) {
	s := newChaosSubject(t, a, v, chaosName("k"+target[:2], v, n))
	defer s.purge(t)
	first := s.holder(t)
	sup := s.supervisor(t, first)
	smp := s.sampler(t)
	s.watch(t, smp, first)

	at := harness.MonoNow()
	var pids []int
	switch target {
	case "workload":
		pids = []int{first.PID}
	case "supervisor":
		pids = []int{sup}
	default:
		pids = []int{sup, first.PID}
	}
	sigkillTogether(t, pids...)
	gone := drvWaitGone(t, first.PID, 10*time.Second)
	harness.Measure(t, "workload_gone_after_kill", time.Duration(gone-at))
	next := s.next(t, first, chaosTakeoverBound)
	tr.Takeover = time.Duration(next.Mono - at)
	if tr.Takeover > chaosTakeoverBound {
		t.Errorf("takeover %s, want < %s", tr.Takeover, chaosTakeoverBound)
	}
	time.Sleep(time.Second)
	chaosCheck(t, tr, s.records(t), smp.Stop(), harness.KnownEnd{PID: first.PID, Mono: gone})
}

// chaosStopTrial (row 2): SIGSTOP the holder's supervisor past TTL. The
// workload must be killed (watchdog or guard) before the standby starts;
// after SIGCONT the old holder must not run again.
func chaosStopTrial(t *testing.T, a *harness.Agent, v string, n int, tr *chaosTrial) {
	s := newChaosSubject(t, a, v, chaosName("stop", v, n))
	defer s.purge(t)
	first := s.holder(t)
	sup := s.supervisor(t, first)
	drvSIGCONTCleanup(t, sup)
	smp := s.sampler(t)
	s.watch(t, smp, first)

	at := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Not fatal: if nothing kills the workload, the standby starts once the
	// server expires the lock, and the overlap is what the matrix records.
	for waitUntil := time.Now().Add(2*drvTTL + 5*time.Second); drvAlive(first.PID) && time.Now().Before(waitUntil); {
		time.Sleep(10 * time.Millisecond)
	}
	gone := harness.MonoNow()
	if drvAlive(first.PID) {
		t.Errorf("the frozen holder's workload %d still runs %s after SIGSTOP", first.PID, time.Duration(gone-at))
		gone = 0
	} else {
		killed := time.Duration(gone - at)
		harness.Measure(t, "workload_killed_after_sigstop", killed)
		tr.Note = "workload killed " + harness.Millis(killed) + " after SIGSTOP"
	}
	next := s.next(t, first, chaosTakeoverBound)
	tr.Takeover = time.Duration(next.Mono - at)
	if gone != 0 && next.Mono < gone {
		t.Errorf("the standby started %s before the frozen holder's workload was gone", time.Duration(gone-next.Mono))
	}
	// Keep it frozen past TTL in any case, then thaw it.
	for time.Duration(harness.MonoNow()-at) < drvTTL+time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	contAt := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	recs := s.records(t)
	for _, r := range recs {
		if isMainStart(r) && r.Mono > contAt && r.Fence == first.Fence {
			t.Errorf("the old holder ran again with its old fence %s after SIGCONT: %+v", first.Fence, r)
		}
	}
	var known []harness.KnownEnd
	if gone != 0 {
		known = append(known, harness.KnownEnd{PID: first.PID, Mono: gone})
	}
	chaosCheck(t, tr, recs, smp.Stop(), known...)
}

// chaosPluginKillTrial (row 3): SIGKILL the plugin. No failover: the
// holder's processes, daemon included, run on untouched.
func chaosPluginKillTrial(t *testing.T, a *harness.Agent, v string, n int, tr *chaosTrial) {
	s := newChaosSubject(t, a, v, chaosName("pk", v, n))
	defer s.purge(t)
	first := s.holder(t)
	fence := drvFence(t, first)
	lockID := drvCheckLockHeld(t, a, s.lockPath(), first.AllocID, fence)
	agentPID := a.Client().PID()
	plugin := drvPlugin(t, agentPID, 0, 10*time.Second)
	smp := s.sampler(t)
	procs := s.watch(t, smp, first)
	at := harness.MonoNow()
	if err := syscall.Kill(plugin.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	drvPlugin(t, agentPID, plugin.PID, 90*time.Second)
	tr.Recovery = time.Duration(harness.MonoNow() - at)
	for time.Duration(harness.MonoNow()-at) < drvTTL+3*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	drvCheckOnlyPIDs(t, sum.Samples, first.AllocID, chaosPIDs(procs)...)
	if id := drvCheckLockHeld(t, a, s.lockPath(), first.AllocID, fence); id != lockID {
		t.Errorf("lock ID changed across the plugin kill")
	}
	recs := s.records(t)
	if st := drvStarts(recs); len(st) != 1 {
		t.Errorf("%d workload starts, want 1 (no failover)", len(st))
	}
	tr.Note = "plugin relaunched in " + harness.Millis(tr.Recovery)
	chaosCheck(t, tr, recs, sum)
}

// chaosAgentRestartTrial (row 4, driver): stop the client right after the
// holder's renew and start it again after the renew interval (TTL 20s: 10.3s
// later), within the fence deadline, so one renew fails and is retried.
// Same workload (daemon included), same lock ID, no failover.
func chaosAgentRestartTrial(t *testing.T, a *harness.Agent, v string, n int, tr *chaosTrial) {
	d := newChaosSubject(t, a, v, chaosName("rs", v, n), drvRestartLockBlock)
	defer d.purge(t)
	df := d.holder(t)
	dLock := drvCheckLockHeld(t, a, d.lockPath(), df.AllocID, drvFence(t, df))
	ds := d.sampler(t)
	procs := d.watch(t, ds, df)
	drvWaitRenew(t, a, df.AllocID, drvRestartTTL)
	at := harness.MonoNow()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Duration(at + int64(drvRestartDown) - harness.MonoNow()))
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	down := time.Duration(harness.MonoNow() - at)
	tr.Recovery = down
	tr.Note = "client down " + harness.Millis(down)
	if down >= drvRestartTTL-2*time.Second {
		t.Errorf("client down for %s, not within TTL - margin: the machine is too slow for this row", down)
	}
	for time.Duration(harness.MonoNow()-at) < drvRestartTTL/2+down+2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	drecs := d.records(t)
	if st := drvStarts(drecs); len(st) != 1 {
		t.Errorf("%d workload starts, want 1 (no failover)", len(st))
	}
	if id := drvCheckLockHeld(t, a, d.lockPath(), df.AllocID, drvFence(t, df)); id != dLock {
		t.Errorf("lock ID changed across the restart")
	}
	sum := ds.Stop()
	drvCheckOnlyPIDs(t, sum.Samples, df.AllocID, chaosPIDs(procs)...)
	chaosCheck(t, tr, drecs, sum)
}

// chaosLockRestartBound: a `lock` holder renews every TTL/2 and fences at
// TTL - margin (1s here) after its last renew, so a Task API outage shorter
// than TTL/2 - margin can never reach its fence, whatever the renew phase.
const chaosLockRestartBound = drvTTL/2 - time.Second

// chaosLockRestartTrial (row 4, lock): stop the client and start it again
// at once. `lock` cannot be timed against its renew from outside, so the
// no-failover assertion holds when the measured outage was under
// chaosLockRestartBound; a longer outage (slow machine) is reported.
func chaosLockRestartTrial(t *testing.T, a *harness.Agent, v string, n int, tr *chaosTrial) {
	l := newChaosSubject(t, a, v, chaosName("rs", v, n))
	defer l.purge(t)
	lf := l.holder(t)
	ls := l.sampler(t)
	procs := l.watch(t, ls, lf)
	at := harness.MonoNow()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	down := time.Duration(harness.MonoNow() - at)
	tr.Recovery = down
	for time.Duration(harness.MonoNow()-at) < drvTTL+down+2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	lrecs := l.records(t)
	starts := drvStarts(lrecs)
	tr.Note = fmt.Sprintf("client down %s (bound %s), %d workload start(s)", harness.Millis(down), chaosLockRestartBound, len(starts))
	switch {
	case down < chaosLockRestartBound && len(starts) != 1:
		t.Errorf("%d workload starts after only %s down, want 1 (no failover)", len(starts), down)
	case down >= chaosLockRestartBound && len(starts) != 1:
		tr.Note += ": the outage exceeded the bound, so a failover is allowed"
	}
	sum := ls.Stop()
	if len(starts) == 1 {
		drvCheckOnlyPIDs(t, sum.Samples, lf.AllocID, chaosPIDs(procs)...)
	}
	chaosCheck(t, tr, lrecs, sum)
}

// chaosAgentPauseTrial (row 5): SIGSTOP the client past TTL. Both holders
// (the driver's, variants[0], and `lock`'s, variants[1]) must self-fence
// (their workloads, daemons included, gone) while it is frozen; after
// SIGCONT each job has exactly one holder again.
func chaosAgentPauseTrial(t *testing.T, a *harness.Agent, variants [2]string, n int, tr *chaosTrial) {
	d := newChaosSubject(t, a, variants[0], chaosName("pa", variants[0], n))
	l := newChaosSubject(t, a, variants[1], chaosName("pa", variants[1], n))
	defer l.purge(t)
	defer d.purge(t)
	df, lf := d.holder(t), l.holder(t)
	ds, ls := d.sampler(t), l.sampler(t)
	dp, lp := d.watch(t, ds, df), l.watch(t, ls, lf)
	at := harness.MonoNow()
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = a.Resume()
		}
	}()
	known, fenced := chaosWaitSelfFence(t, at, dp, lp)
	for time.Duration(harness.MonoNow()-at) < drvTTL+5*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	contAt := harness.MonoNow()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	dn := d.next(t, df, chaosTakeoverBound)
	ln := l.next(t, lf, chaosTakeoverBound)
	tr.Takeover = time.Duration(max(dn.Mono, ln.Mono) - at)
	tr.Recovery = time.Duration(max(dn.Mono, ln.Mono) - contAt)
	tr.Note = "self-fenced after " + strings.Join(fenced, ", ") + " (driver, lock)"
	// Exactly one holder per job for a while after the thaw.
	time.Sleep(5 * time.Second)
	chaosCheck(t, tr, d.records(t), ds.Stop(), known...)
	chaosCheck(t, tr, l.records(t), ls.Stop(), known...)
}

// chaosWaitSelfFence watches the holders' processes (each holder's main
// workload and daemon, if any) after a fault at at that cuts their
// supervisors off from the server, and returns when each process was gone
// (for CheckNoOverlap) and, for each holder, how long after at its last one
// was, as text. A process still alive TTL + 10s after at fails the test:
// its holder did not self-fence.
func chaosWaitSelfFence(t *testing.T, at int64, holders ...[]harness.Record) ([]harness.KnownEnd, []string) {
	t.Helper()
	goneAt := map[int]int64{}
	for deadline := time.Now().Add(drvTTL + 10*time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := 0
		for _, procs := range holders {
			for _, p := range procs {
				if goneAt[p.PID] == 0 {
					if drvAlive(p.PID) {
						left++
					} else {
						goneAt[p.PID] = harness.MonoNow()
					}
				}
			}
		}
		if left == 0 {
			break
		}
	}
	var known []harness.KnownEnd
	var fenced []string
	for _, procs := range holders {
		var last int64
		for _, p := range procs {
			if goneAt[p.PID] == 0 {
				t.Errorf("workload %d (%s) of %s still runs %s after the fault: no self-fence", p.PID, p.Role, drvShort(p.AllocID), time.Duration(harness.MonoNow()-at))
				last = -1
				continue
			}
			known = append(known, harness.KnownEnd{PID: p.PID, Mono: goneAt[p.PID]})
			if last >= 0 {
				last = max(last, goneAt[p.PID])
			}
		}
		if last < 0 {
			fenced = append(fenced, "never")
		} else {
			fenced = append(fenced, harness.Millis(time.Duration(last-at)))
		}
	}
	return known, fenced
}

// chaosLBFault is one way the LB API misbehaves.
type chaosLBFault struct {
	name, desc string
	faults     lbapi.Faults
}

var chaosLBFaults = []chaosLBFault{
	{"down", "down (every connection dropped unanswered)", lbapi.Faults{DropRate: 1}},
	{"5xx", "answering 503", lbapi.Faults{ErrorRate: 1, ErrorStatus: 503}},
	{"slow", "slow past the request timeout (3s > 2s)", lbapi.Faults{Latency: 3 * time.Second}},
	{"garbage", "answering garbage bodies", lbapi.Faults{GarbageRate: 1}},
}

// chaosLBTrial (row 7): the fault is on while the holder ADDs, then cleared;
// an unmanaged upstream is added by an operator; the fault is on again while
// the holder is stopped (REMOVE) and the standby takes over; cleared again.
// At the end the service holds exactly the new holder and the unmanaged
// upstream.
func chaosLBTrial(t *testing.T, a *harness.Agent, f chaosLBFault, n int, tr *chaosTrial) {
	lb := lbStartServer(t)
	if err := lb.SetFaults(f.faults); err != nil {
		t.Fatal(err)
	}
	j := newLBJob(t, lb, fmt.Sprintf("c7%s%d", f.name, n), 2)
	j.run(t, a)
	defer func() { _ = a.Purge(j.id) }()
	first := j.lbHolder(t, a)
	fence1 := drvFence(t, first)
	up1 := lbUpstreamOf(t, a, first.AllocID)
	smp := j.sampler(t)
	// The ADD runs into the fault: wait until it has, however long the
	// health check took on this machine, rather than for 3 s.
	lbWaitLogCount(t, a, first.AllocID, "result unknown", 1, 60*time.Second)
	if err := lb.SetFaults(lbapi.Faults{}); err != nil {
		t.Fatal(err)
	}
	lbWaitSuccess(t, lb, lbAddID(first.AllocID, fence1), 90*time.Second)
	lbWaitUpstreams(t, lb, j.service, 30*time.Second, up1)

	unmanaged := chaosAddUnmanaged(t, lb, j.service)
	lbWaitUpstreams(t, lb, j.service, 10*time.Second, chaosSorted(up1, unmanaged)...)

	if err := lb.SetFaults(f.faults); err != nil {
		t.Fatal(err)
	}
	at := harness.MonoNow()
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatal(err)
	}
	next := j.waitStart(t, chaosTakeoverBound, func(r harness.Record) bool { return r.Instance != first.Instance })
	tr.Takeover = time.Duration(next.Mono - at)
	up2 := lbUpstreamOf(t, a, next.AllocID)
	lbWaitLogCount(t, a, next.AllocID, "result unknown", 1, 60*time.Second) // the new holder's ADD runs into the fault
	if err := lb.SetFaults(lbapi.Faults{}); err != nil {
		t.Fatal(err)
	}
	want := chaosSorted(up2, unmanaged)
	deadline := time.Now().Add(90 * time.Second)
	for !slices.Equal(lb.Upstreams(j.service), want) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	tr.Recovery = time.Duration(harness.MonoNow() - at)
	// Settle for a re-check interval, then judge.
	time.Sleep(lbRecheck + time.Second)
	got := lb.Upstreams(j.service)
	for _, u := range got {
		if !slices.Contains(want, u) {
			tr.LBLost++
			t.Errorf("upstream %s still registered (dead holder's or unknown); want %q", u, want)
		}
	}
	for _, u := range want {
		if !slices.Contains(got, u) {
			tr.LBLost++
			t.Errorf("upstream %s missing (holder's or unmanaged); have %q", u, got)
		}
	}
	chaosCheck(t, tr, j.records(t), smp.Stop())
}

func chaosSorted(s ...string) []string { slices.Sort(s); return s }

// chaosAddUnmanaged registers an upstream we do not manage, as an operator
// would, and returns its name.
func chaosAddUnmanaged(t *testing.T, lb *harness.LB, service string) string {
	t.Helper()
	svc, ups, _ := lbHTTPState(t, lb, service)
	if len(ups) == 0 {
		t.Fatalf("service %s has no upstream to copy", service)
	}
	var u map[string]any
	if err := json.Unmarshal(ups[0], &u); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("127.0.0.1:%d", 1+time.Now().Nanosecond()%999)
	id := fmt.Sprintf("operator-%s-%d", service, time.Now().UnixNano())
	u["upstream"], u["requestId"] = name, id
	lbOperatorPost(t, lb, id, svc, []any{u}, []any{})
	return name
}

// chaosReport renders the matrix as markdown.
func chaosReport(trials int, took time.Duration, load string) string {
	chaosResults.Lock()
	defer chaosResults.Unlock()
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Reliability: the fault matrix")
	p("")
	p("Generated by `make chaos` (e2e/chaos_test.go) on %s: %d trial(s) per row, %d CPUs, "+
		"load average at start %q, whole run %s. Do not edit by hand.", time.Now().UTC().Format("2006-01-02 15:04 MST"), trials, runtime.NumCPU(), load, took.Round(time.Second))
	p("")
	p("- [How a trial runs](#how-a-trial-runs)")
	p("- [The matrix](#the-matrix)")
	p("- [Found by the matrix](#found-by-the-matrix)")
	p("")
	p("## How a trial runs")
	p("")
	p("Every trial runs a count=2 singleton job (one holder, one standby; row 6: count=1, replaced on a second client; row 8: a gate holding the lock for a gated "+
		"docker or raw_exec app of its group, the docker app's PID 1 ignoring SIGTERM) on a real Nomad agent built from the pinned module, "+
		"lock TTL %s and delay %s. Each workload appends start/stop records with CLOCK_MONOTONIC timestamps, its alloc and its "+
		"NOMAD_LOCK_FENCE; a sampler scans /proc every few ms. **Overlaps** counts overlapping pairs of run intervals (at least 1 "+
		"if the sampler saw two allocations' workloads alive at once); **fence violations** counts handovers where the fence did not strictly "+
		"increase (harness.FenceViolations). **Takeover** is fault → first record of the next holder's workload "+
		"(median, min–max). **Recovery** is fault → plugin relaunched / agent ready / LB converged / new Raft leader (row 9: the slowest of the trial's elections), for rows without failover.",
		drvTTL, drvDelay)
	p("")
	p("## The matrix")
	p("")
	p("| Row | Fault | Variant | Trials (failed) | Overlaps | Fence violations | Takeover median (min–max) | Recovery median | LB state lost | What it proves |")
	p("|---|---|---|---|---|---|---|---|---|---|")
	ids := append([]string(nil), chaosResults.order...)
	slices.Sort(ids)
	for _, id := range ids {
		r := chaosResults.rows[id]
		if r.Row.Skip != "" {
			p("| %s | %s | %s | not run | – | – | – | – | – | **Cannot run here:** %s |", id, r.Row.Fault, r.Row.Variant, r.Row.Skip)
			continue
		}
		var ov, fv, lb, failed int
		var tk, rc []time.Duration
		var notes []string
		for _, tr := range r.Trials {
			ov += tr.Overlaps
			fv += tr.Fences
			lb += tr.LBLost
			if tr.Failed {
				failed++
			}
			if tr.Takeover >= 0 {
				tk = append(tk, tr.Takeover)
			}
			if tr.Recovery >= 0 {
				rc = append(rc, tr.Recovery)
			}
			if tr.Note != "" {
				notes = append(notes, tr.Note)
			}
		}
		proves := r.Row.Proves
		if len(notes) > 0 {
			proves += ". Measured: " + strings.Join(notes, "; ")
		}
		p("| %s | %s | %s | %d (%d) | %d | %d | %s | %s | %d | %s |", id, r.Row.Fault, r.Row.Variant, len(r.Trials), failed, ov, fv,
			chaosMedianRange(tk, "none (no failover)"), chaosMedianRange(rc, "–"), lb, proves)
	}
	p("")
	p("A failed trial is one whose assertions failed (see the test log); the matrix is only valid with 0 failed, 0 overlaps, 0 fence violations and 0 LB state lost.")
	p("")
	p("## Found by the matrix")
	p("")
	p("Found by this matrix: row 2 for `lock` (SIGSTOP of the supervisor) overlapped before the process-group guard enforced the " +
		"stop deadline: nothing killed the frozen holder's workload, which was still running 25s after SIGSTOP while the standby " +
		"had started at 20.6s (a 4.4s overlap). The guard is now re-armed after every renew and SIGKILLs the group on its own.")
	p("")
	p("Found by row 6: a driver supervisor that lost its lock (cut off) and had already tried to release it left its lease " +
		"record behind, so the plugin took its normal exit (code 76) for a crash, tried a release of its own for up to 10s " +
		"before reporting the task's exit, and showed \"Lock not released after supervisor crash\". The supervisor now drops " +
		"the record once it has tried; the row asserts that no such event appears.")
	p("")
	p("Found by row 8: a gated task with a Nomad service (provider \"nomad\") on a client cut off from the servers outlives the lock. The gate self-fences and fails on time, and Nomad's client starts killing the gated task (\"Sibling Task Failed\", \"Sent interrupt\"), but the client runs the task's pre-kill hooks first, and the Nomad service deregistration there is an RPC to the servers that blocks until the connection is declared dead (yamux keepalive, about 30s). Measured while developing the row: the old app was gone 41.6s after the cut, the replacement's app had started at 18.7s: a 22.9s overlap (3 of 3 trials). The next gate had taken the servers' \"lost\" for dead. Now, after a release it did not see marked clean, the next gate waits until Nomad's client reports the old holder's tasks dead, at most 2×TTL + delay, and 60s more when the group registers Nomad services: no overlap, at the price of a slower takeover on a partition (both partition rows above).")
	return b.String()
}

func chaosMedianRange(ds []time.Duration, none string) string {
	if len(ds) == 0 {
		return none
	}
	s := append([]time.Duration(nil), ds...)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf("%.2fs", med.Seconds())
	}
	return fmt.Sprintf("%.2fs (%.2f–%.2fs)", med.Seconds(), s[0].Seconds(), s[len(s)-1].Seconds())
}
