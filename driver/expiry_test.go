package driver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// The plugin's crash release for a lease whose last acknowledged renew was
// sent 2×TTL ago or more sends nothing (the server may be expiring it, and
// its expiry would clear the next holder's lock); a fresh one is released.
func TestCrashReleaseLeavesAnExpiringLeaseAlone(t *testing.T) {
	held := heldLease{LockID: "id-1", Path: "nomad/jobs/x/lock", Fence: 7, TTL: 10 * time.Second, LockDelay: 10 * time.Second}
	for _, tc := range []struct {
		name     string
		renewed  time.Duration // how long ago
		released bool
	}{
		{"renewed just now", 0, true},
		{"renewed 12s ago (watchdog kill at the fence deadline)", 12 * time.Second, true},
		{"renewed 22s ago (thawed inside the lock delay)", 22 * time.Second, false},
		{"renewed 16.5s ago (at the cutoff)", 16500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int32
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"Path":"nomad/jobs/x/lock"}`))
			}))
			defer ts.Close()
			d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
			err := d.releaseWith(lockclient.Endpoint{Address: ts.URL, Token: "t"}, held,
				lockclient.BootNow().Add(-tc.renewed), nil, time.Time{}, hclog.NewNullLogger())
			if tc.released {
				if err != nil || requests.Load() != 1 {
					t.Fatalf("releaseWith = %v after %d request(s), want one release", err, requests.Load())
				}
				return
			}
			if !errors.Is(err, lockclient.ErrLeftToExpire) || requests.Load() != 0 {
				t.Fatalf("releaseWith = %v after %d request(s), want ErrLeftToExpire and none", err, requests.Load())
			}
		})
	}
	// A record without the time of its last renew (an older version's)
	// is never released.
	d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
	if err := d.releaseWith(lockclient.Endpoint{Address: "http://127.0.0.1:1", Token: "t"}, held, time.Time{}, nil, time.Time{},
		hclog.NewNullLogger()); !errors.Is(err, lockclient.ErrLeftToExpire) {
		t.Fatalf("releaseWith with no last renew = %v, want ErrLeftToExpire", err)
	}
}

// The last renew comes from the lease record (the acquire) or the status
// (every renew), whichever is later, and only from a status of the same
// lease; CLOCK_BOOTTIME nanoseconds on both sides.
func TestLastRenewFromTheStateDir(t *testing.T) {
	acq := lockclient.BootNow().Add(-time.Minute)
	ren := acq.Add(30 * time.Second)
	held := heldLease{Fence: 7, LastRenewBoot: lockclient.BootNanos(acq)}
	for _, tc := range []struct {
		name string
		held heldLease
		st   supervisorStatus
		want time.Time
	}{
		{"status of the same lease", held, supervisorStatus{Fence: 7, LastRenewBoot: lockclient.BootNanos(ren)}, ren},
		{"status of another lease", held, supervisorStatus{Fence: 6, LastRenewBoot: lockclient.BootNanos(ren)}, acq},
		{"no status", held, supervisorStatus{}, acq},
		{"an older record without the acquire's time", heldLease{Fence: 7}, supervisorStatus{Fence: 7, LastRenewBoot: lockclient.BootNanos(ren)}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lastRenew(tc.held, tc.st); !got.Equal(tc.want) {
				t.Fatalf("lastRenew = %v, want %v", got, tc.want)
			}
		})
	}
}

// The supervisor's events carry the last renew into status.json, as
// boottime nanoseconds the plugin reads back.
func TestPublisherRecordsTheLastRenew(t *testing.T) {
	dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	renewed := lockclient.BootNow().Add(-3 * time.Second)
	p := &publisher{dir: dir, path: "nomad/jobs/x/lock", log: hclog.NewNullLogger()}
	p.observe(shim.Event{State: shim.StateHolding, Message: "Acquired lock (fence 7)", Fence: 7, LastRenew: renewed,
		FenceDeadline: renewed.Add(9 * time.Second)})
	var st supervisorStatus
	if err := readJSON(dir, statusFile, &st); err != nil {
		t.Fatal(err)
	}
	if got := lockclient.BootTime(st.LastRenewBoot); !got.Equal(renewed) {
		t.Fatalf("status LastRenewBoot is %v, want %v", got, renewed)
	}
	if left := time.Duration(st.FenceDeadlineBoot - bootNow()); left <= 5*time.Second || left > 6*time.Second {
		t.Fatalf("fence deadline %s from now on boottime, want 6s", left)
	}
}

// A gate's kept lease is good until its release cutoff: a restarted gate
// takes over only a lease that the server cannot be expiring.
func TestKeptGateLeaseEndsAtTheCutoff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		renewed time.Duration // ago
		kept    bool
	}{
		{"renewed 2s ago", 2 * time.Second, true},
		{"renewed 17s ago", 17 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			at := lockclient.BootNanos(lockclient.BootNow().Add(-tc.renewed))
			for name, v := range map[string]any{
				specFile:   gateSpecFile(shim.GateSpec{AllocID: "5d171c8d-1421-633e-e44a-52cb9501d563", Task: "gate"}),
				leaseFile:  heldLease{LockID: "id-1", Fence: 7, TTL: 10 * time.Second, LockDelay: 10 * time.Second, LastRenewBoot: at},
				statusFile: supervisorStatus{Fence: 7, LastRenewBoot: at},
				exitFile:   exitStatus{},
			} {
				if err := writeJSON(dir, name, v); err != nil {
					t.Fatal(err)
				}
			}
			const alloc = "5d171c8d-1421-633e-e44a-52cb9501d563"
			cfg := &drivers.TaskConfig{ID: alloc + "/gate", Name: "gate", AllocID: alloc}
			var g gateLeases
			g.keep(&taskHandle{cfg: cfg, dir: dir, logger: hclog.NewNullLogger()}, dir)
			got := g.take(cfg, dir)
			if (got != nil) != tc.kept {
				t.Fatalf("take = %+v, want kept=%v", got, tc.kept)
			}
			if got != nil && (got.LockID != "id-1" || got.Fence != 7) {
				t.Fatalf("take = %+v", got)
			}
		})
	}
}

// The event of a lease left to expire says so, and why.
func TestLeftToExpireMessage(t *testing.T) {
	err := lockclient.Timing{TTL: 10 * time.Second, LockDelay: 10 * time.Second}.
		MayRelease(lockclient.BootNow().Add(-22*time.Second), lockclient.BootNow())
	msg := shim.LeftToExpireMessage(err)
	for _, want := range []string{"left to expire", "not released", "last acknowledged renew was sent 22", "next holder"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
}
