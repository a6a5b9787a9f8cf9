package e2e

// `lock status` and `lock list` under ACLs, with the tokens an operator
// has at hand: the job's workload identity (write on the lock path) and a
// token with read on it alone. Nomad shows the lock to management tokens
// only; held and free come from what the project writes and what Nomad
// answers (docs/cli.md, "How Held is known").

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// statusJSON is what the test reads of `lock status -json` (schema 1).
type statusJSON struct {
	Schema int
	Locks  []struct {
		Path, Mode, State, Basis string
		Fence                    uint64
		Holder                   *struct{ Alloc_ID string }
		Heartbeat                *struct{ Seq uint64 }
	}
}

// TestLockStatusACL: while a plain lock is held, the workload identity sees
// it held and a read-only token sees it unknown (never held, never free);
// while a lease-mode lock is held, both see it held; once released, both
// see them free. lock list shows the same. No lock ID and no token appear
// in any output.
func TestLockStatusACL(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{ACLs: true})
	plain, lease := newScenario(t, "status-plain"), newScenario(t, "status-lease")
	applyLockPolicy(t, a, plain.job, plain.path)
	applyLeasePolicy(t, a, lease.job, lease.path)
	readOnly := readOnlyToken(t, a, plain.path, lease.path, lease.path+"/lease")

	// Each job: its lock's group, and an idle task whose workload identity
	// (the job's policies apply to every task of it) outlives the holder's
	// stop.
	idle := group{name: "idle", command: "/bin/sleep", args: []string{"3600"}, identityFile: true}
	gPlain := plain.lockGroup(t, 1, nil, nil)
	gLease := lease.lockGroup(t, 1, []string{"-mode", "lease"}, nil)
	gPlain.failFast, gLease.failFast = true, true
	a.RunJobHCL(t, jobHCL(plain.job, "service", gPlain, idle))
	a.RunJobHCL(t, jobHCL(lease.job, "service", gLease, idle))
	t.Cleanup(func() { _, _ = a.Purge(plain.job), a.Purge(lease.job) })
	plainStart := waitMainStart(t, plain.record, 60*time.Second, nil)
	leaseStart := waitMainStart(t, lease.record, 60*time.Second, nil)
	identity, leaseIdentity := idleIdentity(t, a, plain.job), idleIdentity(t, a, lease.job)
	lockIDs := []string{}
	for _, p := range []string{plain.path, lease.path} {
		if v := readLock(t, a, p); v.Lock != nil && v.Lock.ID != "" {
			lockIDs = append(lockIDs, v.Lock.ID)
		}
	}
	if len(lockIDs) != 2 {
		t.Fatalf("lock IDs %v: want both locks held", lockIDs)
	}
	secrets := append([]string{identity, leaseIdentity, readOnly, a.Token()}, lockIDs...)

	held := []struct {
		name, token string
		s           scenario
		start       harness.Record
		want        string
	}{
		{"plain, workload identity", identity, plain, plainStart, "held"},
		{"plain, read-only token", readOnly, plain, plainStart, "unknown"},
		{"lease mode, workload identity", leaseIdentity, lease, leaseStart, "held"},
		{"lease mode, read-only token", readOnly, lease, leaseStart, "held"},
	}
	for _, tc := range held {
		st := statusAs(t, a, tc.token, secrets, tc.s.path)
		l := st.Locks[0]
		if l.State != tc.want || l.Holder == nil || l.Holder.Alloc_ID != tc.start.AllocID || fmt.Sprint(l.Fence) != tc.start.Fence {
			t.Errorf("%s, while held: %+v (basis %q); want %s by %s at fence %s", tc.name, l, l.Basis, tc.want, drvShort(tc.start.AllocID), tc.start.Fence)
		}
		if tc.s == lease && (l.Mode != "lease" || l.Heartbeat == nil || l.Heartbeat.Seq == 0) {
			t.Errorf("%s: mode %q, heartbeat %+v; want lease mode and its heartbeat", tc.name, l.Mode, l.Heartbeat)
		}
		text := runLockAs(t, a, tc.token, secrets, "status", tc.s.path)
		wantRow := map[string]string{"held": "true", "unknown": "unknown"}[tc.want]
		if !strings.Contains(text, "Held ") || !strings.Contains(text, "= "+wantRow+"\n") {
			t.Errorf("%s: lock status says:\n%s\nwant Held = %s", tc.name, text, wantRow)
		}
	}
	for _, token := range []string{identity, readOnly} {
		list := listAs(t, a, token, secrets, "nomad/jobs/"+plain.job)
		if len(list.Locks) != 1 || list.Locks[0].Path != plain.path || list.Locks[0].State == "free" {
			t.Errorf("lock list -prefix nomad/jobs/%s: %+v; want its one lock, not free", plain.job, list.Locks)
		}
	}

	// Both holders stopped (their group scaled to 0: no replacement); each
	// releases, and says so in its record.
	for _, s := range []scenario{plain, lease} {
		waitDeployed(t, a, s.job) // Nomad scales no job during a deployment
		a.Nomad(t, "job", "scale", "-detach", s.job, "g", "0")
	}
	for _, s := range []scenario{plain, lease} {
		waitReleased(t, a, s.path, 60*time.Second)
	}
	for _, tc := range held {
		l := statusAs(t, a, tc.token, secrets, tc.s.path).Locks[0]
		if l.State != "free" || l.Holder == nil || l.Holder.Alloc_ID != tc.start.AllocID {
			t.Errorf("%s, after the release: %+v (basis %q); want free, last held by %s", tc.name, l, l.Basis, drvShort(tc.start.AllocID))
		}
	}
}

