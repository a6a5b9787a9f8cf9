package e2e

// Row 9 of the fault matrix: Nomad leader elections. Three servers form one
// Raft cluster; the leader is killed (SIGKILL) and started again with its
// data dir, at least chaosElections times, while a driver job and a `lock`
// job (count = 2 each) hold their locks and renew them through the client.
//
// Nomad v1.11.2 keeps a lock's TTL timer only in the leader's memory. A new
// leader opens for RPCs (establishLeadership: setConsistentReadReady) before
// it recreates the timers from the state store (restoreLockTTLTimers), and a
// renew that finds no timer is answered 409 "attempting to modify locked
// variable" (Variables.RenewLock): the same answer as for a lock whose TTL
// has expired. Besides the holders, probes renew locks of their own in a
// tight loop, to measure what a renew gets during an election.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

const (
	// chaosElections is how many times the leader is killed per trial.
	chaosElections = 10
	// chaosElectionBound bounds one election: kill → a new leader known.
	chaosElectionBound = 60 * time.Second
	// chaosProbes is the number of probe locks renewed in a tight loop.
	chaosProbes = 4
	// chaosProbeEvery is the pause between a probe's renews.
	chaosProbeEvery = 20 * time.Millisecond
	// chaosPeriodicJobs periodic jobs launch every chaosPeriodicEvery. A
	// new leader force-launches each launch it missed in
	// restorePeriodicDispatcher (a Raft apply each), between opening for
	// RPCs and restoring the lock timers: as on any cluster with periodic
	// jobs, that widens the window. Their allocations cannot be placed
	// (a constraint no node meets), so they load only the servers.
	chaosPeriodicJobs  = 10
	chaosPeriodicEvery = 2 * time.Second
	// chaosElectionRenew is the holders' renew interval in this row (TTL
	// 10s, fence margin 1s). A holder rides out a renew outage of up to
	// TTL - margin - renew interval: 7s here, against the 2 to 4.5s an
	// election takes on this cluster (kill → new leader). With the default
	// TTL/2 (4s of headroom) an election that lands just before a renew
	// can end the lease at its fence deadline, as it must.
	chaosElectionRenew = 2 * time.Second
)

// chaosElectionSubjects starts the row's driver and `lock` jobs (count = 2
// each), renewing every chaosElectionRenew.
func chaosElectionSubjects(t *testing.T, a *harness.Agent, n int) (d, l *chaosSubject) {
	d = newChaosSubject(t, a, "driver", chaosName("el", "driver", n),
		fmt.Sprintf("ttl = %q\n          delay = %q\n          renew = %q", drvTTL.String(), drvDelayHCL, chaosElectionRenew.String()))
	l = &chaosSubject{variant: "lock", a: a, sc: newScenario(t, chaosName("el", "lock", n))}
	a.RunJobHCL(t, jobHCL(l.sc.job, "service", l.sc.lockGroup(t, 2, []string{"-renew", chaosElectionRenew.String()}, nil)))
	t.Cleanup(func() { _ = a.Purge(l.sc.job) })
	return d, l
}

// chaosPeriodicHCL is a periodic batch job whose allocations no node can
// run.
func chaosPeriodicHCL(id string) string {
	return fmt.Sprintf(`job %q {
  type = "batch"
  periodic {
    crons            = ["*/%d * * * * * *"]
    prohibit_overlap = false
  }
  constraint {
    attribute = "${attr.kernel.name}"
    value     = "no-such-kernel"
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
      resources {
        cpu    = 10
        memory = 10
      }
    }
  }
}
`, id, int(chaosPeriodicEvery/time.Second))
}

// chaosElectionAgentOptions: three servers and one client with the plugin.
func chaosElectionAgentOptions(t *testing.T) harness.AgentOptions {
	opts := drvAgentOptions(t, false)
	opts.Servers = 3
	return opts
}

// probeStats counts what probe renews got.
type probeStats struct {
	mu       sync.Mutex
	renews   int // answered 200
	lastOK   map[int]time.Time
	errs     map[string]int
	spurious int // 409 while a read shows the lock still ours, unchanged
	lost     int // 409/404 and the lock is gone or another's
	notes    []string
}

