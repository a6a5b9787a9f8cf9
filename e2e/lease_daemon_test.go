package e2e

// Lease mode's kill path for a holder stuck during a graceful stop (audit
// aa8bd1d, M1): its supervisor and process-group guard frozen, its
// workload's daemon (setsid, so in no process group of the workload's)
// still running. The heartbeat stops, a standby may release the lock
// D + K + 1 s after the last one, and only the node's plugin (its
// watchdog) can kill the daemon: it must be dead before the standby's
// workload starts.

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestLeaseFrozenStopKillsDaemons: a lease-mode driver job of two
// allocations whose workload starts a daemon (both ignore SIGTERM). The
// holder's allocation is stopped with a long kill_timeout; during the
// graceful stop its supervisor and guard are frozen (SIGSTOP), its
// workload and daemon run on. The daemon's last moment must come before
// the standby's workload's first. Two paths race: the holder's plugin
// (its watchdog kills the task cgroup just past the published stop
// deadline, D + K after the last heartbeat, then releases once the cgroup
// is proven empty) and the standby's takeover (L = D + K + 1 s after that
// heartbeat); the watchdog must win by a margin. The event says how far
// past the deadline it acted.
func TestLeaseFrozenStopKillsDaemons(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	opts := drvAgentOptions(t, false)
	leaseWithReleaseToken(t, &opts)
	a := harness.StartAgent(t, opts)

	s := &chaosSubject{variant: chaosDaemon, a: a, drv: newDrvJob(t, "lease-dmn", 2)}
	s.drv.args = chaosDaemonArgs
	s.drv.lockBlock = leaseLockBlock
	s.drv.killTimeout = "30s"
	s.drv.run(t, a)
	defer s.purge(t)
	holder := s.holder(t)
	var standby string
	for _, id := range drvRunning(t, a, s.drv.id) {
		if id != holder.AllocID {
			standby = id
		}
	}
	drvWaitEvent(t, a, standby, 30*time.Second, "Lease mode: ", "L = 9s")
	// The standby bounds the holder's last renew from two heartbeat
	// changes it saw: let it see a few.
	time.Sleep(4 * time.Second)
	smp := s.sampler(t)
	smp.WaitSeen(t, 30*time.Second, holder.PID)

	a.Nomad(t, "alloc", "stop", "-detach", holder.AllocID)
	drvWaitEvent(t, a, holder.AllocID, 30*time.Second, "Stopping workload with ")
	dir, _, _, _ := leaseTaskCgroup(t, holder.AllocID)
	in := leaseCgroupPIDs(dir)
	var frozen []int
	for _, pid := range leaseDescendants(drvSupervisor(t, holder.AllocID).PID) {
		if !in[pid] {
			frozen = append(frozen, pid)
		}
	}
	at := harness.MonoNow()
	for _, pid := range frozen {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Cleanup(func() {
		for _, pid := range frozen {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	t.Logf("SIGSTOPped the supervisor and its guard %v during the graceful stop; the workload and its daemon (cgroup %s: %v) run on",
		frozen, filepath.Base(dir), in)

	next := s.next(t, holder, chaosTakeoverBound)
	harness.Measure(t, "lease_frozen_stop_takeover", time.Duration(next.Mono-at))
	ev := drvWaitEvent(t, a, holder.AllocID, 30*time.Second, "Lock lost: watchdog killed the workload")
	t.Logf("the holder's plugin: %s", drvEventText(ev))
	sum := smp.Stop()
	tr := &chaosTrial{}
	recs := s.records(t)
	chaosCheck(t, tr, recs, sum)
	if tr.Overlaps != 0 {
		t.Fatalf("%d overlaps of the frozen holder's processes with the standby's", tr.Overlaps)
	}
	// The margin: the standby's first moment less the holder's daemon's
	// last (from the sampler).
	var daemon *harness.Record
	for i, r := range recs {
		if r.Role == "child" && r.AllocID == holder.AllocID && r.Event == harness.EventStart {
			daemon = &recs[i]
		}
	}
	if daemon == nil {
		t.Fatalf("no daemon start record of the holder %s", drvShort(holder.AllocID))
	}
	d := *daemon
	d.Role = harness.RoleMain
	for _, iv := range harness.Intervals([]harness.Record{d}, sum.GoneByPID()) {
		if !iv.Ended {
			t.Fatalf("the holder's daemon %d was never seen gone", iv.PID)
		}
		harness.Measure(t, "lease_frozen_stop_daemon_gone_before_standby", time.Duration(next.Mono-iv.End))
		t.Logf("the holder's daemon was gone %s before the standby's workload started",
			time.Duration(next.Mono-iv.End).Round(time.Millisecond))
	}
	if _, err := os.Stat(dir); err == nil && len(leaseCgroupPIDs(dir)) > 0 {
		t.Errorf("processes left in the holder's task cgroup: %v", leaseCgroupPIDs(dir))
	}
}
