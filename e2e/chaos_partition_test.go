package e2e

// Row 6 of the fault matrix: a client cut off from the server. The server
// and two clients run as separate agents, each client in a network
// namespace of its own joined to the server by a veth pair; the partition
// takes the holder's client's link down (harness.Member.Partition).

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

const (
	// chaosPartitionHeartbeat is the server's min_heartbeat_ttl and
	// heartbeat_grace: a cut-off client is marked down 10 to 15 s after its
	// last heartbeat, and its allocations are replaced then.
	chaosPartitionHeartbeat = 5 * time.Second
	// chaosPartitionStopAfter is the group's disconnect.stop_on_client_after
	// in the first variant of the row: the cut-off client stops the
	// allocations itself this long after its last heartbeat. Longer than
	// TTL, so that the self-fence (by the fence deadline) and the client's
	// stop are told apart. The server then places the replacement only
	// once the allocation is lost + this + kill_timeout (Nomad's
	// Allocation.WaitClientStop), so the takeover is bound by Nomad here.
	chaosPartitionStopAfter = 15 * time.Second
)

// chaosPartitionAgentOptions: a server and two clients in network
// namespaces, with the singleton plugin and short heartbeats.
func chaosPartitionAgentOptions(t *testing.T) harness.AgentOptions {
	opts := drvAgentOptions(t, false)
	opts.Clients = 2
	opts.Netns = true
	opts.HeartbeatTTL = chaosPartitionHeartbeat
	return opts
}

