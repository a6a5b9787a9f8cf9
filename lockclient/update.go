package lockclient

import (
	"context"
)

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
