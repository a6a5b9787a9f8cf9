package e2e

// A plugin upgrade without failover: tasks started by the previous main's
// plugin keep their workloads and locks when the client agent restarts
// with today's plugin, which takes their supervision over.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// previousMainCommit is the plugin TestPluginUpgradeKeepsHolders starts
// its tasks with before it upgrades them to today's (bin/plugins): the last
// main that landed before the code under test. When a change lands on
// main, bump it to the main that change was merged onto (`git rev-parse
// origin/main` before the merge); once there are releases, to the newest
// release's commit, so that the test upgrades from what users run. It must
// be in the clone's history: CI clones with it, and a shallow clone fails
// the test with the fix (harness.BuildPluginAt).
const previousMainCommit = "aa8bd1d2d7ab9cae4f05ab8e5dd61d5ba8bc6be7"

const (
	// upgradePreviousVersion is the older build's shim.Version, which the
	// node's driver.singleton.version attribute shows while it runs.
	upgradePreviousVersion = "0.0.0-previous-main"
	// upgradeTTL is the jobs' TTL: a holder renews every TTL/2 and fences
	// TTL - margin after its last renew, so a client down for less than
	// TTL/2 - margin never costs a lock, whatever the renew phase (the
	// client's stop and start took 0.4 to 2 s on a loaded 2-core machine).
	upgradeTTL = 60 * time.Second
	// upgradeLeaseFence is the lease-mode job's lease_fence: a holder
	// fences itself once its heartbeats have failed that long
	// (docs/lease.md), and its heartbeats go through the client's Task
	// API. The restart takes under a second here when idle, but longer on
	// a loaded machine than the default's 6s.
	upgradeLeaseFence = 40 * time.Second
	// upgradeHandoverBound is a loose bound on a graceful handover after
	// the upgrade, from the holder's workload's end to the standby's start
	// (0.1 to 1.2 s for a driver task on a loaded 2-core machine; 4 to
	// 5.5 s for a gate, whose recovered app Nomad reports dead about 2 s
	// after its SIGINT and whose gate it kills about 2 s after that, where
	// an allocation the client never restarted takes 50 ms for each): a
	// supervisor that today's plugin could not stop would be killed and its
	// lock left to expire, 2×TTL + delay (121 s).
	upgradeHandoverBound = 20 * time.Second
)

