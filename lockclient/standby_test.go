package lockclient_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Standbys record themselves under the lock's path while they wait, and a
// requester lists them; a withdrawn record is gone, a standby outside
// Nomad is keyed by host and PID, and an identity that may not write the
// records is told which policy line lets it.
func TestStandbyRecords(t *testing.T) {
	vars := locktest.NewVars()
	ctx := context.Background()
	standby := func(h lockclient.Holder) *lockclient.Locker {
		return vars.Locker(t, lockclient.Config{Path: sdPath, Timing: locktest.Timing(), Holder: h})
	}
	b := standby(lockclient.Holder{AllocID: "alloc-b", JobID: "web", Node: "node-2", PID: 7})
	c := standby(lockclient.Holder{Hostname: "db.example", PID: 42})
	pathB, err := b.AnnounceStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pathC, err := c.AnnounceStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		t.Helper()
		sbs, err := requester(t, vars).Standbys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, s := range sbs {
			keys = append(keys, s.Key+"@"+s.Node+s.Hostname)
		}
		return keys
	}
	if got := strings.Join(list(), " "); got != "alloc-b@node-2 host-db_example-42@db.example" {
		t.Errorf("standbys = %s", got)
	}
	if pathB != lockclient.StandbyPrefixFor(sdPath)+"alloc-b" {
		t.Errorf("record at %s", pathB)
	}
	if err := b.WithdrawStandby(ctx, pathB); err != nil {
		t.Fatal(err)
	}
	if err := c.WithdrawStandby(ctx, pathC); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 0 {
		t.Errorf("after withdrawal: %v", got)
	}
	// A lock's own listing never takes a standby record for a lock.
	if _, err := b.AnnounceStandby(ctx); err != nil {
		t.Fatal(err)
	}
	locks, err := requester(t, vars).List(ctx, "nomad/jobs/")
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 0 {
		t.Errorf("List took a standby record for a lock: %+v", locks)
	}

	denied := standby(lockclient.Holder{AllocID: "alloc-d", PID: 1})
	vars.Server(lockclient.StandbyPrefixFor(sdPath) + "alloc-d").DenyWrites()
	_, err = denied.AnnounceStandby(ctx)
	var pe *lockclient.StandbyPermissionError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `path "nomad/jobs/web/lock/standby/*"`) {
		t.Errorf("err = %v, want the policy line", err)
	}
}
