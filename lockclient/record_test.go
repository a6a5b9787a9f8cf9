package lockclient_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Writes of the lock's record under its lock ID (a holder's withdrawal of
// an item of its own, the mark of a clean release) leave the lock as its holder
// had it, with its TTL and delay, or write nothing: Nomad stores a lock
// written by a plain write with its own default TTL and delay (a renew or a
// new leader then times it by those), and a plain write with a lock ID
// makes a lock of a free variable (locktest answers as Nomad does).
func TestRecordWritesKeepTheLock(t *testing.T) {
	cfg := lockclient.Config{Path: "nomad/jobs/web/gate/lock", Timing: locktest.Timing(), Holder: lockclient.Holder{AllocID: "alloc-self"}}
	ctx := context.Background()
	lockOf := func(srv *locktest.Server) *api.VariableLock {
		v, _, _ := srv.Peek(cfg.Path, &api.QueryOptions{})
		if v == nil {
			return nil
		}
		return v.Lock
	}

	t.Run("a withdrawal keeps the TTL, and the lease adoptable", func(t *testing.T) {
		srv := locktest.New()
		l := srv.Locker(t, cfg)
		lease := acquireWithin(t, l, lockclient.AcquireOptions{Items: map[string]string{"gated_direct": "true"}})
		if items := srv.Items(); items["gated_direct"] != "true" {
			t.Fatalf("record %v, want the caller's item", items)
		}
		if err := lease.SetItem(ctx, "gated_direct", ""); err != nil {
			t.Fatalf("SetItem: %v", err)
		}
		if lk := lockOf(srv); lk == nil || lk.ID != lease.LockID() || lk.TTL != cfg.Timing.TTL.String() {
			t.Fatalf("after the write the lock is %+v, want ours with TTL %s", lk, cfg.Timing.TTL)
		}
		if items := srv.Items(); items["gated_direct"] != "" || items["holder_alloc_id"] != "alloc-self" {
			t.Fatalf("record %v, want the holder's without the item withdrawn", items)
		}
		adopted, err := l.Adopt(ctx, lease.LockID(), lease.Fence)
		if err != nil {
			t.Fatalf("Adopt after the withdrawal: %v", err)
		}
		release(t, adopted)
	})

	t.Run("a mark on a released lock makes no lock", func(t *testing.T) {
		srv := locktest.New()
		l := srv.Locker(t, cfg)
		lease := acquireWithin(t, l, lockclient.AcquireOptions{})
		id, fence, renewed := lease.LockID(), lease.Fence, lease.LastRenew()
		release(t, lease)
		if err := l.MarkReleasedCleanID(ctx, id, fence, renewed); !errors.Is(err, lockclient.ErrLost) {
			t.Fatalf("MarkReleasedCleanID on a released lock = %v, want ErrLost", err)
		}
		if srv.Held() || lockOf(srv) != nil {
			t.Fatalf("the write made a lock of the free variable: %+v", lockOf(srv))
		}
	})

	t.Run("a mark on a lock another holder took writes nothing", func(t *testing.T) {
		srv := locktest.New()
		l := srv.Locker(t, cfg)
		lease := acquireWithin(t, l, lockclient.AcquireOptions{})
		id, fence, renewed := lease.LockID(), lease.Fence, lease.LastRenew()
		srv.TakeOver(time.Second)
		if err := l.MarkReleasedCleanID(ctx, id, fence, renewed); !errors.Is(err, lockclient.ErrLost) {
			t.Fatalf("MarkReleasedCleanID on a lock taken over = %v, want ErrLost", err)
		}
		if items := srv.Items(); items["holder_alloc_id"] != locktest.OtherAlloc || items["released_clean"] != "" {
			t.Fatalf("the other holder's record is now %v", items)
		}
	})

	t.Run("a record left without its TTL is not adopted", func(t *testing.T) {
		srv := locktest.New()
		l := srv.Locker(t, cfg)
		lease := acquireWithin(t, l, lockclient.AcquireOptions{})
		items := srv.Items()
		items["lock_ttl_unset"] = "true"
		srv.SetItems(items)
		if _, err := l.Adopt(ctx, lease.LockID(), lease.Fence); !errors.Is(err, lockclient.ErrLost) {
			t.Fatalf("Adopt of a lock written without its TTL = %v, want ErrLost", err)
		}
		release(t, lease)
	})
}