// chaosPartitionTrial (row 6): a driver job (variants[0]) and a `lock` job
// (variants[1]), count = 1 each, both placed on the first client (the second
// is ineligible until they run). The first client is cut off. Each holder
// must self-fence; the server marks the client down and places replacements
// on the second client, which take over once the server has expired the
// locks. With stopAfter (disconnect.stop_on_client_after), the cut-off
// client stops its allocations by itself; without it, they stay on the
// cut-off client (their supervisors waiting for the lock they lost) until
// the heal, and only the lock keeps them apart from the replacements. Then
// the link is healed: the first client comes back, stops what is left, and
// each job still has exactly one holder, the replacement.
func chaosPartitionTrial(t *testing.T, a *harness.Agent, stopAfter time.Duration, variants [2]string, n int, tr *chaosTrial) {
	cut, other := chaosPartitionClients(t, a)
	disconnect, prefix := "", "pl"
	if stopAfter > 0 {
		disconnect, prefix = fmt.Sprintf("disconnect {\n      stop_on_client_after = %q\n    }", stopAfter.String()), "ps"
	}
	d := startChaosSubject(t, a, variants[0], chaosName(prefix, variants[0], n), 1, disconnect)
	l := startChaosSubject(t, a, variants[1], chaosName(prefix, variants[1], n), 1, disconnect)
	defer l.purge(t)
	defer d.purge(t)
	df := waitMainStart(t, d.recordPath(), 90*time.Second, nil)
	lf := waitMainStart(t, l.recordPath(), 90*time.Second, nil)
	for _, h := range []harness.Record{df, lf} {
		if node := chaosAllocNode(t, a, h.AllocID); node != cut.NodeID() {
			t.Fatalf("holder %s runs on node %s, want %s (%s)", drvShort(h.AllocID), drvShort(node), drvShort(cut.NodeID()), cut.Name())
		}
	}
	chaosSetEligible(t, a, other, true)
	ds, ls := d.sampler(t), l.sampler(t)
	dp, lp := d.watch(t, ds, df), l.watch(t, ls, lf)

	markers := []string{d.marker(), l.marker()}
	gone := chaosWatchAllocsGone(t, markers, df.AllocID, lf.AllocID)
	at := chaosCut(t, cut)
	known, fenced := chaosWaitSelfFence(t, at, dp, lp)

	// The server expires each lock (up to 2×TTL after the last renew) and
	// the replacement on the other client acquires it after the delay.
	// Node down, then (with stopAfter) Nomad's wait for the client's own
	// stop (stopAfter + the longer kill_timeout of the two jobs, 6s), then
	// the lock's expiry.
	bound := chaosTakeoverBound + 3*chaosPartitionHeartbeat + stopAfter + 6*time.Second
	dn := d.next(t, df, bound)
	ln := l.next(t, lf, bound)
	tr.Takeover = time.Duration(max(dn.Mono, ln.Mono) - at)
	for _, h := range []harness.Record{dn, ln} {
		if node := chaosAllocNode(t, a, h.AllocID); node != other.NodeID() {
			t.Errorf("the new holder %s runs on node %s, want the second client %s", drvShort(h.AllocID), drvShort(node), drvShort(other.NodeID()))
		}
	}

	stopped := ""
	if stopAfter > 0 {
		// The cut-off client stops its allocations by itself: nothing of
		// them (supervisor, lock, guard, workload) is left, though no
		// server told it.
		stopped = "; the cut-off client stopped its allocations by itself, all their processes gone " +
			harness.Millis(time.Duration(gone(2*stopAfter+30*time.Second)-at)) + " after the cut"
	} else {
		// The old allocations live on, cut off, while the replacements
		// hold: no workload of theirs may run again (checked below), and
		// the heal must stop them.
		time.Sleep(5 * time.Second)
	}

	healAt := harness.MonoNow()
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	chaosWaitNodeReady(t, a, cut, 90*time.Second)
	tr.Recovery = time.Duration(harness.MonoNow() - healAt)
	if stopAfter == 0 {
		// The supervisors exit after the loss; Nomad may restart them (to
		// wait for the lock, cut off) until the healed client learns that
		// the allocations are lost.
		stopped = "; the old allocations' processes all gone " +
			harness.Millis(time.Duration(gone(60*time.Second)-at)) + " after the cut"
	}
	// Give the healed client time to learn its allocations' fate from the
	// server and act on it; the replacement must stay the only holder.
	time.Sleep(5 * time.Second)
	for _, c := range []struct {
		s      *chaosSubject
		holder harness.Record
	}{{d, dn}, {l, ln}} {
		v := readLock(t, a, c.s.lockPath())
		if v == nil || v.Lock == nil || v.Items["holder_alloc_id"] != c.holder.AllocID {
			t.Errorf("%s: after the heal the lock is %+v, want it held by the replacement %s", c.s.jobID(), v, drvShort(c.holder.AllocID))
		}
		for _, p := range c.s.workloads(t) {
			if p.AllocID != c.holder.AllocID {
				t.Errorf("%s: after the heal a workload process of alloc %s runs (pid %d), want only the replacement %s", c.s.jobID(), drvShort(p.AllocID), p.PID, drvShort(c.holder.AllocID))
			}
		}
	}
	// The supervisor tried to release by itself after the loss: the plugin
	// must not treat its exit as a crash (and delay the task's end by a
	// release of its own).
	drvWaitEvent(t, a, df.AllocID, 30*time.Second, "Lock lost") // synced by the healed client
	if evs := drvMatching(drvEvents(t, a, df.AllocID), "supervisor crash"); len(evs) > 0 {
		t.Errorf("the cut-off driver task reports a supervisor crash after a lock loss: %s", drvFormatEvents(evs))
	}
	// The healed client reports the end of its old allocations; a busy
	// machine takes a while, so wait for it (bounded) rather than assume it.
	ended := []string{api.AllocClientStatusLost, api.AllocClientStatusComplete, api.AllocClientStatusFailed}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var open []string
		for _, job := range []string{d.jobID(), l.jobID()} {
			allocs, err := a.Allocs(job)
			if err != nil {
				t.Fatal(err)
			}
			for _, al := range allocs {
				if (al.ID == df.AllocID || al.ID == lf.AllocID) && !slices.Contains(ended, al.ClientStatus) {
					open = append(open, fmt.Sprintf("%s is %q", drvShort(al.ID), al.ClientStatus))
				}
			}
		}
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("60s after the heal the cut-off holders' allocations are not lost, complete or failed: %s", strings.Join(open, ", "))
			break
		}
	}
	tr.Note = fmt.Sprintf("self-fenced after %s (driver, lock)%s; node ready %s after the heal",
		strings.Join(fenced, ", "), stopped, harness.Millis(tr.Recovery))
	chaosCheck(t, tr, d.records(t), ds.Stop(), known...)
	chaosCheck(t, tr, l.records(t), ls.Stop(), known...)
}

