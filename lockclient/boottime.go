package lockclient

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The lease's deadlines race the server's lock timers, which run on the
// server's clock whatever happens to this host. Go's monotonic clock
// (CLOCK_MONOTONIC) stops while the host is suspended (a laptop lid, a VM
// paused for migration), so a deadline measured on it moves later by the
// time suspended: a fence or stop deadline, or the release cutoff, would
// then pass on the server long before it passes here. Every deadline of
// ours is measured on CLOCK_BOOTTIME instead, which counts suspended time,
// and timers re-read it at least every bootTimerStep: after a resume a
// wait ends at most that much later than its deadline, never a suspend
// later.

// bootTimerStep is the longest a boottime timer sleeps on Go's monotonic
// clock before it reads CLOCK_BOOTTIME again.
const bootTimerStep = time.Second

// bootClock is the clock of production: times are CLOCK_BOOTTIME readings
// laid over time.Now() at one anchor, so they print as dates. Compare them
// with each other, or with Now, and measure to them with BootUntil.
//
// Where they meet the standard library all the same (time.Until, a
// context's Deadline, net.Dialer's timeout), they must not mean a wall
// time: a step of the wall clock after the anchor (chrony's first step
// after a VM boot or a resume) would move every such deadline by the step,
// for the rest of the process (a forward step: kills skipped, dials timed
// out at once). So they carry the anchor's monotonic reading, and Go
// compares them with time.Now() on its monotonic clock, which no step
// moves; that clock stops in a suspend, so there a deadline looks later
// by the time suspended, never earlier. A deadline context reports its
// Deadline as the time left on CLOCK_BOOTTIME from the moment it is asked
// (bootDeadlineCtx.Deadline), which is exact.
type bootClock struct {
	src  func() int64 // CLOCK_BOOTTIME in nanoseconds
	step time.Duration
	wall time.Time // time.Now() when src read boot, monotonic reading kept
	boot int64
}

// readBoottime reads CLOCK_BOOTTIME in nanoseconds; it counts the time the
// system was suspended and is shared by every process on the host.
func readBoottime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_BOOTTIME): %v", err))
	}
	return ts.Nano()
}

func newBootClock(src func() int64, step time.Duration) *bootClock {
	return &bootClock{src: src, step: step, wall: time.Now(), boot: src()}
}

// theBootClock is the process's one boottime clock: one anchor, so every
// time it hands out compares with every other.
var theBootClock = newBootClock(readBoottime, bootTimerStep)

// at is the time of boottime reading ns.
func (c *bootClock) at(ns int64) time.Time { return c.wall.Add(time.Duration(ns - c.boot)) }

// nanos is the boottime reading of t.
func (c *bootClock) nanos(t time.Time) int64 { return c.boot + int64(t.Sub(c.wall)) }

func (c *bootClock) Now() time.Time { return c.at(c.src()) }

func (c *bootClock) NewTimer(d time.Duration) timer { return c.newTimer(d, nil) }

func (c *bootClock) newTimer(d time.Duration, fire func()) *bootTimer {
	t := &bootTimer{clk: c, c: make(chan time.Time, 1), fire: fire}
	t.Reset(d)
	return t
}

// WithDeadline is context.WithDeadline on boottime.
func (c *bootClock) WithDeadline(parent context.Context, at time.Time) (context.Context, context.CancelFunc) {
	ctx := &bootDeadlineCtx{Context: parent, clk: c, deadline: at, done: make(chan struct{})}
	tm := c.newTimer(at.Sub(c.Now()), func() { ctx.end(context.DeadlineExceeded) })
	stop := context.AfterFunc(parent, func() { ctx.end(parent.Err()) })
	return ctx, func() { tm.Stop(); stop(); ctx.end(context.Canceled) }
}

// bootDeadlineCtx ends when its boottime deadline passes, its parent ends,
// or it is cancelled.
type bootDeadlineCtx struct {
	context.Context
	clk      *bootClock
	deadline time.Time // on clk
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	err      error
}

