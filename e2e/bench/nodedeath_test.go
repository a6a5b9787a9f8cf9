package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// nodeDeathVariants: `nomad var lock`, the driver's plain lock, and lease
// mode in its two profiles (docs/lease.md).
var nodeDeathVariants = []string{VariantAnchor, VariantDriver, VariantDriverLease, VariantDriverLeaseAggressive}

// nodeDeathGoal is the target for the lease variants.
func nodeDeathGoal(v string) *Goal {
	switch v {
	case VariantDriverLease:
		return MedianAtMost(10, Seconds, "L = D + K + 1 s = 9 s after the standby's first read of the last heartbeat (docs/lease.md)")
	case VariantDriverLeaseAggressive:
		return MedianAtMost(4.5, Seconds, "L = 4 s with lease_profile = \"aggressive\" (docs/lease.md)")
	}
	return nil
}

// nodeDeath measures the takeover when the holder's whole node dies
// (section TitleNodeDeath), on a server and two clients in network
// namespaces of their own.
func (b *bench) nodeDeath(t *testing.T) {
	if why := netnsSkip(); why != "" {
		b.rep.Note("%s was not measured: %s.", TitleNodeDeath, why)
		t.Skip(why)
	}
	take, over := map[string]*Row{}, map[string]*Row{}
	for _, v := range nodeDeathVariants {
		take[v] = b.row(TitleNodeDeath, "node death → new workload start", v, Seconds, AggStats, nodeDeathGoal(v))
		take[v].Planned = b.cfg.Runs
	}
	for _, v := range nodeDeathVariants {
		over[v] = b.row(TitleNodeDeath, "runs where the old workload was alive at the new start", v, Count, AggSum,
			Zero("the dead node's processes are SIGKILLed at the fault; none may outlive the takeover"))
		over[v].Planned = b.cfg.Runs
	}
	done := b.phase(TitleNodeDeath)
	defer done()

	opts := harness.SingletonAgentOptions(t, TTL.String(), LockDelay.String())
	opts.Clients, opts.Netns, opts.LogLevel = 2, true, "INFO"
	// Lease mode needs the plugin's release token (any, without ACLs).
	token := filepath.Join(t.TempDir(), "release.token")
	if err := os.WriteFile(token, []byte("operator-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plugin := opts.Config[0]
	opts.Config[0] = strings.Replace(plugin, "  config {\n", fmt.Sprintf("  config {\n    release_token_file = %q\n", token), 1)
	if opts.Config[0] == plugin {
		t.Fatalf("no config block in the plugin config:\n%s", plugin)
	}
	began := time.Now()
	prev := b.a
	b.a = harness.StartAgent(t, opts)
	defer func() { b.a = prev }()
	b.progress("a server and two clients in network namespaces ready in %s", time.Since(began).Round(time.Millisecond))

	for run := 1; run <= b.cfg.Runs; run++ {
		for _, v := range rotate(nodeDeathVariants, run-1) {
			t.Run(fmt.Sprintf("run%d/%s", run, slug(v)), func(t *testing.T) { b.nodeDeathRun(t, v, run, take[v], over[v]) })
		}
	}
}

func (b *bench) nodeDeathRun(t *testing.T, v string, run int, take, over *Row) {
	j := b.newJob("nd", v, 2)
	j.failFast, j.distinctHosts = true, true
	b.register(t, j)
	first := waitStart(t, j.record, 0, 90*time.Second)
	standby := b.waitStandbys(t, j, first.AllocID, 1, 1500*time.Millisecond, 90*time.Second)[0]
	if v == VariantDriverLease || v == VariantDriverLeaseAggressive {
		// The standby's plugin bounds the holder's last renew from two
		// heartbeat changes it saw: let it see a few.
		b.waitEvent(t, standby, "Lease mode: ", 30*time.Second)
		time.Sleep(3 * time.Second)
	}
	al, _, err := b.a.API().Allocations().Info(first.AllocID, nil)
	if err != nil {
		t.Fatal(err)
	}
	victim := b.a.ClientOf(al.NodeID)
	if victim == nil {
		t.Fatalf("no client runs node %s", short(al.NodeID))
	}
	if v == VariantAnchor {
		time.Sleep(randomPhase(TTL * 11 / 10))
	} else {
		time.Sleep(randomPhase(TTL / 2))
	}

	exited := b.watchWorkloadExit(t, j, first)
	at, _, err := victim.Die()
	if at == 0 {
		t.Fatal(err)
	}
	if err != nil {
		t.Error(err)
	}
	next := waitStart(t, j.record, at, 90*time.Second)
	death, died := exited.Wait(10 * time.Second)
	overlap := !died || death > next.Mono
	if next.AllocID != standby {
		t.Errorf("the new holder is %s, want the standby %s", short(next.AllocID), short(standby))
	}
	add(take, secondsOf(next.Mono-at))
	if overlap {
		add(over, 1)
		b.rep.Note("%s, node death run %d: the old workload (pid %d) was alive when the new holder's workload started.", v, run, first.PID)
	} else {
		add(over, 0)
	}
	b.progress("node death %s run %d/%d: takeover %s, overlap %t", v, run, b.cfg.Runs, fmtS(next.Mono-at), overlap)

	// The node comes back; the job is purged, and nothing of it is left.
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		node, _, err := b.a.API().Nodes().Info(victim.NodeID(), nil)
		if err == nil && node.Status == api.NodeStatusReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready 60 s after its restart (err %v)", victim.Name(), err)
		}
	}
	if left := b.stopJob(t, j, 45*time.Second); left > 0 {
		b.rep.Note("%s, node death run %d: %d process(es) of the job were still alive 45 s after the job was purged; the bench SIGKILLed them.", v, run, left)
	}
	waitNoLogmon(t, victim, 45*time.Second)
}

// waitEvent waits (bounded) for a task event of allocID containing sub.
func (b *bench) waitEvent(t testing.TB, allocID, sub string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		al, _, err := b.a.API().Allocations().Info(allocID, nil)
		if err == nil {
			if ts := al.TaskStates[taskName]; ts != nil && slices.ContainsFunc(ts.Events, func(e *api.TaskEvent) bool {
				return strings.Contains(e.DisplayMessage, sub) || strings.Contains(e.Message, sub)
			}) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: no task event %q within %s (err %v)", short(allocID), sub, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNoLogmon waits (bounded) until no logmon (a helper of each
// allocation's tasks, stopped after the allocation) runs in the client's
// network namespace: the harness's clean-up counts one left as a leak.
func waitNoLogmon(t testing.TB, m *harness.Member, timeout time.Duration) {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", m.PID()))
	if err != nil {
		t.Logf("%s: network namespace: %v", m.Name(), err)
		return
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		left := slices.ContainsFunc(harness.NetnsPIDs(ns), func(pid int) bool {
			argv, err := harness.ReadCmdline(pid)
			return err == nil && slices.Contains(argv, "logmon")
		})
		if !left {
			return
		}
	}
	t.Logf("%s: logmon processes still run %s after the purge", m.Name(), timeout)
}

// netnsSkip says why clients in network namespaces cannot run here, or "".
func netnsSkip() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found (Debian packages iproute2, util-linux)"
		}
	}
	return ""
}
