package lockclient

import (
	"errors"
	"fmt"
	"time"
)

// Nomad expires a lock in two steps (nomad/locks.go of v1.11.2): 2×TTL
// after the last renew the leader's timer fires, and LockDelay later
// invalidateVariableLock releases the variable's lock without a lock ID.
// The state store checks the ID only when one is given
// (state/state_store_variables.go, VarLockRelease), so that late release
// clears whatever lock the variable holds by then. If the old holder
// releases inside [2×TTL, 2×TTL + LockDelay] its ID still matches, the next
// holder acquires at once, and the pending expiry then clears the next
// holder's lock while its workload runs: a third holder can start beside
// it. So a lease whose expiry may have begun is never released by anyone;
// it is left to expire, which frees it for the next holder without a
// pending expiry behind it.

// ErrLeftToExpire means a lease was not released (nor written) because the
// server may already be expiring it: it becomes free on its own, 2×TTL +
// LockDelay after its last renew.
var ErrLeftToExpire = errors.New("left to expire: the server may already be expiring the lock")

// ReleaseCutoff is the moment, on the holder's clock, from which a lease
// whose last acknowledged renew (or acquire) was sent at lastRenew is left
// to expire: 2×TTL after lastRenew (the server's timer started no
// earlier), less FenceMargin (clock-rate error and scheduling) and less
// RequestTimeout (so that a release sent before the cutoff arrives before
// the server's timer can fire; each attempt is bounded by it).
func (t Timing) ReleaseCutoff(lastRenew time.Time) time.Time {
	t = t.withDefaults()
	return lastRenew.Add(2*t.TTL - t.FenceMargin - t.RequestTimeout)
}

// MayRelease decides whether a lock whose last acknowledged renew (or
// acquire) was sent at lastRenew may still be released (or written) at
// now, both on one clock that counts suspended time (BootNow). nil means
// yes; an error wrapping ErrLeftToExpire says why not. A zero lastRenew is
// unknown, so no.
func (t Timing) MayRelease(lastRenew, now time.Time) error {
	t = t.withDefaults()
	if lastRenew.IsZero() {
		return fmt.Errorf("%w: when its last renew was sent is unknown", ErrLeftToExpire)
	}
	cutoff := t.ReleaseCutoff(lastRenew)
	if now.Before(cutoff) {
		return nil
	}
	return fmt.Errorf("%w: its last acknowledged renew was sent %s ago, and Nomad may expire it from 2×TTL (%s) after that, "+
		"then clear whatever lock the variable holds %s later (lock delay): a release now could let that clear the next holder's lock; "+
		"it becomes free on its own within %s",
		ErrLeftToExpire, now.Sub(lastRenew).Round(time.Millisecond), 2*t.TTL, t.LockDelay,
		max(lastRenew.Add(2*t.TTL+t.LockDelay).Sub(now), 0).Round(time.Second))
}

// mayRelease is MayRelease now, on the locker's clock, for op on its path.
func (l *Locker) mayRelease(op string, lastRenew time.Time) error {
	if err := l.cfg.MayRelease(lastRenew, l.clock.Now()); err != nil {
		return fmt.Errorf("%s %s: %w", op, l.cfg.Path, err)
	}
	return nil
}