func (p *probeStats) add(f func(p *probeStats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// chaosProbe acquires a lock of its own on path through the client's HTTP
// API (the path a Task API request takes) and renews it every
// chaosProbeEvery until ctx ends. After a 409 it reads the variable: a lock
// with our ID and the ModifyIndex of our acquire is a spurious 409 (the
// lock is still ours and nobody else can take it before it expires); the
// probe then goes on renewing. A lock that is gone or another's is a loss.
func chaosProbe(ctx context.Context, t *testing.T, cl *api.Client, i int, path string, ttl time.Duration, st *probeStats) {
	id := fmt.Sprintf("%08x-0000-4000-8000-%012x", rand.Uint32(), rand.Uint64()&0xffffffffffff)
	v := &api.Variable{Path: path, Items: api.VariableItems{"probe": "1"},
		Lock: &api.VariableLock{ID: id, TTL: ttl.String(), LockDelay: "1s"}}
	var got *api.Variable
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if got, _, err = cl.Variables().AcquireLock(v, nil); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("probe %s: acquire: %v", path, err)
			return
		}
	}
	fence := got.ModifyIndex
	for ctx.Err() == nil {
		rv := &api.Variable{Path: path, Lock: &api.VariableLock{ID: id}}
		_, _, err := cl.Variables().RenewLock(rv, (&api.WriteOptions{}).WithContext(ctx))
		var code int
		var ue api.UnexpectedResponseError
		if errors.As(err, &ue) {
			code = ue.StatusCode()
		}
		switch {
		case ctx.Err() != nil:
		case err == nil:
			now := time.Now()
			st.add(func(p *probeStats) {
				p.renews++
				if p.lastOK == nil {
					p.lastOK = map[int]time.Time{}
				}
				p.lastOK[i] = now
			})
		case code == http.StatusConflict || code == http.StatusNotFound:
			// As lockclient does: failed reads are retried for a while.
			var cur *api.Variable
			var rerr error
			for end := time.Now().Add(drvTTL / 4); ; time.Sleep(50 * time.Millisecond) {
				if cur, _, rerr = cl.Variables().Read(path, nil); rerr == nil || time.Now().After(end) {
					break
				}
			}
			held := rerr == nil && cur != nil && cur.Lock != nil && cur.Lock.ID == id && cur.ModifyIndex == fence
			at := time.Now().Format("15:04:05.000")
			st.add(func(p *probeStats) {
				if held {
					p.spurious++
					p.notes = append(p.notes, fmt.Sprintf("%s %s: renew %d (%s), the lock still ours", at, path, code, firstLine(err)))
				} else {
					p.lost++
					p.notes = append(p.notes, fmt.Sprintf("%s %s: renew %d (%s), the lock gone (read: %v %+v)", at, path, code, firstLine(err), rerr, cur))
				}
			})
			if !held {
				return
			}
		default:
			key := firstLine(err)
			if code != 0 {
				key = fmt.Sprintf("%d %s", code, key)
			}
			if i := strings.Index(key, "dial tcp"); i >= 0 {
				key = key[:i] + "dial tcp ..."
			}
			st.add(func(p *probeStats) {
				if p.errs == nil {
					p.errs = map[string]int{}
				}
				p.errs[key]++
			})
		}
		select {
		case <-ctx.Done():
		case <-time.After(chaosProbeEvery):
		}
	}
	_, _, _ = cl.Variables().ReleaseLock(&api.Variable{Path: path, Lock: &api.VariableLock{ID: id}}, nil)
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

// chaosElectionTrial (row 9): kill the leader chaosElections times while
// the holders renew. Each holder must keep its lock (one workload start per
// job, the same lock, no loss), and no two workloads of a job may overlap.
func chaosElectionTrial(t *testing.T, a *harness.Agent, n int, tr *chaosTrial) {
	d, l := chaosElectionSubjects(t, a, n)
	defer d.purge(t)
	defer l.purge(t)
	df, lf := d.holder(t), l.holder(t)
	dLock := drvCheckLockHeld(t, a, d.lockPath(), df.AllocID, drvFence(t, df))
	ds, ls := d.sampler(t), l.sampler(t)
	dprocs, lprocs := d.watch(t, ds, df), l.watch(t, ls, lf)

	for i := range chaosPeriodicJobs {
		id := a.RunJobHCL(t, chaosPeriodicHCL(fmt.Sprintf("periodic-%d-%d", n, i)))
		defer func() { _ = a.Purge(id) }()
	}

	// Probes renew through the client, as the Task API does.
	ctx, cancel := context.WithCancel(context.Background())
	var st probeStats
	var wg sync.WaitGroup
	for i := range chaosProbes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chaosProbe(ctx, t, a.Client().API(), i, fmt.Sprintf("e2e/probe/%s/%d", t.Name(), i), drvTTL, &st)
		}()
	}
	defer func() { cancel(); wg.Wait() }()

	var worst time.Duration
	began := time.Now()
	for e := 1; e <= chaosElections; e++ {
		old := chaosWaitLeader(t, a, nil)
		at := time.Now()
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		nl := chaosWaitLeader(t, a, old)
		took := time.Since(at)
		worst = max(worst, took)
		t.Logf("election %d: killed leader %s, new leader %s after %s", e, old.Name(), nl.Name(), took.Round(time.Millisecond))
		if err := old.Start(); err != nil {
			t.Fatal(err)
		}
		// The next election only once the cluster has settled: every
		// probe and the driver's holder renewed since the restart. Two
		// elections back to back are one long outage.
		restarted := time.Now()
		chaosWaitProbes(t, &st, restarted)
		drvWaitRenew(t, a, df.AllocID, drvTTL)
		// Land the next kill at a random phase of the holders' renews.
		time.Sleep(time.Duration(rand.Int64N(int64(chaosElectionRenew))))
	}
	elapsed := time.Since(began)
	// Every holder renews at least twice more on a settled cluster.
	time.Sleep(drvTTL + 2*time.Second)
	cancel()
	wg.Wait()

	drecs, lrecs := d.records(t), l.records(t)
	for _, j := range []struct {
		name string
		recs []harness.Record
	}{{"driver", drecs}, {"lock", lrecs}} {
		if starts := drvStarts(j.recs); len(starts) != 1 {
			t.Errorf("%s job: %d workload starts, want 1: a healthy holder lost its lock across the elections", j.name, len(starts))
		}
	}
	if id := drvCheckLockHeld(t, a, d.lockPath(), df.AllocID, drvFence(t, df)); id != dLock {
		t.Errorf("driver job: lock ID changed across the elections")
	}
	if v := drvLock(t, a, l.lockPath()); v.Lock == nil || v.ModifyIndex != fence(t, lf) {
		t.Errorf("lock job: lock %+v, ModifyIndex %d, want held with the holder's fence %d", v.Lock, v.ModifyIndex, fence(t, lf))
	}
	dsum, lsum := ds.Stop(), ls.Stop()
	drvCheckOnlyPIDs(t, dsum.Samples, df.AllocID, chaosPIDs(dprocs)...)
	drvCheckOnlyPIDs(t, lsum.Samples, lf.AllocID, chaosPIDs(lprocs)...)
	chaosCheck(t, tr, drecs, dsum)
	chaosCheck(t, tr, lrecs, lsum)

	// What the holders logged: `lock`'s and the supervisor's stderr.
	lockLog, drvLog := chaosTaskLog(t, a, l.jobID(), taskName), chaosTaskLog(t, a, d.jobID(), drvTask)
	renewFailed, conflicts := strings.Count(lockLog, "renew failed"), strings.Count(lockLog, "renew answered 409")
	drvFailed, drvConflicts := strings.Count(drvLog, "renew failed"), strings.Count(drvLog, "renew answered 409")
	// The least time to its fence deadline a holder logged on a failed renew.
	closest := time.Duration(-1)
	for _, m := range regexp.MustCompile(`fence_deadline_in=(\S+)`).FindAllStringSubmatch(lockLog+drvLog, -1) {
		if d, err := time.ParseDuration(m[1]); err == nil && (closest < 0 || d < closest) {
			closest = d
		}
	}
	for _, line := range strings.Split(lockLog+drvLog, "\n") {
		if strings.Contains(line, "409") || strings.Contains(line, "lost") {
			t.Log("holder: " + line)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, s := range st.notes {
		t.Log("probe: " + s)
	}
	for k, c := range st.errs {
		t.Logf("probe: %d× %s", c, k)
	}
	errs := 0
	for _, c := range st.errs {
		errs += c
	}
	if st.lost > 0 {
		t.Errorf("%d probe lock(s) lost across the elections", st.lost)
	}
	tr.Recovery = worst
	tr.Note = fmt.Sprintf("%d elections in %s, worst kill → new leader %s; probes: %d renews OK, %d spurious 409 (lock still ours), %d other errors, %d lost; "+
		"holders' logs (`lock`, driver): %d and %d failed renews, %d and %d renews answered 409 with the lock still ours; "+
		"closest to a fence deadline on a failed renew: %s",
		chaosElections, elapsed.Round(time.Second), harness.Millis(worst), st.renews, st.spurious, errs, st.lost, renewFailed, drvFailed, conflicts, drvConflicts, closest)
	harness.Measure(t, "election_worst", worst)
	harness.Measure(t, "election_probe_spurious_409", st.spurious)
}

// chaosWaitProbes waits (bounded) until every probe has renewed since.
func chaosWaitProbes(t *testing.T, st *probeStats, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(chaosElectionBound)
	for {
		st.mu.Lock()
		ok := len(st.lastOK) == chaosProbes
		for _, at := range st.lastOK {
			ok = ok && at.After(since)
		}
		st.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("probes did not all renew within %s of a server restart", chaosElectionBound)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chaosWaitLeader waits until a running server other than not names a
// leader other than not, and returns it.
func chaosWaitLeader(t *testing.T, a *harness.Agent, not *harness.Member) *harness.Member {
	t.Helper()
	deadline := time.Now().Add(chaosElectionBound)
	for {
		if m := a.Leader(); m != nil && m != not && m.Running() {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader within %s", chaosElectionBound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chaosTaskLog is the stderr of the job's task on the client, all allocations.
func chaosTaskLog(t *testing.T, a *harness.Agent, jobID, task string) string {
	allocs, _, err := a.API().Jobs().Allocations(jobID, true, nil)
	if err != nil {
		t.Logf("list allocations of %s: %v", jobID, err)
		return ""
	}
	var b strings.Builder
	for _, al := range allocs {
		files, _ := filepath.Glob(filepath.Join(a.Client().AllocDir(), al.ID, "alloc", "logs", task+".stderr.*"))
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil {
				b.Write(data)
			}
		}
	}
	return b.String()
}
