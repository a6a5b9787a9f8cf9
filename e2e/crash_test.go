package e2e

// Sub-second takeover after a supervisor crash on a live node: the plugin
// proves every process of the crashed holder's task is dead, then releases
// the lock with the lock ID the supervisor recorded, so a standby takes over
// at once instead of after 2×TTL + delay. Measured numbers are logged as
// `MEASURE name=value` lines.

import (
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// crashTakeoverBound is loose on purpose: the point is "not 2×TTL + delay".
// A takeover that waited for the server to expire the lock comes at least
// 2×TTL − TTL/2 + delay (16s here) after the kill, so TTL still tells the
// two apart, on a busy machine too. How fast it is (tens of ms) is for the
// log and `make bench`.
const crashTakeoverBound = drvTTL

// TestDriverCrashTakeover SIGKILLs the holder's supervisor on a live node.
func TestDriverCrashTakeover(t *testing.T) {
	t.Parallel()
	harness.Smoke(t)
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	runConcurrently(t, []subtest{
		{"supervisor_sigkill", func(t *testing.T) { testCrashTakeover(t, a, "crash", nil) }},
		// The workload ignores SIGTERM and has grandchildren, so only SIGKILL
		// of the whole group (guard, then the plugin's cgroup sweep) frees it.
		{"supervisor_sigkill_term_ignored", func(t *testing.T) {
			testCrashTakeover(t, a, "crashterm", []string{"-ignore-term", "-children", "2"})
		}},
	})
}

// crashJob starts a count=2 singleton job and waits until one alloc holds
// the lock and the other waits for it. It returns the holder's start record.
func crashJob(t *testing.T, a *harness.Agent, name string, args []string) (*drvJob, harness.Record) {
	t.Helper()
	j := newDrvJob(t, name, 2)
	j.args = args
	j.run(t, a)
	a.WaitAllocs(t, j.id, 2, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	for _, id := range drvRunning(t, a, j.id) {
		if id != first.AllocID {
			drvWaitEvent(t, a, id, 30*time.Second, "Waiting for lock", "held by alloc "+drvShort(first.AllocID))
		}
	}
	return j, first
}

func testCrashTakeover(t *testing.T, a *harness.Agent, name string, args []string) {
	j, first := crashJob(t, a, name, args)
	holder := first.AllocID
	fence1 := drvFence(t, first)
	sup := drvSupervisor(t, holder)
	// Every testworkload process of the job, grandchildren included: no two
	// allocations may ever have one alive at the same time.
	all := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsTestWorkload})
	mains := j.sampler(t)
	all.WaitSeen(t, 30*time.Second, first.PID)
	mains.WaitSeen(t, 30*time.Second, first.PID)

	killAt := harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, first.PID, 5*time.Second)
	harness.Measure(t, name+"_workload_gone_after_kill", time.Duration(gone-killAt))

	next := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	takeover := time.Duration(next.Mono - killAt)
	harness.Measure(t, name+"_takeover_after_supervisor_kill", takeover)
	if takeover > crashTakeoverBound {
		t.Errorf("standby took over %s after the supervisor was killed, want < %s (not 2×TTL + delay)", takeover, crashTakeoverBound)
	}
	if next.AllocID == holder {
		t.Errorf("the crashed alloc %s took the lock again; want the standby", drvShort(holder))
	}
	if f := drvFence(t, next); f <= fence1 {
		t.Errorf("fence did not increase: %d then %d", fence1, f)
	}
	drvWaitEvent(t, a, holder, 15*time.Second, "Released lock on behalf of crashed supervisor")

	time.Sleep(500 * time.Millisecond)
	sumAll, sumMain := all.Stop(), mains.Stop()
	if over := sumAll.Over(1); len(over) > 0 {
		t.Errorf("processes of two allocations were alive at once in %d samples (grandchildren included): %s", len(over), sumAll)
	}
	harness.CheckNoOverlap(t, j.records(t), sumMain, harness.KnownEnd{PID: first.PID, Mono: gone})
}

// TestDriverCrashWithPluginDown kills the plugin and then the holder's
// supervisor, so the supervisor dies while no plugin watches it. The
// relaunched plugin finds it gone in RecoverTask: it releases after proving
// the task dead, or leaves the lock to expire. Either way, never an overlap.
func TestDriverCrashWithPluginDown(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	a := harness.StartAgent(t, drvAgentOptions(t, true))
	j, first := crashJob(t, a, "crashplugin", []string{"-children", "1"})
	holder := first.AllocID
	sup := drvSupervisor(t, holder)
	plugin := drvPlugin(t, a.Client().PID(), 0, 10*time.Second)
	all := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsTestWorkload})
	mains := j.sampler(t)
	all.WaitSeen(t, 30*time.Second, first.PID)
	mains.WaitSeen(t, 30*time.Second, first.PID)

	killAt := harness.MonoNow()
	if err := syscall.Kill(plugin.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, first.PID, 5*time.Second)
	drvPlugin(t, a.Client().PID(), plugin.PID, 30*time.Second)

	next := j.waitStart(t, 2*drvTTL+drvDelay+10*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	takeover := time.Duration(next.Mono - killAt)
	harness.Measure(t, "crash_with_plugin_down_takeover", takeover)
	// The recovered plugin emits its event once Nomad has subscribed again,
	// which a busy machine may take a while to do. A takeover faster than
	// expiry is only explained by a release on behalf: its event must come.
	wait := 10 * time.Second
	if takeover < 2*drvTTL {
		wait = 60 * time.Second
	}
	released := false
	for deadline := time.Now().Add(wait); !released && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		released = len(drvMatching(drvEvents(t, a, holder), "Released lock on behalf of crashed supervisor")) > 0
	}
	t.Logf("takeover %s after killing plugin and supervisor; released on behalf by the recovered plugin: %v", takeover, released)
	if !released && takeover < 2*drvTTL {
		t.Errorf("takeover after %s without a release on behalf: faster than the server can expire the lock", takeover)
	}

	time.Sleep(500 * time.Millisecond)
	sumAll, sumMain := all.Stop(), mains.Stop()
	if over := sumAll.Over(1); len(over) > 0 {
		t.Errorf("processes of two allocations were alive at once in %d samples: %s", len(over), sumAll)
	}
	harness.CheckNoOverlap(t, j.records(t), sumMain, harness.KnownEnd{PID: first.PID, Mono: gone})
}
