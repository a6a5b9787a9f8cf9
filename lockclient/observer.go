package lockclient

import (
	"sync/atomic"
	"time"
)

// Observer hears what a lease does that no state change shows: every renew
// and, in lease mode, every heartbeat, answered or not, and the cause of a
// loss. A front end's metrics are its one user (shim's metrics hook). Its
// methods run on the lease's own goroutines: they must return at once and
// never call back into the lease.
type Observer interface {
	// Renewed reports one renew or heartbeat.
	Renewed(RenewReport)
	// Lost reports the loss of a lease, once, with its cause.
	Lost(LostCause)
}

// RenewOp is what a RenewReport reports.
type RenewOp string

// The requests that keep a lease.
const (
	OpRenew     RenewOp = "renew"
	OpHeartbeat RenewOp = "heartbeat"
)

// RenewReport is one renew or heartbeat.
type RenewReport struct {
	Op RenewOp
	// Took is from the request's send to its answer.
	Took time.Duration
	// FenceLeft is, for an acknowledged one, the time that was left to the
	// fence deadline when the answer came (before the answer moved it): how
	// close the holder came to fencing itself.
	FenceLeft time.Duration
	// Failed is set when it was not acknowledged.
	Failed bool
}

// LostCause is why a lease was lost, in a word: the label of a metric.
type LostCause string

// The causes of a loss.
const (
	// LostConflict: Nomad answered that another lock ID holds the lock.
	LostConflict LostCause = "conflict"
	// LostExpiry: Nomad answered that the variable holds no lock: the
	// server expired it, or someone released it behind the holder's back.
	LostExpiry LostCause = "expiry"
	// LostFenceDeadline: no renew (or, in lease mode, no heartbeat) was
	// acknowledged before the fence deadline; the holder fenced itself.
	LostFenceDeadline LostCause = "fence_deadline"
	// LostTakeover: a standby sealed the heartbeat to take the lock over.
	LostTakeover LostCause = "lease_takeover"
	// LostDeleted: the lock variable was deleted.
	LostDeleted LostCause = "deleted"
)

// LostCauses lists every cause, so a metric shows each from zero.
func LostCauses() []LostCause {
	return []LostCause{LostConflict, LostExpiry, LostFenceDeadline, LostTakeover, LostDeleted}
}

// observerBox holds a Locker's Observer, set once before its leases run.
type observerBox struct{ p atomic.Pointer[Observer] }

func (b *observerBox) get() Observer {
	if o := b.p.Load(); o != nil {
		return *o
	}
	return nil
}

// SetObserver makes o hear every lease this Locker (and each slot of a
// semaphore) takes from now on. Set it before Acquire.
func (l *Locker) SetObserver(o Observer) {
	l.observer.p.Store(&o)
	for _, sl := range l.slots {
		sl.SetObserver(o)
	}
}
