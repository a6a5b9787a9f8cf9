package lockclient

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// fakeBoot is a CLOCK_BOOTTIME source the test moves: a jump forward is a
// suspend, during which Go's own timers (on the monotonic clock) stood
// still.
type fakeBoot struct{ ns atomic.Int64 }

func (f *fakeBoot) read() int64               { return f.ns.Load() }
func (f *fakeBoot) suspend(d time.Duration)   { f.ns.Add(int64(d)) }
func newTestBootClock(f *fakeBoot) *bootClock { return newBootClock(f.read, 5*time.Millisecond) }

func firedWithin(c <-chan time.Time, d time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

// A suspend that passes a timer's boottime deadline ends the wait within a
// step of the resume; it does not extend the wait by the time suspended.
func TestBootTimerCountsSuspend(t *testing.T) {
	f := &fakeBoot{}
	f.ns.Store(int64(time.Hour))
	c := newTestBootClock(f)
	tm := c.NewTimer(10 * time.Minute)
	defer tm.Stop()
	if firedWithin(tm.C(), 50*time.Millisecond) {
		t.Fatal("fired before its deadline")
	}
	f.suspend(9 * time.Minute)
	if firedWithin(tm.C(), 50*time.Millisecond) {
		t.Fatal("fired a minute before its deadline")
	}
	f.suspend(time.Minute)
	select {
	case at := <-tm.C():
		if want := c.at(int64(time.Hour + 10*time.Minute)); at.Before(want) {
			t.Fatalf("fired at %s, before its deadline %s", at, want)
		}
	case <-time.After(realWait):
		t.Fatal("did not fire once boottime passed its deadline")
	}
}

// Time that Go's timers count but boottime does not (a source that stands
// still) never fires a timer early: it reads boottime before it fires.
func TestBootTimerFiresOnBoottimeOnly(t *testing.T) {
	f := &fakeBoot{}
	c := newTestBootClock(f)
	tm := c.NewTimer(10 * time.Millisecond)
	if firedWithin(tm.C(), 100*time.Millisecond) {
		t.Fatal("fired while boottime stood still")
	}
	f.suspend(10 * time.Millisecond)
	if !firedWithin(tm.C(), realWait) {
		t.Fatal("did not fire")
	}
	// Reset and Stop drop what was pending; a stopped timer stays quiet.
	tm.Reset(time.Millisecond)
	f.suspend(time.Millisecond)
	time.Sleep(30 * time.Millisecond) // let it fire into its channel
	if tm.Reset(time.Hour) {
		// Reset reports whether the timer was active: it had fired.
		t.Fatal("Reset reported a fired timer active")
	}
	if firedWithin(tm.C(), 30*time.Millisecond) {
		t.Fatal("a value from before Reset was delivered")
	}
	if !tm.Stop() {
		t.Fatal("Stop reported an active timer inactive")
	}
	f.suspend(2 * time.Hour)
	if firedWithin(tm.C(), 50*time.Millisecond) {
		t.Fatal("a stopped timer fired")
	}
}

// A deadline context on boottime ends with DeadlineExceeded when a suspend
// passes its deadline, and with its parent or cancel otherwise.
func TestBootDeadlineContext(t *testing.T) {
	f := &fakeBoot{}
	c := newTestBootClock(f)
	ctx, cancel := c.WithDeadline(context.Background(), c.Now().Add(time.Hour))
	defer cancel()
	select {
	case <-ctx.Done():
		t.Fatal("ended early")
	case <-time.After(30 * time.Millisecond):
	}
	f.suspend(time.Hour)
	select {
	case <-ctx.Done():
	case <-time.After(realWait):
		t.Fatal("did not end when boottime passed its deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, Cause = %v; want DeadlineExceeded", ctx.Err(), context.Cause(ctx))
	}

	parent, stop := context.WithCancel(context.Background())
	ctx2, cancel2 := c.WithDeadline(parent, c.Now().Add(time.Hour))
	defer cancel2()
	stop()
	select {
	case <-ctx2.Done():
	case <-time.After(realWait):
		t.Fatal("did not end with its parent")
	}
	if !errors.Is(ctx2.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want Canceled", ctx2.Err())
	}
}

// Times cross processes as CLOCK_BOOTTIME readings: BootNanos of BootNow is
// the kernel's reading, and BootTime turns it back.
func TestBootNanosIsTheKernelsBoottime(t *testing.T) {
	before := readBoottime()
	now := BootNow()
	after := readBoottime()
	if ns := BootNanos(now); ns < before-int64(time.Millisecond) || ns > after+int64(time.Millisecond) {
		t.Fatalf("BootNanos(BootNow()) = %d, kernel read %d..%d", ns, before, after)
	}
	if back := BootTime(BootNanos(now)); !back.Equal(now) {
		t.Fatalf("BootTime(BootNanos(t)) = %s, want %s", back, now)
	}
	if BootNanos(time.Time{}) != 0 || !BootTime(0).IsZero() {
		t.Fatal("zero does not stay zero")
	}
	if d := BootUntil(now.Add(time.Hour)); d <= 59*time.Minute || d > time.Hour {
		t.Fatalf("BootUntil(now+1h) = %s", d)
	}
}

// A wall-clock step after the process started (chrony's first step after
// a VM boot or a resume) must not move boot deadlines where they meet the
// standard library: a context on one (and net.Dialer, which turns its
// Deadline into a dial timeout) sees the time left on CLOCK_BOOTTIME, and
// boot times compare with time.Now on Go's monotonic clock.
func TestBootDeadlinesIgnoreWallClockSteps(t *testing.T) {
	f := &fakeBoot{}
	c := newTestBootClock(f)
	// The clock's anchor as it looks after the wall clock was stepped 5 s
	// forward: no monotonic reading to go by, and 5 s behind the wall.
	c.wall = c.wall.Round(0).Add(-5 * time.Second)
	ctx, cancel := c.WithDeadline(context.Background(), c.Now().Add(2*time.Second))
	defer cancel()
	dl, ok := ctx.Deadline()
	if left := time.Until(dl); !ok || left <= time.Second || left > 2*time.Second {
		t.Fatalf("Deadline() leaves %s to time.Until, want the 2s left on boottime", left)
	}
	std, stdCancel := context.WithDeadline(context.Background(), dl)
	defer stdCancel()
	if std.Err() != nil {
		t.Fatal("a standard context on the boot deadline is done at once")
	}

	now := BootNow()
	if now == now.Round(0) {
		t.Fatal("BootNow carries no monotonic reading: time.Until and the standard library compare it by the wall clock")
	}
	if left := time.Until(BootNow().Add(2 * time.Second)); left <= time.Second || left > 2*time.Second {
		t.Fatalf("time.Until(BootNow()+2s) = %s", left)
	}
}
