package driver

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Table tests of the driver's records hook (recordhook.go), one per phase
// it takes part in, over leases on the in-memory lock (locktest): what the
// plugin finds in the task's state dir should the supervisor die, and so
// whether a crash is followed by a release at once or by the lock's
// expiry.

// recordRig is a records hook over a private state dir, for a run of
// lock "locks/web" (a semaphore of holders slots when holders > 0).
type recordRig struct {
	dir  *securefs.Dir
	hook *recordHook
	srv  func(path string) *locktest.Server
	l    *lockclient.Locker
}

func newRecordRig(t *testing.T, holders int) *recordRig {
	t.Helper()
	dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	run := shim.Spec{Config: shim.Config{Path: "locks/web", Namespace: "default", TTL: lockclient.MinTTL, LockDelay: 100 * time.Millisecond},
		Holder: lockclient.Holder{AllocID: "alloc-self"}}
	cfg := lockclient.Config{Path: run.Path, Holders: holders, Timing: locktest.Timing(), Holder: run.Holder}
	r := &recordRig{dir: dir, hook: &recordHook{dir: dir, run: run, log: hclog.NewNullLogger()}}
	if holders > 0 {
		vs := locktest.NewVars()
		r.srv, r.l = vs.Server, vs.Locker(t, cfg)
	} else {
		srv := locktest.New()
		r.srv, r.l = func(string) *locktest.Server { return srv }, srv.Locker(t, cfg)
	}
	return r
}

// held acquires the lock and runs the hook's Held.
func (r *recordRig) held(t *testing.T) *lockclient.Lease {
	t.Helper()
	lease, err := r.l.Acquire(context.Background(), lockclient.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	if err := r.hook.Held(context.Background(), lease); err != nil {
		t.Fatalf("Held: %v", err)
	}
	return lease
}

// releaseAsThePlugin releases the lock that the record names, as the
// plugin does for a crashed supervisor (releaseWith): with the recorded
// lock ID, only before the release cutoff of the recorded last renew.
func (r *recordRig) releaseAsThePlugin(t *testing.T, held heldLease) error {
	t.Helper()
	l := r.srv(held.Path).Locker(t, lockclient.Config{Path: held.Path, Namespace: held.Namespace,
		Timing: lockclient.Timing{TTL: held.TTL, LockDelay: held.LockDelay, RequestTimeout: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return l.ReleaseID(ctx, held.LockID, lockclient.BootTime(held.LastRenewBoot))
}

// Held: before any other hook's work and the workload's start, the lease
// is recorded, so that the plugin releases it at once should the
// supervisor die (a semaphore's: its slot's lock); a record that cannot be
// written costs only that (the crash waits for the lock's expiry), never
// the run.
func TestRecordHookHeld(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holders  int
		unusable bool // the state dir is gone
		want     string
	}{
		{"a lock: recorded; the plugin releases it after a crash", 0, false, "locks/web"},
		{"a semaphore: its slot's lock recorded and released", 2, false, lockclient.SlotPath("locks/web", 0)},
		{"the record cannot be written: the run goes on, nothing recorded", 0, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecordRig(t, tc.holders)
			if tc.unusable {
				r.dir.Close()
			}
			lease := r.held(t)
			var held heldLease
			err := readJSON(r.dir, leaseFile, &held)
			if tc.want == "" {
				if err == nil {
					t.Errorf("a record %+v in a state dir that is gone", held)
				}
				return
			}
			if err != nil {
				t.Fatalf("no lease record: %v", err)
			}
			if held.Path != tc.want || held.LockID != lease.LockID() || held.Fence != lease.Fence || held.Namespace != "default" ||
				held.TTL != lockclient.MinTTL || held.LockDelay != 100*time.Millisecond || held.IdentityRejected ||
				held.LastRenewBoot != lockclient.BootNanos(lease.LastRenew()) {
				t.Errorf("record %+v; want lock %s, ID %s, fence %d, the run's TTL and delay, the acquire's send time", held, tc.want, lease.LockID(), lease.Fence)
			}
			// The supervisor dies here; the plugin releases with the record.
			if err := r.releaseAsThePlugin(t, held); err != nil {
				t.Fatalf("the plugin's release with the record: %v", err)
			}
			if srv := r.srv(tc.want); srv.Held() {
				t.Errorf("the lock is still held after the plugin's release: %s", srv)
			}
		})
	}
}

// Release and Released: the hook takes no part in the release decision;
// once the supervisor has tried to release by itself the record goes, so
// that the plugin does not try again (which would only delay the task's
// exit), unless the task's identity no longer authenticates (a purged
// job): the record then stays, marked, for the plugin to release with the
// operator's token.
func TestRecordHookReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		held bool  // a lease was recorded
		err  error // how the release went
		// kept: the record stays, marked IdentityRejected.
		kept bool
	}{
		{"released: the record dropped", true, nil, false},
		{"the release failed: the record dropped, the lock left to expire", true, errors.New("rpc error: no leader"), false},
		{"the identity rejected: the record kept for the plugin's token", true, lockclient.ErrIdentityRejected, true},
		{"the identity rejected, never held: nothing recorded", false, lockclient.ErrIdentityRejected, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecordRig(t, 0)
			var lease *lockclient.Lease
			if tc.held {
				lease = r.held(t)
			}
			var resp shim.ReleaseResponse
			r.hook.Release(context.Background(), shim.ReleaseRequest{Lease: lease, End: shim.EndStopRequest, Proven: true}, &resp)
			if !reflect.DeepEqual(resp, shim.ReleaseResponse{}) {
				t.Errorf("the records hook decided the release: %+v", resp)
			}
			r.hook.Released(tc.err)
			var held heldLease
			err := readJSON(r.dir, leaseFile, &held)
			if tc.kept {
				if err != nil || !held.IdentityRejected || held.LockID != lease.LockID() {
					t.Errorf("record %+v (%v); want the lease's, marked identity-rejected", held, err)
				}
				return
			}
			if err == nil {
				t.Errorf("record %+v left for the plugin", held)
			}
		})
	}
}

// The LB registration, recorded for the LB hook (its LBRecorder): before
// the ADD is sent, so that the plugin's crash REMOVE finds it
// (removeAfterCrash), and dropped once the REMOVE succeeded or the ADD is
// known to have registered nothing.
func TestRecordHookLBRegistration(t *testing.T) {
	cfg := lbhook.Config{URI: "http://127.0.0.1:1/baragon/v2/request", ServiceID: "web", BasePath: "/web",
		Groups: []string{"default"}, PortLabel: "http"}.WithDefaults()
	client, err := lbhook.NewClient(cfg, lbhook.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := client.ForAlloc("alloc-self", 7)
	if err != nil {
		t.Fatal(err)
	}
	self := lbhook.UpstreamInfo{Upstream: "127.0.0.1:8080"}
	for _, tc := range []struct {
		name    string
		removed bool
	}{
		{"posted: recorded for a crash REMOVE", false},
		{"removed: dropped", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecordRig(t, 0)
			r.hook.LBPosted(cfg, hook, self)
			if tc.removed {
				r.hook.LBRemoved()
			}
			var reg lbRegistration
			err := readJSON(r.dir, lbFile, &reg)
			if tc.removed {
				if err == nil {
					t.Errorf("registration %+v left for a crash REMOVE", reg)
				}
				return
			}
			if err != nil || reg.AllocID != "alloc-self" || reg.Fence != 7 || reg.Upstream != self || reg.Config.URI != cfg.URI {
				t.Errorf("registration %+v (%v); want alloc-self's at fence 7 for %s", reg, err, self.Upstream)
			}
		})
	}
}
