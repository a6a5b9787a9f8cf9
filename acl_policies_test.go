package main

import (
	"os"
	"testing"

	"github.com/hashicorp/nomad/acl"
)

// TestReleasePolicyCoversEveryLockPath: the plugin's release token
// (examples/acl/singleton-release.policy.hcl) may write and read every
// lock at a path ending in /lock that the plugin releases, by Nomad's own
// ACL matching (acl.NewACL: a * spans any run of characters, slashes
// included, but the pattern's tail must match the path's): the driver's
// default lock path, a semaphore's slots below it and lease mode's
// heartbeat; and nothing else below nomad/jobs/, where jobs keep their own
// variables. (A lock.path of the user's that does not end in /lock needs
// its own line, as the policy says.)
func TestReleasePolicyCoversEveryLockPath(t *testing.T) {
	a := policyACL(t, "examples/acl/singleton-release.policy.hcl")
	for _, path := range []string{
		"nomad/jobs/web/web/server/lock",          // the driver's default
		"nomad/jobs/q/workers/worker/lock/slot-0", // a semaphore's slots (lock.holders)
		"nomad/jobs/q/workers/worker/lock/slot-63",
		"nomad/jobs/web/web/server/lock/lease", // lease mode's heartbeat
	} {
		for _, op := range []string{acl.VariablesCapabilityWrite, acl.VariablesCapabilityRead} {
			if !a.AllowVariableOperation("prod", path, op, nil) {
				t.Errorf("the release policy does not allow %s on %s", op, path)
			}
		}
	}
	for _, path := range []string{"nomad/jobs/web", "nomad/jobs/web/db-password", "nomad/other/lock"} {
		if a.AllowVariableOperation("prod", path, acl.VariablesCapabilityRead, nil) {
			t.Errorf("the release policy allows reading %s, which holds no lock", path)
		}
	}
}

// policyACL parses an example policy into Nomad's ACL object.
func policyACL(t *testing.T, file string) *acl.ACL {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := acl.Parse(string(src), true)
	if err != nil {
		t.Fatal(err)
	}
	a, err := acl.NewACL(false, []*acl.Policy{p})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestStepDownPolicies: by Nomad's own ACL matching, every policy a task
// that takes a lock uses lets its holder read step-down requests (and not
// write them) and its standbys write and delete their records; the
// operator's step-down policy may do exactly what lock step-down does: learn
// the lock ID (write on the lock), write the request, list and read the
// standbys, read their allocations and restart a gate's; and nothing of a
// standby's or the holder's.
func TestStepDownPolicies(t *testing.T) {
	can := func(a *acl.ACL, path, op string) bool { return a.AllowVariableOperation("default", path, op, nil) }
	for file, lock := range map[string]string{
		"examples/acl/singleton-lock.policy.hcl":   "nomad/jobs/web/lock",
		"examples/acl/singleton-update.policy.hcl": "nomad/jobs/web/web/web/lock",
		"examples/acl/singleton-gate.policy.hcl":   "nomad/jobs/web/web/gate/lock",
		"examples/acl/singleton-lease.policy.hcl":  "nomad/jobs/web/web/web/lock",
	} {
		a := policyACL(t, file)
		for _, c := range []struct {
			path, op string
			want     bool
		}{
			{lock + "/step-down", acl.VariablesCapabilityRead, true},
			{lock + "/step-down", acl.VariablesCapabilityWrite, false},
			{lock + "/standby/5d0c3a1e-0000-4000-8000-000000000000", acl.VariablesCapabilityWrite, true},
			{lock + "/standby/5d0c3a1e-0000-4000-8000-000000000000", acl.VariablesCapabilityDestroy, true},
			{lock, acl.VariablesCapabilityDestroy, false},
		} {
			if got := can(a, c.path, c.op); got != c.want {
				t.Errorf("%s: %s on %s = %v, want %v", file, c.op, c.path, got, c.want)
			}
		}
	}

	const lock = "nomad/jobs/web/lock"
	a := policyACL(t, "examples/acl/singleton-step-down.policy.hcl")
	for _, c := range []struct {
		path, op string
		want     bool
	}{
		{lock, acl.VariablesCapabilityWrite, true},
		{lock, acl.VariablesCapabilityRead, true},
		{lock + "/step-down", acl.VariablesCapabilityWrite, true},
		{lock + "/standby/x", acl.PolicyList, true},
		{lock + "/standby/x", acl.VariablesCapabilityRead, true},
		{lock + "/standby/x", acl.VariablesCapabilityWrite, false},
		{lock + "/standby/x", acl.VariablesCapabilityDestroy, false},
		{lock + "/lease", acl.VariablesCapabilityWrite, false},
		{"nomad/jobs/web/db-password", acl.VariablesCapabilityRead, false},
	} {
		if got := can(a, c.path, c.op); got != c.want {
			t.Errorf("step-down policy: %s on %s = %v, want %v", c.op, c.path, got, c.want)
		}
	}
	for _, capability := range []string{acl.NamespaceCapabilityReadJob, acl.NamespaceCapabilityAllocLifecycle} {
		if !a.AllowNamespaceOperation("default", capability) {
			t.Errorf("step-down policy lacks %s", capability)
		}
	}
	if a.AllowNamespaceOperation("default", acl.NamespaceCapabilitySubmitJob) {
		t.Error("step-down policy may submit jobs")
	}
}
