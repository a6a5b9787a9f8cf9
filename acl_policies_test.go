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
	src, err := os.ReadFile("examples/acl/singleton-release.policy.hcl")
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
