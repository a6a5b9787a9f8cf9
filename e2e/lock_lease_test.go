package e2e

// `lock -mode lease` (docs/cli.md#lease-mode--mode-lease): the holder half
// of lease mode in the lock binary.

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestLockLeaseStuckHolder: `lock -mode lease` escrows its lock ID and
// heartbeats; frozen (SIGSTOP), it writes no more heartbeats, and its
// process-group guard kills the command lease_fence + lease_kill_grace
// (8 s) after the last one, well before the lock's own bound would (TTL
// 20s: its fence deadline plus kill_timeout, over 20 s).
func TestLockLeaseStuckHolder(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true})
	s := newScenario(t, "lease-stuck")
	p := startPlainLock(t, a, []string{"-ttl", "20s", "-delay", "1s", "-mode", "lease", s.path}, s.workloadArgv(t)...)
	start := waitMainStart(t, s.record, 30*time.Second, nil)

	// The heartbeat advances, and the escrow holds the lock ID.
	seq := func() int {
		v, _, err := a.API().Variables().Peek(s.path+"/lease", nil)
		if err != nil || v == nil {
			t.Fatalf("heartbeat %s/lease: %v, %v", s.path, v, err)
		}
		n, _ := strconv.Atoi(v.Items["seq"])
		return n
	}
	first := seq()
	deadline := time.Now().Add(20 * time.Second)
	for seq() < first+2 {
		if time.Now().After(deadline) {
			t.Fatalf("the heartbeat's seq stayed at %d for 20s", first)
		}
		time.Sleep(200 * time.Millisecond)
	}
	lock := readLock(t, a, s.path)
	esc, _, err := a.API().Variables().Peek("singleton/escrow/"+s.path, nil)
	if err != nil || esc == nil || lock.Lock == nil || esc.Items["lock_id"] != lock.Lock.ID {
		t.Fatalf("escrow %+v (err %v), want the lock's ID", esc, err)
	}
	if !strings.Contains(p.Stderr(), "lease mode: heartbeat every 1s") {
		t.Errorf("lock did not print lease mode's timings at start; stderr:\n%s", p.Stderr())
	}

	stopAt := harness.MonoNow()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL); _ = p.Signal(syscall.SIGCONT) })
	gone := leaseWaitGone(t, start.PID, 40*time.Second)
	took := time.Duration(gone - stopAt)
	harness.Measure(t, "lock_lease_stuck_holder_workload_gone", took)
	if took > 15*time.Second {
		t.Errorf("the frozen lock's command was gone %s after the freeze, want by lease_fence + lease_kill_grace (8s) plus slack, "+
			"well before the lock's own bound (over 20s)", took)
	}
}
