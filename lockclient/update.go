package lockclient

import (
	"context"
	"fmt"
	"net/http"

	"github.com/hashicorp/nomad/api"
)

// jobAllocsAPI is the part of Nomad's Jobs API a rolling update needs: the
// allocations of one job. *api.Jobs implements it.
type jobAllocsAPI interface {
	Allocations(jobID string, allAllocs bool, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error)
}

// JobAllocations lists the allocations of job jobID in namespace, through
// the same endpoint and token as the lock. With index > 0 it is a blocking
// query that returns once they change past index, or after BlockingWait.
// A standby uses it to find a newer version of its group (an allocation of
// a rolling update) before it takes a lock that came free, and a holder
// stopped by an update to find the allocation it hands over to.
//
// Like Allocation it needs "read-job" in the namespace; a 403 wraps
// ErrAllocHidden.
func (l *Locker) JobAllocations(ctx context.Context, jobID, namespace string, index uint64) ([]*api.AllocationListStub, uint64, error) {
	timeout := l.cfg.RequestTimeout
	q := &api.QueryOptions{Namespace: namespace}
	if index > 0 {
		q.WaitIndex = index
		q.WaitTime = l.cfg.BlockingWait
		timeout += l.cfg.BlockingWait + l.cfg.BlockingWait/16
	}
	if l.jobs == nil {
		return nil, 0, fmt.Errorf("read allocations of job %s: this locker has no Nomad client", jobID)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stubs, meta, err := l.jobs.Allocations(jobID, false, q.WithContext(rctx))
	if err != nil {
		if statusCode(err) == http.StatusForbidden {
			return nil, 0, fmt.Errorf("read allocations of job %s: %w (%v)", jobID, ErrAllocHidden, err)
		}
		return nil, 0, fmt.Errorf("read allocations of job %s: %w", jobID, err)
	}
	var last uint64
	if meta != nil {
		last = meta.LastIndex
	}
	return stubs, last, nil
}

// deferral is the acquire loop's memory of a grace it gives another
// allocation (AcquireOptions.Defer): since when, while the lock looks free.
type deferral struct{ since, until int64 }

// looksFree reports whether the variable, as read, shows a lock that
// nobody holds: no variable; no Lock field (Nomad drops it on release) for
// a token that sees locks (one that was shown a Lock field before, or that
// seesLocks says is); or a holder that marked its release clean (any
// token: the mark is written just before the release), or a record that
// shows the release mark (written after the release; any acquire replaces
// the record). A lock that expired
// is not seen free by a token that does not see locks.
func (l *Locker) looksFree(ctx context.Context, s snapshot) bool {
	switch {
	case s.v == nil:
		return true
	case s.v.Lock != nil:
		l.sawLock.Store(true)
		return s.v.Lock.ID == ""
	case holderFromItems(s.v.Items).ReleasedClean, !holderFromItems(s.v.Items).ReleasedAt.IsZero():
		return true
	}
	return l.sawLock.Load() || l.seesLockState(ctx)
}

// seesLockState is seesLocks, asked once: whether this token is shown the
// Lock field of a held lock. A Locker over locktest (no Nomad client) is,
// as locktest shows it.
func (l *Locker) seesLockState(ctx context.Context) bool {
	if l.api == nil {
		return true
	}
	l.seesOnce.Do(func() { l.sees = l.seesLocks(ctx) })
	return l.sees
}

// heldVisibly reports whether the read shows the lock held (a token shown
// lock state).
func (s snapshot) heldVisibly() bool {
	return s.v != nil && s.v.Lock != nil && s.v.Lock.ID != ""
}