// TestPluginUpgradeKeepsHolders: two clients run the plugin built from
// previousMainCommit. One of them runs a driver job, a lease-mode driver
// job (each a holder and a standby) and a gate's holder with its raw_exec
// app, whose standby runs on the other client. The plugin binary is
// replaced with today's and that client agent restarted, as an operator
// upgrades a node. No lock moves: each holder's workload runs on (same
// process, alone: records and sampler), each lock keeps its ID and fence,
// and the supervisors started by the older build run on and renew. Today's
// plugin takes their supervision over: it recovers them (its log), and a
// graceful stop of each holder's allocation afterwards still hands over to
// the standby at once, with the supervisor's own clean release, in task
// events that today's plugin relays.
//
// The gate's standby is on the other client because a client whose gate
// waits for the lock does not stop on SIGINT: the gate's StartTask returns
// only once it holds the lock, and Nomad's client waits for it before it
// shuts its plugins down, until it is killed (and then it tries to
// reattach to the old plugin process at its next start).
//
// It passes as long as today's plugin reads the task state the previous
// main wrote; a change of that format must keep it readable, or refuse it
// with an error that names the way out, never fail over in silence.
func TestPluginUpgradeKeepsHolders(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	current := harness.PluginBin(t)
	previous := harness.BuildPluginAt(t, previousMainCommit, upgradePreviousVersion)
	base := t.TempDir()
	pluginDir := filepath.Join(base, "plugins")
	pluginBin := filepath.Join(pluginDir, harness.PluginFileName)
	upgradeInstall(t, previous, pluginBin)

	opts := drvAgentOptions(t, false)
	opts.PluginDir = pluginDir
	opts.Clients = 2
	leaseWithReleaseToken(t, &opts)
	a := harness.StartAgent(t, opts)

	gate := newGateJobID(t, "gate-upgrade", "raw_exec", t.TempDir())
	gate.ttl = upgradeTTL.String()
	gate.groupExtra = drainDistinctHosts
	gate.run(t, a)
	t.Cleanup(func() { _ = a.Purge(gate.id) })
	subjects := []*upgradeSubject{{name: "gate", job: gate.singleton()}}
	subjects[0].before(t, a)
	client := a.ClientOf(chaosAllocNode(t, a, subjects[0].holder.AllocID))
	chaosSetEligible(t, a, a.ClientOf(chaosAllocNode(t, a, subjects[0].standby)), false)
	if v := upgradeDriverVersion(t, a, client); v != upgradePreviousVersion {
		t.Fatalf("%s runs plugin version %q, want the previous main's build %q", client.Name(), v, upgradePreviousVersion)
	}

	lockBlock := fmt.Sprintf("ttl = %q\n          delay = %q", upgradeTTL, drvDelayHCL)
	drv := newDrvJob(t, "upgrade", 2)
	drv.lockBlock = lockBlock
	lease := newDrvJob(t, "upgrade-lease", 2)
	lease.lockBlock = lockBlock + fmt.Sprintf("\n          mode = \"lease\"\n          lease_fence = %q", upgradeLeaseFence)
	drv.run(t, a)
	lease.run(t, a)
	for _, s := range []*upgradeSubject{{name: "driver", job: drv.singleton()}, {name: "lease", job: lease.singleton()}} {
		s.before(t, a)
		subjects = append(subjects, s)
	}
	old := drvPluginRunning(t, client.PID(), pluginBin, 0, 60*time.Second)

	// The upgrade, as an operator does it: stop the client, replace the
	// binary (by rename: the running supervisors keep the old file), start.
	logFrom := drvFileSize(client.LogPath())
	at := harness.MonoNow()
	if err := client.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Duration(harness.MonoNow() - at)
	harness.Measure(t, "upgrade_client_stop", stopped)
	if stopped >= harness.DefaultStopTimeout {
		t.Errorf("%s did not stop on SIGINT within %s and was killed", client.Name(), harness.DefaultStopTimeout)
	}
	upgradeInstall(t, current, pluginBin)
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	down := time.Duration(harness.MonoNow() - at)
	harness.Measure(t, "upgrade_client_down", down)
	if down >= upgradeTTL/2-2*time.Second {
		t.Errorf("%s was down for %s, not within TTL/2 - margin: the machine is too slow for this test", client.Name(), down)
	}
	if p := drvPluginRunning(t, client.PID(), pluginBin, old.PID, 60*time.Second); strings.HasSuffix(p.Exe, " (deleted)") {
		t.Fatalf("the restarted client runs the replaced plugin binary (%s, pid %d): no upgrade happened", p.Exe, p.PID)
	}
	for _, s := range subjects {
		drvWaitLog(t, client.LogPath(), logFrom, 60*time.Second, "recovered supervisor", s.holder.AllocID)
	}
	harness.Measure(t, "upgrade_recovered", time.Duration(harness.MonoNow()-at))
	upgradeWaitVersion(t, a, client, 60*time.Second)
	for _, s := range subjects {
		s.checkKept(t, a)
	}
	for _, s := range subjects {
		s.checkHandsOver(t, a)
	}
}

// upgradeSubject is one job of the upgrade test and what it looked like
// under the older plugin.
type upgradeSubject struct {
	name    string
	job     singletonJob
	holder  harness.Record
	standby string
	fence   uint64
	lockID  string
	sup     harness.Proc // the holder's supervisor
	smp     *harness.Sampler
}

// before waits for the holder and the standby under the older plugin and
// notes the lock and the holder's supervisor.
func (s *upgradeSubject) before(t *testing.T, a *harness.Agent) {
	t.Helper()
	s.holder = waitMainStart(t, s.job.record, 90*time.Second, nil)
	s.standby = s.job.waitStandby(t, a, "", s.holder.AllocID, 90*time.Second)
	s.fence = drvLock(t, a, s.job.lockPath).ModifyIndex
	s.lockID = drvCheckLockHeld(t, a, s.job.lockPath, s.holder.AllocID, s.fence)
	s.sup = drvSupervisor(t, s.holder.AllocID)
	s.smp = harness.StartSampler(t, harness.SamplerOptions{Marker: s.job.marker, Filter: harness.Proc.IsMainWorkload})
	s.smp.WaitSeen(t, 30*time.Second, s.holder.PID)
	t.Logf("%s: holder %s (supervisor %d, fence %d), standby %s", s.name, drvShort(s.holder.AllocID), s.sup.PID, s.fence, drvShort(s.standby))
}

