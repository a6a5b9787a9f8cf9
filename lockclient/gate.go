package lockclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Allocation reads one allocation through the same endpoint and token as the
// lock: its job, desired status and the state of each of its tasks. With
// index > 0 it is a blocking query that returns once the allocation changes
// past index, or after BlockingWait. A gate (see shim.Gate) uses it to learn
// its own job, to notice that its allocation is being stopped while it waits,
// and to confirm that its gated tasks are dead before it releases.
//
// The workload identity can read its allocation only with the "read-job"
// capability in the allocation's namespace (the implicit policy does not
// grant it); a 403 says so.
func (l *Locker) Allocation(ctx context.Context, id, namespace string, index uint64) (*api.Allocation, uint64, error) {
	timeout := l.cfg.RequestTimeout
	q := &api.QueryOptions{Namespace: namespace}
	if index > 0 {
		q.WaitIndex = index
		q.WaitTime = l.cfg.BlockingWait
		timeout += l.cfg.BlockingWait + l.cfg.BlockingWait/16
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if l.allocs == nil {
		return nil, 0, fmt.Errorf("read allocation %s: this locker has no Nomad client", id)
	}
	alloc, meta, err := l.allocs.Info(id, q.WithContext(rctx))
	if err != nil {
		switch statusCode(err) {
		case http.StatusForbidden:
			return nil, 0, l.NewAllocPermissionError(id, namespace, err)
		case http.StatusNotFound:
			return nil, 0, fmt.Errorf("read allocation %s: %w", id, ErrAllocGone)
		}
		if body := responseBody(err); strings.Contains(body, "Unknown allocation") {
			// Nomad's answer for an allocation that exists but that the
			// token may not read (no read-job); one that is gone gets a
			// 404. A gate reads its own allocation, and knows which it
			// can be.
			return nil, 0, fmt.Errorf("read allocation %s: %w (%w)", id, ErrAllocGone, ErrAllocHidden)
		}
		if body := responseBody(err); strings.Contains(body, "allocation does not exist") {
			// The identity's own allocation is gone (a purged job), so
			// the token no longer authenticates.
			return nil, 0, fmt.Errorf("read allocation %s: %w", id, ErrAllocGone)
		}
		if identityRejected(err) {
			// The Task API's answer when the identity does not
			// authenticate: its allocation is gone (a purged job), or the
			// servers could not be asked.
			return nil, 0, fmt.Errorf("read allocation %s: %w (%v)", id, ErrIdentityRejected, err)
		}
		return nil, 0, fmt.Errorf("read allocation %s: %w", id, err)
	}
	var last uint64
	if meta != nil {
		last = meta.LastIndex
	}
	return alloc, last, nil
}

// ErrAllocGone means the servers do not know the allocation: it is gone (a
// purged job, garbage collection), or the token may not read it (Nomad
// answers "Unknown allocation" without read-job).
var ErrAllocGone = fmt.Errorf("allocation not found")

// ErrAllocHidden means that Nomad answered "Unknown allocation": the
// allocation exists but the token may not read it (no read-job in its
// namespace). Such errors wrap ErrAllocGone too, for callers whose token
// can read its own allocation unless that is gone.
var ErrAllocHidden = fmt.Errorf("the token may not read the allocation (read-job)")

// ErrIdentityRejected means the Task API could not authenticate the
// workload identity: its allocation is gone from the servers (a purged job),
// or, for a while, the servers could not be asked.
var ErrIdentityRejected = fmt.Errorf("the workload identity no longer authenticates")

// AllocPermissionError is a 403 on reading the task's own allocation. Its
// message carries the ACL policy line that fixes it, and how to apply it to
// the gate task alone.
type AllocPermissionError struct {
	AllocID, Namespace, JobID, Group, Task string
	// Who says what reads the allocation and why ("" for a gate).
	Who string
	Err error
}

func (e *AllocPermissionError) Unwrap() error { return e.Err }

func (e *AllocPermissionError) Error() string {
	ns, job := policyTarget(e.Namespace, e.JobID)
	group, task := cmp.Or(e.Group, "<group>"), cmp.Or(e.Task, "<gate task>")
	who := cmp.Or(e.Who, "A gate reads allocations (its own job and desired status, the previous holder's tasks)")
	return fmt.Sprintf(`read allocation %s: permission denied (HTTP 403, or "Unknown allocation" for an allocation that runs).
%s with its workload identity,
which needs the "read-job" capability in namespace %q; the implicit workload-identity policy does not grant it.
Add to the task's policy (beside the lock path's "write"; examples/acl/singleton-gate.policy.hcl):

namespace %q {
  capabilities = ["read-job"]
}

and apply it to that task alone (a policy on the whole job reaches its other tasks' identities too):

  nomad acl policy apply -namespace %s -job %s -group %s -task %s singleton-gate-%s singleton-gate.policy.hcl`,
		e.AllocID, who, ns, ns, ns, job, group, task, job)
}

// NewAllocPermissionError is the error for a read of allocation id that the
// locker's identity may not make.
func (l *Locker) NewAllocPermissionError(id, namespace string, err error) *AllocPermissionError {
	h := l.cfg.Holder
	return &AllocPermissionError{AllocID: id, Namespace: namespace, JobID: h.JobID, Group: h.Group, Task: h.Task, Err: err}
}

// Adopt takes over a lease that this holder's previous run still holds on
// the server (a gate that Nomad restarted inside its allocation): one renew
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

// MarkReleasedClean records in the variable, under the lease's lock ID, that
// the holder is about to release it having proven its work dead, so that
// the next holder need not wait for it (Holder.ReleasedClean). A release
// without it (by hand, with the lock ID; or the server's expiry) tells the
// next holder that the previous holder's work may still be stopping. It ends
// the renewing: call it only just before Release. An error only costs the
// next holder that wait. Past the release cutoff nothing is written
// (ErrLeftToExpire), as nothing is released.
func (ls *Lease) MarkReleasedClean(ctx context.Context) error {
	ls.stopRenewing()
	return ls.writeItem(ctx, itemWrite{op: "mark released", items: map[string]string{itemClean: "true"}})
}

// MarkNotGatedDirect removes, under the lease's lock ID, the holder's
// claim that its gate kills its gated tasks itself (Holder.GatedDirect):
// a gate that could not prove them dead makes the next holder wait for
// Nomad's report of them instead of trusting the lock's expiry. It ends
// the renewing: the lock then expires on the server, 2×TTL after the last
// renew. Before the lease's fence deadline the lock's TTL and delay are
// written back after the record (writeItem), so that the lock may still be
// adopted, and a new Nomad leader expires it on time.
func (ls *Lease) MarkNotGatedDirect(ctx context.Context) error {
	ls.stopRenewing()
	return ls.writeItem(ctx, itemWrite{op: "withdraw gated_direct", items: map[string]string{itemDirect: ""}, restoreBy: ls.FenceDeadline()})
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
// driver's plugin uses it for a gate whose identity no longer
// authenticates (see Lease.MarkReleasedClean). lastRenew is as for
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