// waitDeployed waits until job's latest deployment has ended.
func waitDeployed(t *testing.T, a *harness.Agent, job string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		d, _, err := a.API().Jobs().LatestDeployment(job, nil)
		if err == nil && (d == nil || d.Status != api.DeploymentStatusRunning) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deployment of %s still runs 90s later (%v): %+v", job, err, d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// idleIdentity is the workload identity of job's idle task (its group
// "idle" writes it to its secrets dir).
func idleIdentity(t *testing.T, a *harness.Agent, job string) string {
	t.Helper()
	allocs := a.WaitAllocs(t, job, 2, api.AllocClientStatusRunning, 60*time.Second)
	for _, al := range allocs {
		if al.TaskGroup == "idle" {
			return readSecretToken(t, a, al.ID)
		}
	}
	t.Fatalf("no running allocation of %s's idle group", job)
	return ""
}

// readOnlyToken creates a client token whose policy reads paths alone
// (examples/acl/singleton-lock-read.policy.hcl, one path block each).
func readOnlyToken(t *testing.T, a *harness.Agent, paths ...string) string {
	t.Helper()
	example, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", "acl", "singleton-lock-read.policy.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	const block = `    path "nomad/jobs/web/lock" {
      capabilities = ["read"]
    }
`
	if !strings.Contains(string(example), block) {
		t.Fatalf("the example read policy no longer has the block\n%s\n%s", block, example)
	}
	var blocks strings.Builder
	for _, p := range paths {
		blocks.WriteString(strings.Replace(block, "nomad/jobs/web/lock", p, 1))
	}
	f := filepath.Join(t.TempDir(), "read.policy.hcl")
	if err := os.WriteFile(f, []byte(strings.Replace(string(example), block, blocks.String(), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Nomad(t, "acl", "policy", "apply", "singleton-lock-read-status", f)
	return createToken(t, a, "lock-status", "singleton-lock-read-status")
}

// runLockAs runs bin/lock with token against the agent's HTTP API and
// returns its stdout; it fails the test on a non-zero exit, or if any of
// secrets appears in stdout or stderr.
func runLockAs(t *testing.T, a *harness.Agent, token string, secrets []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(harness.LockBin(t), args...)
	cmd.Env = append(harness.WithoutNomadEnv(os.Environ()), "NOMAD_ADDR="+a.Addr(), "NOMAD_TOKEN="+token)
	p := harness.StartProcess(t, cmd)
	code := p.Wait(60 * time.Second)
	out := p.Stdout() + p.Stderr()
	if code != 0 {
		t.Fatalf("lock %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("lock %s shows a secret (a lock ID or a token):\n%s", strings.Join(args, " "), out)
		}
	}
	if jwtPattern.MatchString(out) {
		t.Errorf("lock %s shows a workload identity token", strings.Join(args, " "))
	}
	return p.Stdout()
}

func statusAs(t *testing.T, a *harness.Agent, token string, secrets []string, path string) statusJSON {
	t.Helper()
	var st statusJSON
	out := runLockAs(t, a, token, secrets, "status", "-json", path)
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Schema != 1 || len(st.Locks) != 1 {
		t.Fatalf("lock status -json %s: %v\n%s", path, err, out)
	}
	return st
}

func listAs(t *testing.T, a *harness.Agent, token string, secrets []string, prefix string) statusJSON {
	t.Helper()
	var st statusJSON
	out := runLockAs(t, a, token, secrets, "list", "-json", "-prefix", prefix)
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Schema != 1 {
		t.Fatalf("lock list -json -prefix %s: %v\n%s", prefix, err, out)
	}
	return st
}
