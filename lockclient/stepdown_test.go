package lockclient_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

const sdPath = "nomad/jobs/web/lock"

// holdFor acquires the lock at sdPath in vars for the allocation alloc.
func holdFor(t *testing.T, vars *locktest.Vars, alloc string) *lockclient.Lease {
	t.Helper()
	cfg := lockclient.Config{Path: sdPath, Timing: locktest.Timing(), Holder: lockclient.Holder{AllocID: alloc, PID: 1}}
	lease, err := vars.Locker(t, cfg).Acquire(context.Background(), lockclient.AcquireOptions{
		Items: lockclient.StepDownItems(lockclient.StepDownStop, 7*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

// requester is a Locker of an operator's token on the lock at sdPath.
func requester(t *testing.T, vars *locktest.Vars) *lockclient.Locker {
	return vars.Locker(t, lockclient.Config{Path: sdPath, Timing: locktest.Timing()})
}

// A holder acts on a step-down request only if its writer knew the
// holder's own lock ID, the request names it, and it has not expired:
// every field is covered by the proof, and a request written for an
// earlier acquisition proves nothing to the next.
func TestStepDownRequestProof(t *testing.T) {
	tests := []struct {
		name string
		// tamper changes the request's items as they are stored.
		tamper func(items map[string]string)
		// reacquire: the holder released and acquired again after the request.
		reacquire bool
		expires   time.Duration // from now; default a minute
		want      bool
	}{
		{name: "as written", want: true},
		{name: "target changed", tamper: func(m map[string]string) { m["to"] = "someone-else" }},
		{name: "target removed", tamper: func(m map[string]string) { delete(m, "to") }},
		{name: "wait stretched", tamper: func(m map[string]string) { m["wait"] = "1h0m0s" }},
		{name: "expiry pushed back", tamper: func(m map[string]string) {
			m["expires"] = time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
		}},
		{name: "nonce changed", tamper: func(m map[string]string) { m["nonce"] = "00" }},
		{name: "proof forged", tamper: func(m map[string]string) { m["mac"] = strings.Repeat("ab", 32) }},
		{name: "proof missing", tamper: func(m map[string]string) { delete(m, "mac") }},
		{name: "another version", tamper: func(m map[string]string) { m["version"] = "2" }},
		{name: "for an earlier acquisition", reacquire: true},
		{name: "expired", expires: -time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vars := locktest.NewVars()
			lease := holdFor(t, vars, "alloc-holder")
			ctx := context.Background()
			target, err := requester(t, vars).StepDownTarget(ctx)
			if err != nil {
				t.Fatal(err)
			}
			expires := tc.expires
			if expires == 0 {
				expires = time.Minute
			}
			if _, err := requester(t, vars).SendStepDown(ctx, target, lockclient.StepDownRequest{
				To: "alloc-standby", Wait: 10 * time.Second, Expires: time.Now().Add(expires)}); err != nil {
				t.Fatal(err)
			}
			req := vars.Server(lockclient.StepDownPathFor(sdPath))
			if tc.tamper != nil {
				items := req.Items()
				tc.tamper(items)
				req.SetItems(items)
			}
			if tc.reacquire {
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
				lease = holdFor(t, vars, "alloc-holder")
			}
			got, ok := lease.StepDownRequested(ctx)
			if ok != tc.want {
				t.Fatalf("acted on = %v, want %v (request %+v)", ok, tc.want, got)
			}
			if ok && (got.To != "alloc-standby" || got.Wait != 10*time.Second || got.Holder != "alloc-holder") {
				t.Errorf("request = %+v", got)
			}
			for k, v := range req.Items() {
				if strings.Contains(v, "locktest-lock-") {
					t.Errorf("the request holds the lock ID in %s", k)
				}
			}
		})
	}
}

// The holder's watch delivers a request the moment it is written, and
// nothing for a request that is not its own; a withdrawn request is not
// acted on.
func TestWatchStepDown(t *testing.T) {
	vars := locktest.NewVars()
	lease := holdFor(t, vars, "alloc-holder")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	r := requester(t, vars)
	target, err := r.StepDownTarget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A request withdrawn before the holder looked.
	sent, err := r.SendStepDown(ctx, target, lockclient.StepDownRequest{Wait: time.Second, Expires: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CancelStepDown(ctx, sent); err != nil {
		t.Fatal(err)
	}
	if _, ok := lease.StepDownRequested(ctx); ok {
		t.Fatal("a withdrawn request was acted on")
	}
	// The watch starts once the request is withdrawn: one running already
	// may have seen it in the instant it existed, as a holder may.
	watch := lease.WatchStepDown(ctx)
	// One for another holder's key, proved with our lock ID, is not ours.
	other := target
	other.Holder.AllocID = "alloc-other"
	if _, err := r.SendStepDown(ctx, other, lockclient.StepDownRequest{Wait: time.Second, Expires: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-watch:
		t.Fatalf("the watch delivered a request for another holder: %+v", got)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := r.SendStepDown(ctx, target, lockclient.StepDownRequest{To: "alloc-b", Wait: time.Second, Expires: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-watch:
		if got.To != "alloc-b" {
			t.Errorf("delivered %+v", got)
		}
	case <-ctx.Done():
		t.Fatal("the watch never delivered the request")
	}
}

// A holder whose identity may not read the requests ends its watch at once,
// and says so by StepDownReadable, so that its record offers no step-down.
func TestWatchStepDownDenied(t *testing.T) {
	vars := locktest.NewVars()
	lease := holdFor(t, vars, "alloc-holder")
	vars.Server(lockclient.StepDownPathFor(sdPath)).DenyReads()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case _, open := <-lease.WatchStepDown(ctx):
		if open {
			t.Fatal("delivered a request it may not read")
		}
	case <-ctx.Done():
		t.Fatal("the watch did not end")
	}
	if vars.Locker(t, lockclient.Config{Path: sdPath, Timing: locktest.Timing()}).StepDownReadable(ctx) {
		t.Error("StepDownReadable = true for a token refused")
	}
}

// A requester learns the lock ID as Nomad shows it to its token, and only
// so: a management token's read, or the conflict of a check-and-set write
// that never lands. A token that could not release the lock is refused
// with the policy that fixes it, and a free lock has nobody to step down.
func TestStepDownTarget(t *testing.T) {
	tests := []struct {
		name  string
		setup func(lock *locktest.Server)
		// free: no holder (released before the request).
		free    bool
		wantErr error
		// wantPolicy: the error is a *StepDownPermissionError.
		wantPolicy bool
	}{
		{name: "management token", setup: func(*locktest.Server) {}},
		{name: "token with write", setup: func(s *locktest.Server) { s.HideLock() }},
		{name: "read-only token", setup: func(s *locktest.Server) { s.HideLock(); s.DenyWrites() }, wantPolicy: true},
		{name: "Nomad no longer shows the ID on a conflict", setup: func(s *locktest.Server) { s.HideLock(); s.HideConflictLock() },
			wantErr: lockclient.ErrLockIDHidden},
		{name: "free lock, management token", setup: func(*locktest.Server) {}, free: true, wantErr: lockclient.ErrNoHolder},
		{name: "free lock, token with write", setup: func(s *locktest.Server) { s.HideLock() }, free: true, wantErr: lockclient.ErrNoHolder},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vars := locktest.NewVars()
			lease := holdFor(t, vars, "alloc-holder")
			ctx := context.Background()
			if tc.free {
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			lock := vars.Server(sdPath)
			tc.setup(lock)
			before, items := lock.Calls(locktest.OpUpdate), lock.Items()
			fence, _ := lock.LastGrant()
			target, err := requester(t, vars).StepDownTarget(ctx)
			var pe *lockclient.StepDownPermissionError
			switch {
			case tc.wantPolicy:
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), "singleton-step-down.policy.hcl") {
					t.Fatalf("err = %v, want a permission error naming the policy", err)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			default:
				if target.Holder.AllocID != "alloc-holder" || target.Holder.StepDown != lockclient.StepDownStop ||
					target.Holder.StepDownWithin != 7*time.Second {
					t.Errorf("holder = %+v", target.Holder)
				}
			}
			if calls := lock.Calls(locktest.OpUpdate) - before; calls > 1 {
				t.Errorf("%d writes to the lock, want at most the one check-and-set that never lands", calls)
			}
			if now, _ := lock.LastGrant(); now != fence || !maps.Equal(lock.Items(), items) {
				t.Error("the requester changed the lock")
			}
		})
	}
}

// A holder that steps down writes the handover into its record before its
// release; a standby gives way by its rule.
func TestHandover(t *testing.T) {
	vars := locktest.NewVars()
	lease := holdFor(t, vars, "alloc-a")
	ctx := context.Background()
	until := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	if err := lease.MarkReleasing(ctx, lockclient.Handover{From: "alloc-a", To: "alloc-c", Until: until}.Items(), true); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := requester(t, vars).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := st.Holder.Handover
	if h.From != "alloc-a" || h.To != "alloc-c" || !h.Until.Equal(until) || !st.Holder.ReleasedClean || st.State != lockclient.LockFree {
		t.Fatalf("after the release: %+v, handover %+v", st, h)
	}

	now := time.Now()
	for _, tc := range []struct {
		name     string
		handover lockclient.Handover
		self     string
		waits    bool
	}{
		{"the named standby", lockclient.Handover{From: "a", To: "c", Until: now.Add(time.Minute)}, "c", false},
		{"another standby", lockclient.Handover{From: "a", To: "c", Until: now.Add(time.Minute)}, "b", true},
		{"the former holder, a standby named", lockclient.Handover{From: "a", To: "c", Until: now.Add(time.Minute)}, "a", true},
		{"the former holder, nobody named", lockclient.Handover{From: "a", Until: now.Add(time.Minute)}, "a", true},
		{"another standby, nobody named", lockclient.Handover{From: "a", Until: now.Add(time.Minute)}, "b", false},
		{"after the wait", lockclient.Handover{From: "a", To: "c", Until: now.Add(-time.Second)}, "b", false},
		{"no step-down", lockclient.Handover{}, "b", false},
	} {
		grace := tc.handover.Grace(tc.self, now)
		if (grace > 0) != tc.waits || grace > time.Minute {
			t.Errorf("%s: grace %s, want waiting %v", tc.name, grace, tc.waits)
		}
	}
}

// A requester learns whether its token may write the request without
// writing it: a refusal names the policy, and nothing is written either way.
func TestMayRequestStepDown(t *testing.T) {
	for _, deny := range []bool{false, true} {
		vars := locktest.NewVars()
		holdFor(t, vars, "alloc-holder")
		req := vars.Server(lockclient.StepDownPathFor(sdPath))
		if deny {
			req.DenyWrites()
		}
		err := requester(t, vars).MayRequestStepDown(context.Background())
		var pe *lockclient.StepDownPermissionError
		if deny != errors.As(err, &pe) || !deny && err != nil {
			t.Errorf("denied %v: err = %v", deny, err)
		}
		if len(req.Items()) != 0 {
			t.Errorf("denied %v: the check wrote the request: %v", deny, req.Items())
		}
	}
}
