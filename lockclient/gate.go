package lockclient

import (
	"context"
	"fmt"
	"net/http"

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
	alloc, meta, err := l.api.Allocations().Info(id, q.WithContext(rctx))
	if err != nil {
		switch statusCode(err) {
		case http.StatusForbidden:
			return nil, 0, &AllocPermissionError{AllocID: id, Namespace: namespace, JobID: l.cfg.Holder.JobID, Err: err}
		case http.StatusNotFound:
			return nil, 0, fmt.Errorf("read allocation %s: %w", id, ErrAllocGone)
		}
		return nil, 0, fmt.Errorf("read allocation %s: %w", id, err)
	}
	var last uint64
	if meta != nil {
		last = meta.LastIndex
	}
	return alloc, last, nil
}

// ErrAllocGone means the allocation no longer exists on the servers (a
// purged job, or garbage collection).
var ErrAllocGone = fmt.Errorf("allocation not found")

// AllocPermissionError is a 403 on reading the task's own allocation. Its
// message carries the ACL policy line that fixes it.
type AllocPermissionError struct {
	AllocID, Namespace, JobID string
	Err                       error
}

func (e *AllocPermissionError) Unwrap() error { return e.Err }

func (e *AllocPermissionError) Error() string {
	ns := e.Namespace
	if ns == "" {
		ns = "default"
	}
	job := e.JobID
	if job == "" {
		job = "<job>"
	}
	return fmt.Sprintf(`read allocation %s: permission denied (HTTP 403).
A gate reads its own allocation (its job, and whether its gated tasks are dead) with its workload identity,
which needs the "read-job" capability in namespace %q; the implicit workload-identity policy does not grant it.
Add to the job's policy (beside the lock path's "write"):

namespace %q {
  capabilities = ["read-job"]
}

and apply it to the job: nomad acl policy apply -namespace %s -job %s singleton-lock-%s singleton-lock.policy.hcl`,
		e.AllocID, ns, ns, ns, job, job)
}

// Adopt takes over a lease that this holder's previous run still holds on
// the server (a gate that Nomad restarted inside its allocation): one renew
// under the recorded lock ID proves it is still ours, and the lease goes on
// from there with fence as its fencing token. A lock that is no longer held
// under id wraps ErrLost.
func (l *Locker) Adopt(ctx context.Context, id string, fence uint64) (*Lease, error) {
	sent := l.clock.Now()
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Lock: &api.VariableLock{ID: id}}
	_, _, err := l.vars.RenewLock(v, l.writeOptions(rctx))
	switch code := statusCode(err); {
	case err == nil:
	case code == http.StatusConflict || code == http.StatusNotFound || notHeld(err):
		return nil, &LostError{Reason: fmt.Sprintf("the lease of the previous run (fence %d) is no longer held (Nomad answered %d)", fence, code)}
	default:
		return nil, l.classify("adopt", err)
	}
	lease := newLease(l, id, fence, sent, Holder{})
	l.log.Info("lock adopted from the previous run", "fence", fence)
	return lease, nil
}

// MarkReleasedClean records in the variable, under the lease's lock ID, that
// the holder is about to release it having proven its work dead, so that
// the next holder need not wait for it (Holder.ReleasedClean). A release
// without it (by hand, with the lock ID; or the server's expiry) tells the
// next holder that the previous holder's work may still be stopping. Call
// it just before Release; an error only costs the next holder that wait.
func (ls *Lease) MarkReleasedClean(ctx context.Context) error {
	l := ls.locker
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	cur, _, err := l.vars.Peek(l.cfg.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil {
		return l.classify("mark released", err)
	}
	items := map[string]string{}
	if cur != nil {
		for k, v := range cur.Items {
			items[k] = v
		}
	}
	items[itemClean] = "true"
	// The lock ID alone: Nomad (v1.11) refuses a plain write whose lock
	// carries a TTL or a lock delay (400 "variable should not contain lock
	// definition"), and stores the lock as sent. Its TTL and delay are then
	// zero in the variable; the release follows at once, and should it fail
	// and the lock expire early, our work is already proven dead.
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Items: items,
		Lock: &api.VariableLock{ID: ls.id}}
	if _, _, err := l.vars.Update(v, l.writeOptions(rctx)); err != nil {
		return l.classify("mark released", err)
	}
	return nil
}