// Deadline is for the standard library (net.Dialer turns it into a dial
// timeout with time.Until): the time left on boottime, from now, on
// time.Now()'s clock; the parent's, if that is earlier.
func (c *bootDeadlineCtx) Deadline() (time.Time, bool) {
	d := time.Now().Add(c.deadline.Sub(c.clk.Now()))
	if pd, ok := c.Context.Deadline(); ok && pd.Before(d) {
		d = pd
	}
	return d, true
}

func (c *bootDeadlineCtx) Done() <-chan struct{} { return c.done }

func (c *bootDeadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *bootDeadlineCtx) end(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

// bootTimer is a timer on boottime with Go 1.23 semantics (after Reset or
// Stop no earlier value is delivered). It sleeps at most the clock's step
// on Go's timers before it reads boottime again, so a suspend shortens
// the rest of the wait instead of extending it.
type bootTimer struct {
	clk  *bootClock
	c    chan time.Time
	fire func() // if set, called instead of sending on c

	mu       sync.Mutex
	t        *time.Timer
	gen      uint64 // bumped by every Reset and Stop: older wakes are void
	deadline int64
	active   bool
}

func (t *bootTimer) C() <-chan time.Time { return t.c }

func (t *bootTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.stopLocked()
	t.deadline = t.clk.src() + int64(d)
	t.active = true
	t.armLocked(d)
	return was
}

func (t *bootTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopLocked()
}

func (t *bootTimer) stopLocked() bool {
	t.gen++
	if t.t != nil {
		t.t.Stop()
	}
	was := t.active
	t.active = false
	select {
	case <-t.c:
	default:
	}
	return was
}

func (t *bootTimer) armLocked(left time.Duration) {
	gen := t.gen
	t.t = time.AfterFunc(min(max(left, 0), t.clk.step), func() { t.wake(gen) })
}

func (t *bootTimer) wake(gen uint64) {
	t.mu.Lock()
	if gen != t.gen || !t.active {
		t.mu.Unlock()
		return
	}
	now := t.clk.src()
	if left := t.deadline - now; left > 0 {
		t.armLocked(time.Duration(left))
		t.mu.Unlock()
		return
	}
	t.active = false
	fire := t.fire
	if fire == nil {
		select {
		case t.c <- t.clk.at(now):
		default:
		}
	}
	t.mu.Unlock()
	if fire != nil {
		fire()
	}
}

// BootNow is now on CLOCK_BOOTTIME (see bootClock): the clock of every
// lease deadline. Measure durations to those deadlines against it
// (BootUntil), not with time.Until.
func BootNow() time.Time { return theBootClock.Now() }

// BootUntil is how long from now, on CLOCK_BOOTTIME, until t (a time from
// BootNow or a lease deadline).
func BootUntil(t time.Time) time.Duration { return t.Sub(theBootClock.Now()) }

// BootNanos is t (a time from BootNow or a lease deadline) as a
// CLOCK_BOOTTIME reading in nanoseconds, which every process on the host
// shares: write it where another process compares it. Zero stays zero.
func BootNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return theBootClock.nanos(t)
}

// BootTime is the time of a CLOCK_BOOTTIME reading in nanoseconds (from
// BootNanos, maybe in another process), comparable with BootNow. Zero
// stays the zero time.
func BootTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return theBootClock.at(ns)
}

// BootTimer is a timer on CLOCK_BOOTTIME, for waits up to a lease deadline.
type BootTimer struct{ t *bootTimer }

// NewBootTimer starts a timer that fires once d has passed on CLOCK_BOOTTIME.
func NewBootTimer(d time.Duration) *BootTimer { return &BootTimer{theBootClock.newTimer(d, nil)} }

// C delivers the time the timer fired.
func (t *BootTimer) C() <-chan time.Time { return t.t.C() }

// Reset restarts the timer for d; no value from before is delivered.
func (t *BootTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

// Stop stops the timer; no value from before is delivered.
func (t *BootTimer) Stop() bool { return t.t.Stop() }

// WithBootDeadline is context.WithDeadline with t on CLOCK_BOOTTIME.
func WithBootDeadline(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return theBootClock.WithDeadline(ctx, t)
}

// WithBootTimeout is context.WithTimeout measured on CLOCK_BOOTTIME.
func WithBootTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return theBootClock.WithDeadline(ctx, theBootClock.Now().Add(d))
}
