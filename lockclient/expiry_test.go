package lockclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// With TTL 10s the defaults are FenceMargin 1s and RequestTimeout 2.5s, so
// a lease is left to expire from 2×10s - 1s - 2.5s = 16.5s after the send
// of its last acknowledged renew (or acquire). Nomad's timer fires 20s after
// it received that renew and clears the lock 'LockDelay' later, whoever
// holds it then.
const testCutoff = 16500 * time.Millisecond

func TestMayRelease(t *testing.T) {
	tm := Timing{TTL: 10 * time.Second, LockDelay: 10 * time.Second}
	sent := t0.Add(5 * time.Second)
	tests := []struct {
		name      string
		lastRenew time.Time
		now       time.Time
		ok        bool
	}{
		{"just after the renew", sent, sent.Add(time.Millisecond), true},
		{"a stop that took until just before the cutoff", sent, sent.Add(testCutoff - time.Millisecond), true},
		{"at the cutoff", sent, sent.Add(testCutoff), false},
		{"frozen and thawed at 2×TTL", sent, sent.Add(20 * time.Second), false},
		{"thawed inside the lock delay", sent, sent.Add(22 * time.Second), false},
		{"thawed long after the expiry", sent, sent.Add(time.Hour), false},
		{"unknown last renew", time.Time{}, sent, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tm.MayRelease(tc.lastRenew, tc.now)
			if tc.ok != (err == nil) {
				t.Fatalf("MayRelease = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrLeftToExpire) {
				t.Fatalf("MayRelease = %v, want ErrLeftToExpire", err)
			}
		})
	}
	if got := tm.ReleaseCutoff(sent); !got.Equal(sent.Add(testCutoff)) {
		t.Fatalf("ReleaseCutoff = sent+%s, want sent+%s", got.Sub(sent), testCutoff)
	}
	// Every valid timing leaves the cutoff short of 2×TTL by a request
	// timeout and more.
	for _, tm := range []Timing{{TTL: 10 * time.Second, LockDelay: time.Second},
		{TTL: time.Hour, LockDelay: time.Second, RenewInterval: time.Second, RequestTimeout: 50 * time.Minute}} {
		if err := tm.Validate(); err != nil {
			t.Fatal(err)
		}
		d := tm.withDefaults()
		if left := 2*d.TTL - tm.ReleaseCutoff(t0).Sub(t0); left < d.RequestTimeout+d.FenceMargin || left <= 0 {
			t.Fatalf("%+v: cutoff only %s before 2×TTL", d, left)
		}
	}
}

// A holder that was frozen (SIGSTOP, a paused VM, a suspended host) and
// thaws sends no release once the server may be expiring its lock: the
// cutoff is measured from the send of the last renew that was acknowledged,
// not of one that went unanswered or failed.
func TestReleaseLeftToExpire(t *testing.T) {
	tests := []struct {
		name      string
		renewAt5  string // the answer to the renew at 5s: ack, hang, fail; "": frozen before it
		lastAck   time.Duration
		releaseAt time.Duration
		sent      bool
	}{
		{"acquired, released before the cutoff", "", 0, testCutoff - time.Millisecond, true},
		{"acquired, released at the cutoff", "", 0, testCutoff, false},
		{"renewed at 5s: the cutoff moves with it", "ack", 5 * time.Second, 5*time.Second + testCutoff - time.Millisecond, true},
		{"renewed at 5s, frozen, thawed inside the lock delay", "ack", 5 * time.Second, 27 * time.Second, false},
		{"renew at 5s unanswered: it does not count", "hang", 0, 17 * time.Second, false},
		{"renew at 5s refused: it does not count", "fail", 0, 17 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Timing{})
			ls := r.acquire(t)
			if tc.renewAt5 != "" {
				r.clock.advanceTo(t, t0.Add(5*time.Second))
				c := r.api.next(t, "renew")
				switch tc.renewAt5 {
				case "ack":
					c.answer(reply{})
				case "fail":
					c.answer(reply{err: httpError{500, "no leader"}})
				}
				if tc.renewAt5 == "ack" {
					select {
					case <-ls.Renewed():
					case <-time.After(realWait):
						t.Fatal("renew not taken")
					}
				}
			}
			ls.stopRenewing() // the holder is frozen: its loops do nothing more
			if got := ls.LastRenew(); !got.Equal(t0.Add(tc.lastAck)) {
				t.Fatalf("LastRenew = t0+%s, want t0+%s", got.Sub(t0), tc.lastAck)
			}
			drain(r.api)
			r.clock.advanceTo(t, t0.Add(tc.releaseAt))
			done := make(chan error, 1)
			go func() { done <- ls.Release(context.Background()) }()
			if tc.sent {
				r.api.next(t, "release").answer(reply{})
				if err := <-done; err != nil {
					t.Fatalf("Release = %v, want nil", err)
				}
				return
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(realWait):
				t.Fatal("Release did not return")
			}
			if !errors.Is(err, ErrLeftToExpire) || errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "next holder") {
				t.Fatalf("Release = %v, want ErrLeftToExpire saying why", err)
			}
			r.api.quiet(t)
			if ls.Err() == ErrReleased {
				t.Fatal("Err() = ErrReleased for a lease left to expire")
			}
		})
	}
}

