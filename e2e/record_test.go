package e2e

// The lock's record (its Items) is rewritten under the lock ID by a gate
// (withdrawing gated_direct, marking a clean release) and by the plugin
// for a crashed gate (lockclient.Locker.writeItem). Nomad v1.11.2 stores a
// lock written by a plain write with its own default TTL and delay (15s),
// not the lock's, and makes a lock of a free variable written with a lock
// ID: these tests keep that in view, and prove that lockclient's writes
// keep the lock's TTL and delay and make no lock.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// TestLockRecordWrites: on a dev agent, a plain write of a locked
// variable under its lock ID loses the lock's TTL and delay (Nomad's
// behaviour); lockclient's withdrawal of gated_direct leaves it with its
// TTL and delay, as `nomad var get` shows; and its mark of a clean release
// on a lock already released makes no lock.
func TestLockRecordWrites(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	varGetLock := func(path string) *api.VariableLock {
		t.Helper()
		var v api.Variable
		out := a.Nomad(t, "var", "get", "-out", "json", path)
		// The JSON, then a line that points to the web UI.
		if err := json.NewDecoder(strings.NewReader(out)).Decode(&v); err != nil {
			t.Fatalf("nomad var get -out json %s: %v\n%s", path, err, out)
		}
		return v.Lock
	}

	// Nomad: a plain write under the lock ID keeps the lock, not its TTL.
	vars := a.API().Variables()
	plain := "nomad/jobs/record/plain/lock"
	held, _, err := vars.AcquireLock(&api.Variable{Path: plain, Items: map[string]string{"holder": "a"},
		Lock: &api.VariableLock{TTL: "10s", LockDelay: "1s"}}, nil)
	if err != nil || held.Lock == nil {
		t.Fatalf("acquire %s: %v", plain, err)
	}
	if _, _, err := vars.Update(&api.Variable{Path: plain, Items: map[string]string{"holder": "a", "x": "1"},
		Lock: &api.VariableLock{ID: held.Lock.ID}}, nil); err != nil {
		t.Fatalf("write %s under its lock ID: %v", plain, err)
	}
	if lk := varGetLock(plain); lk == nil || lk.TTL == "10s" && lk.LockDelay == "1s" {
		t.Logf("NOMAD CHANGED: a plain write under the lock ID kept the lock as acquired (%+v); Nomad v1.11.2 stores "+
			"its own default TTL and delay: lockclient.writeItem's lock-acquire that writes them back may be dropped", lk)
	}

	path := "nomad/jobs/record/gate/lock"
	l, err := lockclient.New(lockclient.Config{Endpoint: lockclient.Endpoint{Address: a.Addr(), Token: a.Token()}, Path: path,
		Timing: lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second}, Holder: lockclient.Holder{AllocID: "alloc-record"}})
	if err != nil {
		t.Fatal(err)
	}

	lease, err := l.Acquire(ctx, lockclient.AcquireOptions{Items: map[string]string{"gated_direct": "true"}})
	if err != nil {
		t.Fatalf("acquire %s: %v", path, err)
	}
	if err := lease.SetItem(ctx, "gated_direct", ""); err != nil {
		t.Fatalf("withdraw gated_direct: %v", err)
	}
	if lk := varGetLock(path); lk == nil || lk.ID != lease.LockID() || lk.TTL != "10s" || lk.LockDelay != "1s" {
		t.Errorf("after the withdrawal nomad var get shows the lock %+v, want ours with TTL 10s and delay 1s", lk)
	}
	if v := readLock(t, a, path); v.Items["gated_direct"] != "" || v.Items["holder_alloc_id"] != "alloc-record" {
		t.Fatalf("record %v, want the holder's without gated_direct", v.Items)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}

	lease, err = l.Acquire(ctx, lockclient.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire %s again: %v", path, err)
	}
	id, fence, renewed := lease.LockID(), lease.Fence, lease.LastRenew()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := l.MarkReleasedCleanID(ctx, id, fence, renewed); !errors.Is(err, lockclient.ErrLost) {
		t.Errorf("a clean mark on a released lock = %v, want ErrLost", err)
	}
	if lk := varGetLock(path); lk != nil && lk.ID != "" {
		t.Fatalf("a clean mark on a released lock made a lock: %+v", lk)
	}
}
