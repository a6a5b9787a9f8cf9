package lockclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/hashicorp/nomad/api"
)

// MarkReleasedClean records in the variable, under the lease's lock ID, that
// the holder is about to release it having proven its work dead, so that
// the next holder need not wait for it (Holder.ReleasedClean). A release
// without it (by hand, with the lock ID; or the server's expiry) tells the
// next holder that the previous holder's work may still be stopping. It ends
// the renewing: call it only just before Release. An error only costs the
// next holder that wait. Past the release cutoff nothing is written
// (ErrLeftToExpire), as nothing is released.
func (ls *Lease) MarkReleasedClean(ctx context.Context) error {
	return ls.MarkReleasing(ctx, nil, true)
}

// MarkReleasing writes items into the holder's record just before its
// release, under the lease's lock ID, with the clean mark when clean (see
// MarkReleasedClean): what the next holder and the standbys read the moment
// the lock is free (a step-down's Handover.Items). It ends the renewing:
// call it only once the workload is proven dead, just before Release. An
// error costs only what the items would have told.
func (ls *Lease) MarkReleasing(ctx context.Context, items map[string]string, clean bool) error {
	ls.stopRenewing()
	w := itemWrite{op: "mark released", items: maps.Clone(items)}
	if w.items == nil {
		w.items = map[string]string{}
	}
	if clean {
		w.items[itemClean] = "true"
	}
	return ls.writeItem(ctx, w)
}

// SetItem writes one item of the holder's record, one of the caller's own
// (AcquireOptions.Items; value "" deletes it), under the lease's lock ID: a
// holder that withdraws a claim it made at acquire, before it leaves the
// lock to expire. It ends the renewing: the lock then expires on the
// server, 2×TTL after the last renew. Before the lease's fence deadline the
// lock's TTL and delay are written back after the record (writeItem), so
// that the lock may still be adopted, and a new Nomad leader expires it on
// time.
func (ls *Lease) SetItem(ctx context.Context, key, value string) error {
	ls.stopRenewing()
	return ls.writeItem(ctx, itemWrite{op: "write " + key, items: map[string]string{key: value}, restoreBy: ls.FenceDeadline()})
}

// writeItem is Locker.writeItem for this lease, by check-and-set on the
// index of its acquire, or of its own last such write.
func (ls *Lease) writeItem(ctx context.Context, w itemWrite) error {
	ls.mu.Lock()
	w.id, w.lastRenew = ls.id, ls.lastRenew
	ls.mu.Unlock()
	w.index = ls.lastIndex()
	index, err := ls.locker.writeItem(ctx, w)
	if err == nil {
		ls.mu.Lock()
		ls.itemsIndex = index
		ls.mu.Unlock()
	}
	return err
}

// MarkReleasedCleanID is MarkReleasedClean for the lock held under lock ID
// id, acquired at index fence, by a holder that no longer renews it: the
// driver's plugin uses it for a task whose identity no longer authenticates
// (see Lease.MarkReleasedClean). lastRenew is as for
// ReleaseID: from the release cutoff on nothing is written.
func (l *Locker) MarkReleasedCleanID(ctx context.Context, id string, fence uint64, lastRenew time.Time) error {
	_, err := l.writeItem(ctx, itemWrite{op: "mark released", id: id, index: fence, items: map[string]string{itemClean: "true"}, lastRenew: lastRenew})
	return err
}

// itemWrite is one write of an item of the lock's record (writeItem).
type itemWrite struct {
	op        string            // for errors: what the write is for
	id        string            // the lock ID
	index     uint64            // the variable's ModifyIndex as the holder left it
	items     map[string]string // the items to set; a value "" deletes the item
	lastRenew time.Time
	// restoreBy, if set, is the lease's fence deadline: before it, the
	// lock's TTL and delay are written back after the record.
	restoreBy time.Time
}

// itemTTLUnset marks a record written without the lock's TTL (writeItem),
// until they are written back: a lease that says so is not adopted.
const itemTTLUnset = "lock_ttl_unset"

