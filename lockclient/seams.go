package lockclient

import (
	"context"
	"time"

	"github.com/hashicorp/nomad/api"
)

// lockAPI is the part of Nomad's Variables API a lease needs: a read, which
// is a blocking query when the options carry a WaitIndex, and the three lock
// operations. *api.Variables implements it; the unit tests put a fake in its
// place, so Acquire, renewing, fencing and Release run without an agent. The
// options carry the request's context (and so its deadline).
type lockAPI interface {
	Peek(path string, q *api.QueryOptions) (*api.Variable, *api.QueryMeta, error)
	AcquireLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error)
	RenewLock(v *api.Variable, w *api.WriteOptions) (*api.VariableMetadata, *api.WriteMeta, error)
	ReleaseLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error)
	// Update writes the variable; a locked one only with its lock ID.
	Update(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error)
	// CheckedCreate writes the variable only if it does not exist yet
	// (check-and-set on index 0); else the error is an api.ErrCASConflict.
	CheckedCreate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error)
}

// clock is every source of time a lease reads: now, timers and request
// deadlines. The lease's safety is a matter of timing (renew every
// RenewInterval, give up at the fence deadline, bound each request by it), so
// it takes time from here, never from package time, and tests can run a
// lease's whole life on a fake clock in microseconds.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
	// WithDeadline is context.WithDeadline measured on this clock: the
	// context ends with context.DeadlineExceeded once the clock reaches t.
	WithDeadline(ctx context.Context, t time.Time) (context.Context, context.CancelFunc)
}

// timer is the part of *time.Timer the lease uses, with Go 1.23 semantics:
// after Reset or Stop no value from before is delivered.
type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration) bool
	Stop() bool
}

// withTimeout is context.WithTimeout on c.
func withTimeout(ctx context.Context, c clock, d time.Duration) (context.Context, context.CancelFunc) {
	return c.WithDeadline(ctx, c.Now().Add(d))
}

// sleep waits d on c, or until ctx ends, and then returns ctx.Err(). A d of
// zero or less returns at once.
func sleep(ctx context.Context, c clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}
