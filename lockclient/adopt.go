package lockclient

import (
	"context"
	"fmt"
	"net/http"

	"github.com/hashicorp/nomad/api"
)

// Adopt takes over a lease that this holder's previous run still holds on
// the server (a task that Nomad restarted inside its allocation): one renew
// under the recorded lock ID proves it is still ours, and the lease goes on
// from there with fence as its fencing token. A lock that is no longer held
// under id wraps ErrLost.
func (l *Locker) Adopt(ctx context.Context, id string, fence uint64) (*Lease, error) {
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	// A record written without the lock's TTL (writeItem) is not renewed:
	// the renew would set the server's timer from Nomad's default TTL.
	cur, _, err := l.vars.Peek(l.cfg.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	switch {
	case err != nil:
		return nil, l.classify("adopt", err)
	case cur == nil:
		return nil, &LostError{Reason: fmt.Sprintf("the lock variable of the previous run (fence %d) is gone", fence)}
	case cur.Items[itemTTLUnset] == "true":
		return nil, &LostError{Reason: fmt.Sprintf("the previous run (fence %d) rewrote the lock's record, and Nomad keeps such a lock "+
			"without its own TTL: a renew would not keep it for that TTL, so it is left to expire", fence)}
	}
	sent := l.clock.Now()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Lock: &api.VariableLock{ID: id}}
	_, _, err = l.vars.RenewLock(v, l.writeOptions(rctx))
	switch code := statusCode(err); {
	case err == nil:
	case code == http.StatusConflict || code == http.StatusNotFound || notHeld(err):
		return nil, &LostError{Reason: fmt.Sprintf("the lease of the previous run (fence %d) is no longer held (Nomad answered %d)", fence, code)}
	default:
		return nil, l.classify("adopt", err)
	}
	lease := newLease(l, id, fence, sent, Holder{})
	lease.Adopted = true
	lease.mu.Lock()
	lease.itemsIndex = cur.ModifyIndex // the previous run's record as it left it
	lease.mu.Unlock()
	if l.cfg.Heartbeat != nil {
		// Lease mode: the heartbeat goes on from the previous run's, by
		// check-and-set, unless a standby sealed it (or another holder's
		// replaced it) meanwhile: the lease is then not ours to take over.
		if err := lease.adoptHeartbeat(ctx); err != nil {
			lease.stopRenewing()
			return nil, err
		}
		close(lease.beating)
	}
	l.log.Info("lock adopted from the previous run", "fence", fence)
	return lease, nil
}

// AdoptPath is Adopt of the lock at path, which the previous run held: for
// a semaphore, the slot among its slots whose path it is (the lease holds
// that slot); for a plain lock, its own path ("" for it too). A path that
// is not the locker's, nor one of its slots (the job's lock block changed
// between the runs), wraps ErrLost: the lease is not ours to take over.
func (l *Locker) AdoptPath(ctx context.Context, path, id string, fence uint64) (*Lease, error) {
	if l.cfg.Holders == 0 {
		if path != "" && path != l.cfg.Path {
			return nil, &LostError{Reason: fmt.Sprintf("the previous run held %s, not %s", path, l.cfg.Path)}
		}
		return l.Adopt(ctx, id, fence)
	}
	for i, sl := range l.slots {
		if sl.cfg.Path != path {
			continue
		}
		lease, err := sl.Adopt(ctx, id, fence)
		if lease != nil {
			lease.Slot, lease.Holders = i, l.cfg.Holders
		}
		return lease, err
	}
	return nil, &LostError{Reason: fmt.Sprintf("the previous run held %q, which is no slot of the semaphore %s of %d", path, l.cfg.Path, l.cfg.Holders)}
}

// Retake is Adopt of the lock this lease held (for a semaphore, its
// slot's): the lease it returns holds the same slot.
func (ls *Lease) Retake(ctx context.Context) (*Lease, error) {
	l, err := ls.locker.Adopt(ctx, ls.id, ls.Fence)
	if l != nil {
		l.Slot, l.Holders = ls.Slot, ls.Holders
	}
	return l, err
}