// writeItem sets (or deletes) items of the lock's record, and returns
// the variable's new ModifyIndex. Nothing is written from the release
// cutoff on (ErrLeftToExpire): what may no longer be released is not
// written either.
//
// Nomad takes a write of a locked variable only with the lock's ID and no
// TTL or delay ("variable should not contain lock definition"), and then
// stores the lock with its own defaults, TTL 15s and delay 15s
// (VariableLock.Canonicalize), whatever the holder asked for: a renew would
// set the server's timer to 2 × 15s, and a new leader restores it so
// (nomad/locks.go), shorter than the holder's own bounds when its TTL is
// longer; and the same write on a free variable creates a lock that no
// timer expires. So:
//
//   - the write is a check-and-set on w.index, the ModifyIndex of the
//     holder's acquire (or its own last write): every release, expiry and
//     acquire moves it, so it lands only on the lock its holder left, and
//     never creates one on a free variable (the answer then wraps ErrLost);
//   - before w.restoreBy (the lease's fence deadline), a lock-acquire with
//     the lock's own ID writes the record again with the lock's TTL and
//     delay: Nomad takes an acquire by the ID that holds the lock, and the
//     server's timer, still running (it fires 2×TTL after the last renew,
//     long after the fence deadline), is left as it is;
//   - until then the record says itemTTLUnset, and Adopt refuses it.
func (l *Locker) writeItem(ctx context.Context, w itemWrite) (uint64, error) {
	if err := l.mayRelease(w.op, w.lastRenew); err != nil {
		return 0, err
	}
	if l.cas == nil {
		return 0, fmt.Errorf("%s %s: no check-and-set write available", w.op, l.cfg.Path)
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	cur, _, err := l.vars.Peek(l.cfg.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil {
		return 0, l.classify(w.op, err)
	}
	if cur == nil || cur.ModifyIndex != w.index {
		return 0, fmt.Errorf("%s %s: %w: the variable changed since its holder's acquire (index %d, the holder's %d)",
			w.op, l.cfg.Path, ErrLost, modifyIndex(cur), w.index)
	}
	items := maps.Clone(cur.Items)
	if items == nil {
		items = map[string]string{}
	}
	for k, v := range w.items {
		if v == "" {
			delete(items, k)
		} else {
			items[k] = v
		}
	}
	items[itemTTLUnset] = "true"
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Items: items, Lock: &api.VariableLock{ID: w.id}, ModifyIndex: w.index}
	out, _, err := l.cas.CheckedUpdate(v, l.writeOptions(rctx))
	var conflict api.ErrCASConflict
	switch {
	case errors.As(err, &conflict):
		return 0, fmt.Errorf("%s %s: %w: the variable changed since its holder's acquire", w.op, l.cfg.Path, ErrLost)
	case err != nil:
		return 0, l.classify(w.op, err)
	case out == nil:
		return 0, fmt.Errorf("%s %s: Nomad answered without the variable", w.op, l.cfg.Path)
	}
	index := out.ModifyIndex
	if w.restoreBy.IsZero() || !l.clock.Now().Before(w.restoreBy) {
		return index, nil
	}
	delete(items, itemTTLUnset)
	rv := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Items: items,
		Lock: &api.VariableLock{ID: w.id, TTL: l.cfg.TTL.String(), LockDelay: l.cfg.LockDelay.String()}}
	actx, cancel := l.clock.WithDeadline(ctx, earliest(l.clock.Now().Add(l.cfg.RequestTimeout), w.restoreBy))
	defer cancel()
	back, _, err := l.vars.AcquireLock(rv, l.writeOptions(actx))
	if err != nil || back == nil {
		l.log.Warn("the lock's record was written, but its TTL could not be written back: it is not adopted, "+
			"and a new Nomad leader expires it by Nomad's default TTL", "op", w.op, "error", err)
		return index, nil
	}
	return back.ModifyIndex, nil
}
