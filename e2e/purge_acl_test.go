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
// the plugin releases with the operator's token, so the lock is free long
// before the server would expire it (2×TTL + delay after the last renew):
//   - a driver task, once the plugin has proven the task dead (its cgroup:
//     a daemon that ignores SIGTERM included);
//   - a gate, once Nomad (asked with that token) says the allocation is
//     stopped, so its client has killed the gated app; the release is
//     marked clean, so the next gate need not wait.
//
// The token never shows in the agent's log.
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

	t.Run("driver", func(t *testing.T) {
		j := newDrvJob(t, "purge-acl", 1)
		j.args = []string{"-children", "1", "-daemon", "-ignore-term"}
		// TTL 30s: the server would expire the lock 65s after the last
		// renew, which is at most a renew interval before the purge.
		j.lockBlock = "ttl = \"30s\"\n        delay = \"5s\""
		applyLockPolicy(t, a, j.id, j.lockPath())
		a.RunJobHCL(t, j.hcl(t))
		t.Cleanup(func() { _ = a.Purge(j.id) })
		start := waitMainStart(t, j.record, 90*time.Second, nil)
		harness.WaitRecord(t, j.record, 30*time.Second, func(r harness.Record) bool {
			return r.Event == harness.EventStart && r.Role == harness.RoleChild
		})
		free := purgeUntilFree(t, a, j.id, j.lockPath(), start.AllocID, j.marker)
		// The server's expiry comes 50s after the purge at the earliest.
		if free >= 45*time.Second {
			t.Errorf("the lock was free %s after the purge: the server's expiry, not a release", free)
		}
		purgeCheckLog(t, a, start.AllocID, secret)
	})

	t.Run("gate", func(t *testing.T) {
		records := t.TempDir()
		if err := os.Chmod(records, 0o777); err != nil {
			t.Fatal(err)
		}
		j := newGateJobID(t, "purge-acl-gate", "raw_exec", records)
		j.count = 1
		applyGatePolicy(t, a, j, true)
		j.run(t, a)
		t.Cleanup(func() { _ = a.Purge(j.id) })
		first := j.start(t, "", 0, 90*time.Second)
		purgeUntilFree(t, a, j.id, j.lockPath(), first.AllocID, j.marker)
		if v := readLock(t, a, j.lockPath()); v.Items["released_clean"] != "true" {
			t.Errorf("the gate's release was not marked clean: items %v", v.Items)
		}
		purgeCheckLog(t, a, first.AllocID, secret)
	})
}

// purgeUntilFree purges job, whose allocation holder holds the lock at
// path, and returns how long the lock took to be free. No process with
// marker may be alive by then.
func purgeUntilFree(t *testing.T, a *harness.Agent, job, path, holder, marker string) time.Duration {
	t.Helper()
	if v := readLock(t, a, path); v.Lock == nil || v.Items["holder_alloc_id"] != holder {
		t.Fatalf("lock %s not held by %s: %+v", path, holder, v)
	}
	t0 := time.Now()
	if err := a.Purge(job); err != nil {
		t.Fatal(err)
	}
	var free time.Duration
	for deadline := t0.Add(90 * time.Second); ; {
		v, _, err := a.API().Variables().Read(path, nil)
		if err == nil && v.Lock == nil {
			free = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %s still held 90s after the purge (err %v)", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if procs, _ := harness.FindProcs(marker); len(procs) > 0 {
		t.Errorf("the lock was free while processes of the job ran: %v", procs)
	}
	t.Logf("MEASURE purge_acl_lock_free=%s (%s)", harness.Millis(free), job)
	return free
}

// purgeCheckLog: the client's log says that the plugin released holder's
// lock with its release_token_file (not the server's expiry), and never
// shows the token.
func purgeCheckLog(t *testing.T, a *harness.Agent, holder, secret string) {
	t.Helper()
	log, err := os.ReadFile(a.Client().LogPath())
	if err != nil {
		t.Fatal(err)
	}
	released := false
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "released the lock on behalf of the supervisor") && strings.Contains(line, holder) &&
			strings.Contains(line, "with the plugin's release_token_file") {
			released = true
		}
	}
	if !released {
		t.Errorf("the client's log does not say the plugin released %s's lock with release_token_file", holder)
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
	return createToken(t, a, "singleton-release", "singleton-release")
}

// createToken creates a client token named name with the policy and
// returns its secret.
func createToken(t *testing.T, a *harness.Agent, name, policy string) string {
	t.Helper()
	out := a.Nomad(t, "acl", "token", "create", "-name", name, "-policy", policy, "-json")
	var tok api.ACLToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.SecretID == "" {
		t.Fatalf("acl token create: %v\n%s", err, out)
	}
	return tok.SecretID
}

// examplePolicyFile writes the example policy examples/acl/<name> with
// path in place of its lock path examplePath wherever it appears (the
// lock's own lines, the paths below it, lease mode's escrow), and returns
// the file.
func examplePolicyFile(t *testing.T, name, examplePath, path string) string {
	t.Helper()
	example, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", "acl", name))
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.ReplaceAll(string(example), examplePath, path)
	if policy == string(example) {
		t.Fatalf("the example policy %s no longer has the path %q:\n%s", name, examplePath, example)
	}
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// applyLockPolicy applies examples/acl/singleton-lock.policy.hcl to job,
// for the lock at path.
func applyLockPolicy(t *testing.T, a *harness.Agent, job, path string) {
	t.Helper()
	f := examplePolicyFile(t, "singleton-lock.policy.hcl", "nomad/jobs/web/lock", path)
	a.Nomad(t, "acl", "policy", "apply", "-namespace", "default", "-job", job, "singleton-lock-"+job, f)
}
