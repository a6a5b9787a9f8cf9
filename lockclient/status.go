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
	st := Status{Path: l.cfg.Path, Namespace: l.cfg.Namespace}
	v := snap.v
	if v == nil {
		st.HeldKnown = true
		return st, nil
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
		return st, nil
	}
	st.HeldKnown = l.seesLocks(ctx)
	return st, nil
}

// seesLocks reports whether a missing Lock field means "not held": true with
// ACLs disabled or a management token, false for any other token.
func (l *Locker) seesLocks(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	tok, _, err := l.api.ACLTokens().Self((&api.QueryOptions{}).WithContext(rctx))
	if err != nil || tok == nil {
		return false
	}
	return tok.Type == "management" || tok.AccessorID == aclsDisabledAccessor
}

// aclsDisabledAccessor is what token/self answers when the cluster runs without ACLs.
const aclsDisabledAccessor = "acls-disabled"
