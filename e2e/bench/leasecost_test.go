package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Nomad's Raft snapshot threshold (raft_snapshot_threshold, hashicorp/raft's
// DefaultConfig): a server snapshots once this many entries are in its log
// since the last snapshot, checked every 120 to 240 s.
const raftSnapshotThreshold = 8192

// Metrics of the leader, read from its Prometheus endpoint.
const (
	commitTimeSum   = "nomad_raft_commitTime_sum"   // ms
	commitTimeCount = "nomad_raft_commitTime_count" // entries committed
)

// leaseCostVariants: the plain lock (renews only, which touch no Raft log)
// and lease mode (the same lock, plus a heartbeat every second: one
// check-and-set variable write, that is one Raft entry, per lock and beat).
var leaseCostVariants = []string{VariantLockClient, VariantLeaseClient}

// leaseCostRows are the rows of one (N, variant).
type leaseCostRows struct {
	entries, leaderCPU, serversCPU, commit, snapshots, losses *Row
}

type leaseCostResult struct {
	entriesPerSec float64
	leaderPct     float64
	serversPct    float64
	commitSec     float64 // mean over the window
	losses        float64
}

// leaseCost measures what N leased locks cost the servers of a three-server
// cluster (section TitleLeaseCost), beside the same N plain locks.
func (b *bench) leaseCost(t *testing.T) {
	runs := min(b.cfg.Runs, 3)
	for _, n := range b.cfg.LeaseCost {
		m := func(s string) string { return fmt.Sprintf("N=%d: %s", n, s) }
		rows := map[string]*leaseCostRows{}
		for _, v := range leaseCostVariants {
			rows[v] = &leaseCostRows{}
		}
		for _, v := range leaseCostVariants {
			r := b.row(TitleLeaseCost, m("Raft entries at the leader"), v, PerSecond, AggStats, nil)
			if v == VariantLeaseClient {
				r.Note = fmt.Sprintf("expected %s: one heartbeat per lock and second", PerSecond.Format(float64(n)/lockclient.DefaultHeartbeat.Interval.Seconds()))
			}
			r.Planned, rows[v].entries = runs, r
		}
		for _, v := range leaseCostVariants {
			rows[v].leaderCPU = b.row(TitleLeaseCost, m("leader CPU (% of one core)"), v, Percent, AggStats, nil)
			rows[v].leaderCPU.Planned = runs
		}
		for _, v := range leaseCostVariants {
			rows[v].serversCPU = b.row(TitleLeaseCost, m("CPU of the three servers (% of one core)"), v, Percent, AggStats, nil)
			rows[v].serversCPU.Planned = runs
		}
		for _, v := range leaseCostVariants {
			r := b.row(TitleLeaseCost, m("Raft commit time (mean)"), v, Seconds, AggStats, nil)
			r.Note = "from the leader's dispatch of an entry to its commit by a quorum"
			r.Planned, rows[v].commit = runs, r
		}
		for _, v := range leaseCostVariants {
			r := b.row(TitleLeaseCost, m("Raft snapshots per hour (each server)"), v, Count, AggStats, nil)
			r.Note = fmt.Sprintf("entries per hour / %d (raft_snapshot_threshold)", raftSnapshotThreshold)
			r.NoRatio = true
			r.Planned, rows[v].snapshots = runs, r
		}
		for _, v := range leaseCostVariants {
			rows[v].losses = b.row(TitleLeaseCost, m("spurious losses and fences"), v, Count, AggSum,
				Zero("a healthy cluster under this load answers every renew and heartbeat well inside their deadlines."))
			rows[v].losses.Planned = runs
		}

		done := b.phase(fmt.Sprintf("%s N=%d", TitleLeaseCost, n))
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			a := harness.StartAgent(t, harness.AgentOptions{
				Servers:  3,
				LogLevel: "INFO",
				ServerConfig: []string{
					"telemetry {\n  prometheus_metrics = true\n}",
					"limits {\n  http_max_conns_per_client = 0\n}",
				},
			})
			for run := 1; run <= runs; run++ {
				// Alternate which variant goes first, so that neither
				// always runs on a cluster the other has warmed.
				for _, v := range rotate(leaseCostVariants, run-1) {
					res, err := b.leaseCostRun(t, a, n, v)
					if err != nil {
						t.Errorf("N=%d %s run %d: %v", n, v, run, err)
						continue
					}
					r := rows[v]
					add(r.entries, res.entriesPerSec)
					add(r.leaderCPU, res.leaderPct)
					add(r.serversCPU, res.serversPct)
					add(r.commit, res.commitSec)
					add(r.snapshots, res.entriesPerSec*3600/raftSnapshotThreshold)
					add(r.losses, res.losses)
					b.progress("lease cost N=%d %s run %d/%d: %s Raft entries, leader CPU %s, servers' CPU %s, commit %s, losses %.0f",
						n, v, run, runs, PerSecond.Format(res.entriesPerSec), Percent.Format(res.leaderPct),
						Percent.Format(res.serversPct), Seconds.Format(res.commitSec), res.losses)
				}
			}
		})
		done()
	}
}

