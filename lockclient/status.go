package lockclient

import (
	"context"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Status is what `lock status` reports about a lock variable.
type Status struct {
	Path      string
	Namespace string
	Exists    bool
	// HeldKnown is false when the token cannot see lock state: Nomad shows the
	// Lock field only to management tokens (or with ACLs disabled).
	HeldKnown bool
	Held      bool
	// Holder is the last holder recorded in the Items; it stays after a release.
	Holder Holder
	// Fence is the variable's ModifyIndex: the holder's fencing token while held.
	Fence      uint64
	TTL        string
	LockDelay  string
	ModifiedAt time.Time
}

// Status reads the variable once and reports its lock state.
func (l *Locker) Status(ctx context.Context) (Status, error) {
	snap, _, err := l.read(ctx, 0)
	if err != nil {
		return Status{}, err
	}
	return l.statusOf(ctx, snap), nil
}

// StatusAfter is a blocking read of the lock: it answers once the
// variable's ModifyIndex passes index (at once for index 0, or after the
// blocking wait), with the lock's status and the index to pass next time.
// A follower of the holder record (`lock lb follow`) calls it in a loop.
func (l *Locker) StatusAfter(ctx context.Context, index uint64) (Status, uint64, error) {
	snap, next, err := l.read(ctx, index)
	if err != nil {
		return Status{}, 0, err
	}
	return l.statusOf(ctx, snap), next, nil
}

// Permanent reports whether err, from a read of the lock, will not go away
// by retrying: permission denied, or a bad request.
func Permanent(err error) bool { return permanent(err) }

func (l *Locker) statusOf(ctx context.Context, snap snapshot) Status {
	st := Status{Path: l.cfg.Path, Namespace: l.cfg.Namespace}
	v := snap.v
	if v == nil {
		st.HeldKnown = true
		return st
	}
	st.Exists = true
	st.Namespace = v.Namespace
	st.Holder = holderFromItems(v.Items)
	st.Fence = v.ModifyIndex
	st.ModifiedAt = time.Unix(0, v.ModifyTime)
	st.TTL, st.LockDelay = st.Holder.TTL.String(), st.Holder.LockDelay.String()
	if v.Lock != nil {
		st.HeldKnown = true
		st.Held = v.Lock.ID != ""
		st.TTL, st.LockDelay = v.Lock.TTL, v.Lock.LockDelay
		return st
	}
	st.HeldKnown = l.seesLocks(ctx)
	return st
}

// seesLocks reports whether a missing Lock field means "not held": true with
// ACLs disabled or a management token, false for any other token.
func (l *Locker) seesLocks(ctx context.Context) bool {
	if l.api == nil {
		return false // a lock API of locktest's: no ACL to ask
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	tok, _, err := l.api.ACLTokens().Self((&api.QueryOptions{}).WithContext(rctx))
	if err != nil || tok == nil {
		return false
	}
	return tok.Type == "management" || tok.AccessorID == aclsDisabledAccessor
}

// aclsDisabledAccessor is what token/self answers when the cluster runs without ACLs.
const aclsDisabledAccessor = "acls-disabled"