// drain forgets requests that were made and left unanswered.
func drain(f *fakeAPI) {
	for {
		select {
		case <-f.calls:
		default:
			return
		}
	}
}

// A release that keeps failing is retried only until the cutoff; none is
// sent from then on.
func TestReleaseRetriesStopAtTheCutoff(t *testing.T) {
	r := newRig(t, Timing{})
	ls := r.acquire(t)
	ls.stopRenewing()
	drain(r.api)
	r.clock.advanceTo(t, t0.Add(15*time.Second))
	done := make(chan error, 1)
	go func() { done <- ls.Release(context.Background()) }()
	cutoff := t0.Add(testCutoff)
	for n := 0; ; n++ {
		var c *call
		select {
		case c = <-r.api.calls:
		case err := <-done:
			if !errors.Is(err, ErrLeftToExpire) {
				t.Fatalf("Release = %v, want ErrLeftToExpire once the cutoff passed", err)
			}
			if n < 2 {
				t.Fatalf("only %d release(s) before the cutoff; want retries", n)
			}
			r.api.quiet(t)
			return
		case <-time.After(realWait):
			t.Fatal("neither a release nor the end of Release")
		}
		if c.op != "release" || !c.at.Before(cutoff) {
			t.Fatalf("%s sent at t0+%s; none may go from the cutoff t0+%s on", c.op, c.at.Sub(t0), testCutoff)
		}
		if d := c.deadline(); d.After(cutoff.Add(2500 * time.Millisecond)) {
			t.Fatalf("release may run until t0+%s", d.Sub(t0))
		}
		c.answer(reply{err: httpError{500, "no leader"}})
		r.clock.advanceTo(t, r.clock.waitRetry(t, c))
	}
}

// A gate marks its release clean only when it may release: past the
// cutoff neither the read nor the write goes out.
func TestMarkReleasedCleanLeftToExpire(t *testing.T) {
	r := newRig(t, Timing{})
	ls := r.acquire(t)
	ls.stopRenewing()
	drain(r.api)
	r.clock.advanceTo(t, t0.Add(22*time.Second))
	if err := ls.MarkReleasedClean(context.Background()); !errors.Is(err, ErrLeftToExpire) {
		t.Fatalf("MarkReleasedClean = %v, want ErrLeftToExpire", err)
	}
	if err := r.l.MarkReleasedCleanID(context.Background(), testID, testFence, time.Time{}); !errors.Is(err, ErrLeftToExpire) {
		t.Fatalf("MarkReleasedCleanID with no last renew = %v, want ErrLeftToExpire", err)
	}
	r.api.quiet(t)
}
