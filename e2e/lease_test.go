package e2e

// Lease mode (docs/lease.md): the holder's whole node dies, and a standby
// on another node takes the lock over in about L = D + K + 1s (9 s by
// default), well before the server would expire it (2×TTL + delay after the
// last renew: 19 s or more with TTL 10s, delay 1s, renew every 2 s).

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// leaseTakeoverBound is a loose ceiling on the node-death takeover in lease
// mode: below the plain lock's expiry (at least 2×TTL + delay − the renew
// interval, 19 s), above L (9 s) with room for a busy machine.
const leaseTakeoverBound = 15 * time.Second

// TestLeaseNodeDeath: a lease-mode driver job with one allocation on each
// of two clients (network namespaces); every process of the holder's
// client (its agent, the plugin, the supervisors, the guards and the
// workloads) is frozen at once and then SIGKILLed, as a node dies. The
// standby's plugin must release the dead holder's lock with its escrowed
// ID, after the heartbeat went stale, and its workload start well before
// the lock's expiry; never two workloads at once.
func TestLeaseNodeDeath(t *testing.T) {
	t.Parallel()
	harness.Smoke(t)
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	tr := &chaosTrial{}
	leaseNodeDeathTrial(t, a, leaseLockBlock, "lease-nd", tr)
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the node died, want under %s (the plain lock's expiry is 19 s or more)", tr.Takeover, leaseTakeoverBound)
	}
}

// TestLeaseUnderACLs: node death of a lease-mode holder under ACLs, with
// the example policies (examples/acl/singleton-lease.policy.hcl for the
// job, singleton-release.policy.hcl for the plugin's release token): the
// holder escrows its lock ID with a write-only capability, the standby's
// plugin reads it with the release token, seals the heartbeat and releases.
// A token with the job's policy cannot read the escrow back.
func TestLeaseUnderACLs(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	opts := leaseAgentOptions(t)
	opts.ACLs = true
	a := harness.StartAgent(t, opts)
	secret := purgeReleaseToken(t, a)
	tokenFile := leaseTokenFile(t, opts)
	if err := os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var job, escrow string
	tr := &chaosTrial{}
	leaseNodeDeathTrial(t, a, leaseLockBlock, "lease-acl", tr, func(j *drvJob) {
		job, escrow = j.id, "singleton/escrow/"+j.lockPath()
		applyLeasePolicy(t, a, j.id, j.lockPath())
	})
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the node died, want under %s", tr.Takeover, leaseTakeoverBound)
	}

	jobToken := createToken(t, a, "lease-job", "singleton-lease-"+job)
	for _, c := range []struct {
		who, secret string
		readable    bool
	}{{"the job's policy (write only)", jobToken, false}, {"the release token", secret, true}} {
		cl, err := api.NewClient(&api.Config{Address: a.Addr(), SecretID: c.secret})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = cl.Variables().Peek(escrow, nil)
		if denied := err != nil && strings.Contains(err.Error(), "403"); denied == c.readable || (c.readable && err != nil) {
			t.Errorf("read of the escrow %s with %s: %v; want readable %v", escrow, c.who, err, c.readable)
		}
	}
}

// leaseTokenFile is the release_token_file of the plugin config in opts.
func leaseTokenFile(t *testing.T, opts harness.AgentOptions) string {
	t.Helper()
	_, rest, ok := strings.Cut(opts.Config[0], "release_token_file = \"")
	path, _, ok2 := strings.Cut(rest, "\"")
	if !ok || !ok2 {
		t.Fatalf("no release_token_file in the plugin config:\n%s", opts.Config[0])
	}
	return path
}

// applyLeasePolicy applies examples/acl/singleton-lease.policy.hcl to job,
// for the lock at path.
func applyLeasePolicy(t *testing.T, a *harness.Agent, job, path string) {
	t.Helper()
	f := examplePolicyFile(t, "singleton-lease.policy.hcl", "nomad/jobs/web/web/web/lock", path)
	a.Nomad(t, "acl", "policy", "apply", "-namespace", "default", "-job", job, "singleton-lease-"+job, f)
}

// leaseLockBlock and plainLockBlock are the lock blocks of the node-death
// trials: TTL 10s, delay 1s, with and without lease mode (default profile).
const (
	leaseLockBlock      = "ttl = \"10s\"\n          delay = \"1s\"\n          mode = \"lease\""
	aggressiveLockBlock = leaseLockBlock + "\n          lease_profile = \"aggressive\""
	plainLockBlock      = "ttl = \"10s\"\n          delay = \"1s\""
)