// checkKept: after the upgrade the holder's supervisor of the older build
// still runs and renews, and nothing moved.
func (s *upgradeSubject) checkKept(t *testing.T, a *harness.Agent) {
	t.Helper()
	procs, err := harness.SupervisorProcs(s.holder.AllocID)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(procs, func(p harness.Proc) bool { return p.PID == s.sup.PID })
	if i < 0 || len(procs) != 1 {
		t.Errorf("%s: the holder's supervisors after the upgrade are %v, want the older build's %d alone", s.name, procs, s.sup.PID)
	} else if !strings.HasSuffix(procs[i].Exe, " (deleted)") {
		t.Errorf("%s: the holder's supervisor runs %s, want the replaced (older) binary: the test proves nothing", s.name, procs[i].Exe)
	}
	drvWaitRenew(t, a, s.holder.AllocID, upgradeTTL) // renews through the restarted client
	if id := drvCheckLockHeld(t, a, s.job.lockPath, s.holder.AllocID, s.fence); id != s.lockID {
		t.Errorf("%s: the lock ID changed across the upgrade", s.name)
	}
	if starts := drvStarts(readRecords(t, s.job.record)); len(starts) != 1 {
		t.Errorf("%s: %d workload starts across the upgrade, want the holder's alone: %+v", s.name, len(starts), starts)
	}
	evs, _ := a.TaskEvents(s.holder.AllocID, s.job.task)
	if lost := drvMatching(evs, "Lock lost"); len(lost) > 0 {
		t.Errorf("%s: the holder lost its lock across the upgrade:\n%s", s.name, drvFormatEvents(evs))
	}
	if n := len(drvMatching(evs, "Acquired lock")); n != 1 {
		t.Errorf("%s: %d Acquired events on the holder, want 1:\n%s", s.name, n, drvFormatEvents(evs))
	}
}

// checkHandsOver: a graceful stop of the holder's allocation, handled by
// today's plugin, hands the lock to the standby at once, and the records
// and sampler saw one workload at a time throughout.
func (s *upgradeSubject) checkHandsOver(t *testing.T, a *harness.Agent) {
	t.Helper()
	holder := s.holder.AllocID
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	next := waitMainStart(t, s.job.record, 60*time.Second, func(r harness.Record) bool { return r.AllocID != holder })
	if next.AllocID != s.standby {
		t.Errorf("%s: after the stop the workload started in %s, want the standby %s", s.name, drvShort(next.AllocID), drvShort(s.standby))
	}
	s.job.waitEvent(t, a, holder, 30*time.Second, "Released lock")
	ivs := harness.CheckNoOverlap(t, readRecords(t, s.job.record), s.smp.Stop())
	hs := harness.Handovers(ivs)
	if len(hs) != 1 {
		t.Fatalf("%s: %d handovers, want the stop's alone: %+v", s.name, len(hs), hs)
	}
	harness.Measure(t, "upgrade_then_stop_handover_"+s.name, hs[0].Gap)
	if hs[0].Gap > upgradeHandoverBound {
		t.Errorf("%s: the graceful stop after the upgrade left the lock without a workload for %s, want under %s", s.name, hs[0].Gap, upgradeHandoverBound)
	}
	evs, _ := a.TaskEvents(holder, s.job.task)
	if crash := drvMatching(evs, "on behalf of"); len(crash) > 0 {
		t.Errorf("%s: the plugin released the lock for a crashed supervisor, want the supervisor's own release:\n%s", s.name, drvFormatEvents(evs))
	}
	s.job.waitEvent(t, a, s.standby, 30*time.Second, "Acquired lock (fence ")
}

// upgradeInstall puts the binary src at dst as an upgrade does: a copy
// beside it, renamed over it, so that processes running the old file keep
// it (writing into a running binary fails with ETXTBSY).
func upgradeInstall(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	// Not in the plugin dir: Nomad launches every binary there.
	tmp, err := os.CreateTemp(filepath.Dir(filepath.Dir(dst)), "plugin-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(tmp, in); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		t.Fatal(err)
	}
}

// upgradeDriverVersion is the plugin version the client's node reports
// (the driver's driver.singleton.version attribute).
func upgradeDriverVersion(t *testing.T, a *harness.Agent, client *harness.Member) string {
	t.Helper()
	node, _, err := a.API().Nodes().Info(client.NodeID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := node.Drivers[harness.PluginDriverName]
	if d == nil {
		t.Fatalf("node %s has no %s driver", drvShort(client.NodeID()), harness.PluginDriverName)
	}
	return d.Attributes["driver.singleton.version"]
}

// upgradeWaitVersion waits until the client's node reports a plugin
// version other than the previous main's.
func upgradeWaitVersion(t *testing.T, a *harness.Agent, client *harness.Member, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := upgradeDriverVersion(t, a, client)
		if v != upgradePreviousVersion {
			t.Logf("plugin version %s → %s", upgradePreviousVersion, v)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still reports plugin version %q %s after its restart", client.Name(), v, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
