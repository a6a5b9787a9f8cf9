package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestPurgeUnderACLsReleasesWithTheOperatorToken: under ACLs, `nomad job
// stop -purge` removes the allocation, and its workload identity with it,
// before the task can release. With release_token_file in the plugin config
// the plugin proves the task dead (its cgroup: a daemon that ignores
// SIGTERM included) and releases with the operator's token, so the lock is
// free long before the server would expire it (2×TTL + delay after the last
// renew). The token never shows in the agent's log.
func TestPurgeUnderACLsReleasesWithTheOperatorToken(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	tokenFile := filepath.Join(t.TempDir(), "release.token")
	// The plugin checks the file at start; the token exists only once the
	// ACL system is bootstrapped, and the plugin reads it at each use.
	if err := os.WriteFile(tokenFile, []byte("not-yet-a-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, false)
	opts.ACLs = true
	plugin := opts.Config[0]
	opts.Config[0] = strings.Replace(plugin, "  config {\n", fmt.Sprintf("  config {\n    release_token_file = %q\n", tokenFile), 1)
	if opts.Config[0] == plugin {
		t.Fatalf("no config block in the plugin config:\n%s", plugin)
	}
	a := harness.StartAgent(t, opts)

	secret := purgeReleaseToken(t, a)
	if err := os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	j := newDrvJob(t, "purge-acl", 1)
	j.args = []string{"-children", "1", "-daemon", "-ignore-term"}
	// TTL 30s: the server would expire the lock 65s after the last renew,
	// which is at most a renew interval before the purge.
	j.lockBlock = "ttl = \"30s\"\n        delay = \"5s\""
	applyLockPolicy(t, a, j.id, j.lockPath())
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
	start := waitMainStart(t, j.record, 90*time.Second, nil)
	if v := readLock(t, a, j.lockPath()); v.Lock == nil || v.Items["holder_alloc_id"] != start.AllocID {
		t.Fatalf("lock %s not held by %s: %+v", j.lockPath(), start.AllocID, v)
	}
	harness.WaitRecord(t, j.record, 30*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleChild
	})

	t0 := time.Now()
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	var free time.Duration
	for deadline := t0.Add(90 * time.Second); ; {
		v, _, err := a.API().Variables().Read(j.lockPath(), nil)
		if err == nil && v.Lock == nil {
			free = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %s still held 90s after the purge (err %v)", j.lockPath(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if procs, _ := harness.FindProcs(j.marker); len(procs) > 0 {
		t.Errorf("the lock was free while processes of the task ran: %v", procs)
	}
	t.Logf("MEASURE purge_acl_lock_free=%s", harness.Millis(free))
	// The server's expiry comes 50s after the purge at the earliest.
	if free >= 45*time.Second {
		t.Errorf("the lock was free %s after the purge: the server's expiry, not a release", free)
	}
	log, err := os.ReadFile(a.Client().LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "released the lock on behalf of the supervisor") || !strings.Contains(string(log), "with the plugin's release_token_file") {
		t.Errorf("the client's log does not say the plugin released with release_token_file")
	}
	if strings.Contains(string(log), secret) {
		t.Errorf("the release token is in the client's log")
	}
}

// purgeReleaseToken applies examples/acl/singleton-release.policy.hcl and
// returns the secret of a new client token with it.
func purgeReleaseToken(t *testing.T, a *harness.Agent) string {
	t.Helper()
	policy := filepath.Join(harness.RepoRoot(t), "examples", "acl", "singleton-release.policy.hcl")
	a.Nomad(t, "acl", "policy", "apply", "singleton-release", policy)
	out := a.Nomad(t, "acl", "token", "create", "-name", "singleton-release", "-policy", "singleton-release", "-json")
	var tok api.ACLToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.SecretID == "" {
		t.Fatalf("acl token create: %v\n%s", err, out)
	}
	return tok.SecretID
}

// applyLockPolicy applies examples/acl/singleton-lock.policy.hcl to job,
// for the lock at path.
func applyLockPolicy(t *testing.T, a *harness.Agent, job, path string) {
	t.Helper()
	example, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", "acl", "singleton-lock.policy.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.ReplaceAll(string(example), `"nomad/jobs/web/lock"`, fmt.Sprintf("%q", path))
	if policy == string(example) {
		t.Fatalf("the example policy no longer has path \"nomad/jobs/web/lock\":\n%s", example)
	}
	f := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(f, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Nomad(t, "acl", "policy", "apply", "-namespace", "default", "-job", job, "singleton-lock-"+job, f)
}
