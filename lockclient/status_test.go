package lockclient_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Status tells held, free or unknown to a token that Nomad shows no lock
// state (every token but a management one), by the rule of status.go:
// the release mark, the renew probe of a token that may write, the lease
// heartbeat; and never says held of a lock that is free.
func TestStatusWithoutLockState(t *testing.T) {
	const path = "nomad/jobs/web/lock"
	denied := locktest.Error(403, "Permission denied")
	tests := []struct {
		name string
		// lease: the holder runs in lease mode.
		lease bool
		// end ends the tenure (nil: still held).
		end func(*lockclient.Lease, *locktest.Server)
		// readOnly: the reader may not write the path (the probe is refused).
		readOnly bool
		want     lockclient.LockState
		basis    string
	}{
		{"held, token with write", false, nil, false, lockclient.LockHeld, "refused a renew"},
		{"held, read-only token", false, nil, true, lockclient.LockUnknown, "no release is recorded"},
		{"held in lease mode, read-only token", true, nil, true, lockclient.LockHeld, "heartbeat"},
		{"released, read-only token", false, releaseLease, true, lockclient.LockFree, "release mark"},
		{"released in lease mode, read-only token", true, releaseLease, true, lockclient.LockFree, "release mark"},
		{"expired, token with write", false, expire, false, lockclient.LockFree, "holds no lock"},
		{"expired, read-only token", false, expire, true, lockclient.LockUnknown, "no release is recorded"},
		{"expired in lease mode, read-only token", true, expire, true, lockclient.LockUnknown, "no release is recorded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vars := locktest.NewVars()
			cfg := lockclient.Config{Path: path, Timing: locktest.Timing(), Holder: lockclient.Holder{AllocID: "alloc-self", PID: 1}}
			if tc.lease {
				hb := lockclient.DefaultHeartbeat
				hb.Path, hb.EscrowPath = lockclient.HeartbeatPathFor(path), lockclient.EscrowPathFor(path)
				cfg.Heartbeat = &hb
			}
			lease, err := vars.Locker(t, cfg).Acquire(context.Background(), lockclient.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lease.Release(context.Background()) }()
			srv := vars.Server(path)
			if tc.end != nil {
				tc.end(lease, srv)
			}
			srv.HideLock()
			if tc.readOnly {
				srv.FailRenew(denied)
			}
			reader := vars.Locker(t, lockclient.Config{Path: path, Timing: locktest.Timing()})
			st, err := reader.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.State != tc.want || !strings.Contains(st.Basis, tc.basis) || st.Held != (tc.want == lockclient.LockHeld) ||
				st.HeldKnown != (tc.want != lockclient.LockUnknown) {
				t.Errorf("status %s (%q), held %v known %v; want %s (%q)", st.State, st.Basis, st.Held, st.HeldKnown, tc.want, tc.basis)
			}
			if st.Holder.AllocID != "alloc-self" {
				t.Errorf("holder %+v, want alloc-self", st.Holder)
			}
			if tc.lease && tc.end == nil && (st.Heartbeat == nil || st.Heartbeat.Epoch != lease.Fence) {
				t.Errorf("heartbeat %+v, want epoch %d", st.Heartbeat, lease.Fence)
			}
		})
	}
}

func releaseLease(l *lockclient.Lease, _ *locktest.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Release(ctx)
}

func expire(_ *lockclient.Lease, s *locktest.Server) { s.Expire() }

// List finds every lock under a prefix and leaves out what is not one: a
// lease heartbeat, a semaphore's record.
func TestListLocks(t *testing.T) {
	vars := locktest.NewVars()
	holder := lockclient.Holder{AllocID: "x", PID: 1}
	hb := lockclient.DefaultHeartbeat
	hb.Path, hb.EscrowPath = lockclient.HeartbeatPathFor("nomad/jobs/b/lock"), lockclient.EscrowPathFor("nomad/jobs/b/lock")
	for _, cfg := range []lockclient.Config{
		{Path: "nomad/jobs/a/lock"},
		{Path: "nomad/jobs/b/lock", Heartbeat: &hb},
		{Path: "nomad/jobs/c/q", Holders: 2},
		{Path: "other/lock"},
	} {
		cfg.Timing, cfg.Holder = locktest.Timing(), holder
		lease, err := vars.Locker(t, cfg).Acquire(context.Background(), lockclient.AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lease.Release(context.Background()) }()
	}
	reader := vars.Locker(t, lockclient.Config{Path: "nomad/jobs/a/lock", Timing: locktest.Timing()})
	locks, err := reader.List(context.Background(), "nomad/jobs/")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, l := range locks {
		paths = append(paths, l.Path)
	}
	want := []string{"nomad/jobs/a/lock", "nomad/jobs/b/lock", "nomad/jobs/c/q/slot-0"}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Errorf("List = %v, want %v", paths, want)
	}
}