// leaseAgentOptions: a server and two clients in network namespaces, the
// singleton plugin with a release_token_file (without ACLs any non-empty
// token passes; the plugin still requires the file and sends the token
// only to its own agent).
func leaseAgentOptions(t *testing.T) harness.AgentOptions {
	t.Helper()
	harness.BuildTestWorkload(t)
	opts := drvAgentOptions(t, false)
	opts.Clients = 2
	opts.Netns = true
	leaseWithReleaseToken(t, &opts)
	return opts
}

// leaseWithReleaseToken adds a release_token_file to the plugin config of
// opts.
func leaseWithReleaseToken(t *testing.T, opts *harness.AgentOptions) {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "release.token")
	if err := os.WriteFile(tokenFile, []byte("operator-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plugin := opts.Config[0]
	opts.Config[0] = strings.Replace(plugin, "  config {\n", fmt.Sprintf("  config {\n    release_token_file = %q\n", tokenFile), 1)
	if opts.Config[0] == plugin {
		t.Fatalf("no config block in the plugin config:\n%s", plugin)
	}
}

// leaseFault is what happens to the holder's client in a lease trial.
type leaseFault int

const (
	// leaseNodeDeath: every process of the client frozen and killed at once.
	leaseNodeDeath leaseFault = iota
	// leasePartition: the client cut off from the server and the other
	// client (its link down); everything on it keeps running.
	leasePartition
	// leaseFreeze: the holder's task frozen (its cgroup freezer: the
	// workload; SIGSTOP: the supervisor and its process-group guard) for
	// leaseFreezeFor, longer than L, then thawed; the client's agent and
	// the plugin keep running.
	leaseFreeze
)

// leaseFreezeFor is how long leaseFreeze holds the task frozen: past L
// (9 s) and past the lock's fence deadline (TTL − margin).
const leaseFreezeFor = 15 * time.Second

// TestLeasePartition: the lease-mode holder's client is cut off, alive.
// The holder cannot write its heartbeat, fences itself D after the last
// acknowledged one and has its workload dead by D + K; the standby on the
// other client takes the lock over after L, never beside it.
func TestLeasePartition(t *testing.T) {
	t.Parallel()
	if why := chaosPartitionSkip(); why != "" {
		t.Skip(why)
	}
	a := harness.StartAgent(t, leaseAgentOptions(t))
	tr := &chaosTrial{}
	leaseTrial(t, a, leasePartition, leaseLockBlock, "lease-pt", tr)
	if tr.Takeover > leaseTakeoverBound {
		t.Errorf("takeover took %s after the cut, want under %s", tr.Takeover, leaseTakeoverBound)
	}
}

// leaseNodeDeathTrial is leaseTrial with the holder's node dying.
func leaseNodeDeathTrial(t *testing.T, a *harness.Agent, lockBlock, name string, tr *chaosTrial, prepare ...func(*drvJob)) {
	leaseTrial(t, a, leaseNodeDeath, lockBlock, name, tr, prepare...)
}

// leaseTrial runs a driver job of two allocations, one on each client,
// with lockBlock; kills the holder's node (leaseKillNode) or cuts it off;
// waits for the standby's workload; checks that no two workloads ever ran
// at once; then brings the node back and purges the job. tr.Takeover is
// the time from the fault to the standby's workload start.
func leaseTrial(t *testing.T, a *harness.Agent, fault leaseFault, lockBlock, name string, tr *chaosTrial, prepare ...func(*drvJob)) {
	j := newDrvJob(t, name, 2)
	j.lockBlock = lockBlock
	j.groupExtra = "constraint {\n      operator = \"distinct_hosts\"\n      value    = \"true\"\n    }"
	for _, p := range prepare {
		p(j)
	}
	j.run(t, a)
	t.Cleanup(func() { _ = a.Purge(j.id) })
	mode, l := "lock", ""
	switch {
	case strings.Contains(lockBlock, "aggressive"):
		mode, l = "lease_aggressive", "L = 4s"
	case strings.Contains(lockBlock, "lease"):
		mode, l = "lease", "L = 9s"
	}
	lease := l != ""

	s := &chaosSubject{variant: "driver", a: a, drv: j}
	holder := s.holder(t)
	node := chaosAllocNode(t, a, holder.AllocID)
	dead := a.ClientOf(node)
	if dead == nil {
		t.Fatalf("no client runs node %s", drvShort(node))
	}
	var standby string
	for _, id := range drvRunning(t, a, j.id) {
		if id != holder.AllocID {
			standby = id
		}
	}
	if standby == "" || chaosAllocNode(t, a, standby) == node {
		t.Fatalf("want the standby on the other client; allocations %v", drvRunning(t, a, j.id))
	}
	if lease {
		drvWaitEvent(t, a, standby, 30*time.Second, "Lease mode: ", l)
		// The standby bounds the holder's last renew from two heartbeat
		// changes it saw: let it see a few.
		time.Sleep(4 * time.Second)
	}

	smp := s.sampler(t)
	smp.WaitSeen(t, 30*time.Second, holder.PID)
	var at int64
	var known []harness.KnownEnd
	what := "node_death"
	switch fault {
	case leaseNodeDeath:
		var frozen []int
		at, frozen = leaseKillNode(t, dead)
		known = []harness.KnownEnd{{PID: holder.PID, Mono: leaseWaitGone(t, holder.PID, 10*time.Second)}}
		t.Logf("node death: froze and SIGKILLed %d processes of %s", len(frozen), dead.Name())
	case leaseFreeze:
		what = "freeze"
		var gone int64
		at, gone = leaseFreezeTask(t, holder, tr)
		if gone != 0 {
			known = []harness.KnownEnd{{PID: holder.PID, Mono: gone}}
		}
	case leasePartition:
		what = "partition"
		at = chaosCut(t, dead)
		// The holder self-fences: D + K after its last acknowledged
		// heartbeat (lease mode), or the lock's stop deadline.
		gone := leaseWaitGone(t, holder.PID, 2*drvTTL+10*time.Second)
		known = []harness.KnownEnd{{PID: holder.PID, Mono: gone}}
		harness.Measure(t, what+"_self_fence_"+mode, time.Duration(gone-at))
	}

	next := s.next(t, holder, chaosTakeoverBound)
	tr.Takeover = time.Duration(next.Mono - at)
	harness.Measure(t, what+"_takeover_"+mode, tr.Takeover)
	if next.AllocID != standby {
		t.Errorf("the new holder is %s, want the standby %s", drvShort(next.AllocID), drvShort(standby))
	}
	if lease && fault != leaseFreeze {
		drvWaitEvent(t, a, standby, 30*time.Second, "Took the lock over from a holder whose heartbeat stopped")
	}
	if fault == leaseFreeze {
		// The kill path that ran: the holder node's plugin watchdog.
		drvWaitEvent(t, a, holder.AllocID, 30*time.Second, "Lock lost: watchdog killed the workload")
		leaseThaw(t, s, holder, at, next)
	}

	sum := smp.Stop()
	chaosCheck(t, tr, s.records(t), sum, known...)

	// The node comes back, and the job is purged, so that nothing of it
	// outlives the trial.
	began := harness.MonoNow()
	switch fault {
	case leaseNodeDeath:
		if err := dead.Start(); err != nil {
			t.Fatal(err)
		}
	case leasePartition:
		if err := dead.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	if fault == leaseFreeze {
		tr.Recovery = -1
		s.purge(t)
		return
	}
	chaosWaitNodeReady(t, a, dead, 60*time.Second)
	tr.Recovery = time.Duration(harness.MonoNow() - began)
	s.purge(t)
	leaseWaitNodeQuiet(t, dead, 45*time.Second)
}

// leaseKillNode kills a client as a node dies (harness.Member.Die): every
// process in its network namespace frozen at once, then SIGKILLed. It
// returns when the freeze began (CLOCK_MONOTONIC ns) and the processes.
func leaseKillNode(t *testing.T, m *harness.Member) (int64, []int) {
	t.Helper()
	at, pids, err := m.Die()
	if at == 0 {
		t.Fatal(err)
	}
	if err != nil {
		t.Error(err)
	}
	return at, pids
}

// leaseWaitGone waits (up to timeout) until pid is gone and returns when
// it was seen gone (CLOCK_MONOTONIC ns).
func leaseWaitGone(t *testing.T, pid int, timeout time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		// Gone, or a zombie nobody has reaped yet: it runs no more.
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if _, rest, _ := strings.Cut(string(stat), ") "); err != nil || strings.HasPrefix(rest, "Z") {
			return harness.MonoNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("workload %d still alive %s after the fault", pid, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaseWaitNodeQuiet waits until no logmon (a helper of each allocation's
// tasks, stopped after the allocation) runs in the client's network
// namespace: the harness's clean-up counts one left as a leak.
func leaseWaitNodeQuiet(t *testing.T, m *harness.Member, timeout time.Duration) {
	t.Helper()
	agent := m.PID()
	ns, err := os.Readlink("/proc/" + strconv.Itoa(agent) + "/ns/net")
	if err != nil {
		t.Fatalf("%s: network namespace of agent %d: %v", m.Name(), agent, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var left []int
		for _, pid := range harness.NetnsPIDs(ns) {
			if argv, err := harness.ReadCmdline(pid); err == nil && slices.Contains(argv, "logmon") {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("%s: logmon processes %v still run %s after the purge", m.Name(), left, timeout)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