// chaosSetEligible marks a client's node eligible or ineligible for new
// allocations.
func chaosSetEligible(t *testing.T, a *harness.Agent, m *harness.Member, eligible bool) {
	t.Helper()
	if _, err := a.API().Nodes().ToggleEligibility(m.NodeID(), eligible, nil); err != nil {
		t.Fatalf("%s eligible=%t: %v", m.Name(), eligible, err)
	}
}

// chaosAllocNode is the node an allocation was placed on.
func chaosAllocNode(t *testing.T, a *harness.Agent, allocID string) string {
	t.Helper()
	al, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("alloc %s: %v", allocID, err)
	}
	return al.NodeID
}

// chaosWaitNodeReady waits until the server sees the client's node ready.
func chaosWaitNodeReady(t *testing.T, a *harness.Agent, m *harness.Member, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		node, _, err := a.API().Nodes().Info(m.NodeID(), nil)
		if err == nil && node.Status == api.NodeStatusReady {
			return
		}
		if time.Now().After(deadline) {
			status := "unknown"
			if node != nil {
				status = node.Status
			}
			t.Fatalf("%s: node %s is %s, not ready, after %s (err %v)", m.Name(), drvShort(m.NodeID()), status, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// chaosWatchAllocsGone watches, from now on, for the moment no process
// carrying one of the markers belongs to one of the allocations any more.
// The returned func waits up to timeout for that moment and returns it
// (CLOCK_MONOTONIC ns); past timeout it fails the test with what is left.
func chaosWatchAllocsGone(t *testing.T, markers []string, allocIDs ...string) func(timeout time.Duration) int64 {
	t.Helper()
	left := func() []string {
		var out []string
		for _, marker := range markers {
			procs, err := harness.FindProcs(marker)
			if err != nil {
				return []string{err.Error()}
			}
			for _, p := range procs {
				if slices.Contains(allocIDs, p.AllocID) {
					out = append(out, fmt.Sprintf("pid %d (alloc %s): %s", p.PID, drvShort(p.AllocID), strings.Join(p.Argv, " ")))
				}
			}
		}
		return out
	}
	done, stop := make(chan int64, 1), make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			if len(left()) == 0 {
				done <- harness.MonoNow()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func(timeout time.Duration) int64 {
		t.Helper()
		select {
		case at := <-done:
			return at
		case <-time.After(timeout):
			t.Fatalf("processes of the cut-off allocations still alive %s on:\n%s", timeout, strings.Join(left(), "\n"))
			return 0
		}
	}
}

// chaosCut cuts the client off and returns when (CLOCK_MONOTONIC ns). The
// trial heals it by itself; if it ends first, its clean-up heals it.
func chaosCut(t *testing.T, cut *harness.Member) int64 {
	t.Helper()
	at := harness.MonoNow()
	if err := cut.Partition(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cut.Partitioned() {
			if err := cut.Heal(); err != nil {
				t.Error(err)
			}
		}
	})
	return at
}

// chaosPartitionClients returns the client a partition trial cuts off and
// the other one, with the first ready and the other not eligible yet, so the
// holders start on the one that will be cut.
func chaosPartitionClients(t *testing.T, a *harness.Agent) (cut, other *harness.Member) {
	t.Helper()
	clients := a.Clients()
	cut, other = clients[0], clients[1]
	if cut.Partitioned() {
		t.Fatalf("%s is still partitioned from an earlier trial", cut.Name())
	}
	chaosWaitNodeReady(t, a, cut, 60*time.Second)
	chaosSetEligible(t, a, other, false)
	return cut, other
}