// leaseCostRun holds n locks of variant v (lockclient leases in this
// process, against the first server's HTTP API) and measures the servers
// over one window.
func (b *bench) leaseCostRun(t *testing.T, a *harness.Agent, n int, v string) (leaseCostResult, error) {
	var res leaseCostResult
	prefix := fmt.Sprintf("bench/leasecost-%s-%d-%d", slug(v), n, b.seq.Add(1))
	logger := hclog.New(&hclog.LoggerOptions{Name: "bench-leasecost", Level: hclog.Error, Output: os.Stderr})
	host, _ := os.Hostname()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	leases := make([]*lockclient.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := fmt.Sprintf("%s/%d", prefix, i)
			cfg := lockclient.Config{
				Endpoint: lockclient.Endpoint{Address: a.Server().Addr()},
				Path:     path,
				Timing:   lockclient.Timing{TTL: TTL, LockDelay: LockDelay},
				Holder:   lockclient.Holder{JobID: "bench-leasecost", Hostname: host, PID: os.Getpid()},
				Logger:   logger,
			}
			if v == VariantLeaseClient {
				hb := lockclient.DefaultHeartbeat
				hb.Path, hb.EscrowPath = lockclient.HeartbeatPathFor(path), lockclient.EscrowPathFor(path)
				cfg.Heartbeat = &hb
			}
			l, err := lockclient.New(cfg)
			if err != nil {
				errs[i] = err
				return
			}
			leases[i], errs[i] = l.Acquire(ctx, lockclient.AcquireOptions{Wait: 2 * time.Minute})
		}()
	}
	wg.Wait()
	defer releaseAll(leases)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("not every lease acquired: %w", err)
	}

	// Leases acquired together renew in phase: start the window half a
	// renew period in, and make it a whole number of renew periods.
	time.Sleep(TTL / 4)
	window := max(b.cfg.Hold, 2*TTL/2)
	window = (window + TTL/2 - 1) / (TTL / 2) * (TTL / 2)

	leader := a.Leader()
	if leader == nil {
		return res, errors.New("no leader")
	}
	var pids []int
	for _, s := range a.Servers() {
		pids = append(pids, s.PID())
	}
	idx0, err := raftLastIndex(leader)
	if err != nil {
		return res, err
	}
	sum0, err := promValue(leader.Addr(), commitTimeSum)
	if err != nil {
		return res, err
	}
	cnt0, err := promValue(leader.Addr(), commitTimeCount)
	if err != nil {
		return res, err
	}
	lcpu, scpu := startCPU(leader.PID()), startCPU(pids...)
	h0 := harness.MonoNow()
	time.Sleep(window)
	res.leaderPct, res.serversPct = lcpu.percent(), scpu.percent()
	w := secondsOf(harness.MonoNow() - h0)
	if now := a.Leader(); now == nil || now.Addr() != leader.Addr() {
		return res, errors.New("the leader changed during the window")
	}
	idx1, err := raftLastIndex(leader)
	if err != nil {
		return res, err
	}
	sum1, err := promValue(leader.Addr(), commitTimeSum)
	if err != nil {
		return res, err
	}
	cnt1, err := promValue(leader.Addr(), commitTimeCount)
	if err != nil {
		return res, err
	}
	res.entriesPerSec = float64(idx1-idx0) / w
	res.commitSec = math.NaN() // no entry committed in the window
	if cnt1 > cnt0 {
		res.commitSec = (sum1 - sum0) / (cnt1 - cnt0) / 1000
	}
	for _, ls := range leases {
		select {
		case <-ls.Lost():
			res.losses++
			if res.losses == 1 {
				b.rep.Note("%s N=%d: a lease was lost: %v", v, n, ls.Err())
			}
		default:
		}
	}
	return res, nil
}

// raftLastIndex is the server's last Raft log index (agent/self stats).
func raftLastIndex(m *harness.Member) (uint64, error) {
	self, err := m.API().Agent().Self()
	if err != nil {
		return 0, fmt.Errorf("agent self of %s: %w", m.Addr(), err)
	}
	s := self.Stats["raft"]["last_log_index"]
	i, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("raft last_log_index %q of %s: %w", s, m.Addr(), err)
	}
	return i, nil
}
