package lockclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// The lease renews every RenewInterval after the last good renew, sends
// each renew with a deadline of RequestTimeout, and moves the fence deadline
// to last good renew + TTL - FenceMargin.
func TestRenewTiming(t *testing.T) {
	tests := []struct {
		name   string
		timing Timing
		renew  time.Duration // expected interval
		fence  time.Duration // expected TTL - FenceMargin
		reqTO  time.Duration // expected request timeout
	}{
		{"defaults for TTL 10s", Timing{TTL: 10 * time.Second}, 5 * time.Second, 9 * time.Second, 2500 * time.Millisecond},
		{"defaults for TTL 60s", Timing{TTL: time.Minute}, 30 * time.Second, 54 * time.Second, 10 * time.Second},
		{"explicit settings", Timing{TTL: 20 * time.Second, RenewInterval: 3 * time.Second, FenceMargin: time.Second,
			RequestTimeout: 2 * time.Second}, 3 * time.Second, 19 * time.Second, 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.timing)
			ls := r.acquire(t)
			if got := ls.FenceDeadline(); !got.Equal(t0.Add(tc.fence)) {
				t.Fatalf("fence deadline after acquire = t0+%s, want t0+%s", got.Sub(t0), tc.fence)
			}
			for i := 1; i <= 3; i++ {
				due := t0.Add(time.Duration(i) * tc.renew)
				r.clock.waitTimerAt(t, due)
				r.clock.advanceTo(t, due.Add(-time.Millisecond))
				r.api.quiet(t)
				r.clock.advanceTo(t, due)
				c := r.api.next(t, "renew")
				if c.v.Lock == nil || c.v.Lock.ID != testID || c.v.Path != testPath {
					t.Fatalf("renew sent %+v, want lock ID %s on %s", c.v, testID, testPath)
				}
				if got := c.deadline().Sub(c.at); got != tc.reqTO {
					t.Fatalf("renew %d deadline = sent + %s, want + %s", i, got, tc.reqTO)
				}
				c.answer(reply{})
				select {
				case <-ls.Renewed():
				case <-time.After(realWait):
					t.Fatalf("Renewed() did not signal renew %d", i)
				}
				if got := ls.FenceDeadline(); !got.Equal(due.Add(tc.fence)) {
					t.Fatalf("fence deadline after renew %d = t0+%s, want t0+%s", i, got.Sub(t0), due.Add(tc.fence).Sub(t0))
				}
			}
			if err := ls.Err(); err != nil {
				t.Fatalf("Err() = %v while held", err)
			}
		})
	}
}

// The server saying the lock is no longer ours ends the lease at once, and
// the workload must then be gone by the fence deadline. An error that only
// says "not now" does not.
func TestRenewAnswers(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		lost     bool
		reason   string
		conflict bool
		// read answers the check that follows a 409 (nil: none expected).
		read *reply
	}{
		{"409 conflict", httpError{409, "attempting to modify locked variable"}, true, "409", true,
			&reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence + 7, Lock: &api.VariableLock{ID: "lock-id-2"}}}},
		{"404 variable deleted", httpError{404, "variable not found"}, true, "deleted", true, nil},
		{"lock gone, in the body", httpError{409, "variable doesn't hold a lock"}, true, "no longer ours", true, nil},
		{"500 is retried", httpError{500, "raft leader lost"}, false, "", false, nil},
		{"transport error is retried", errors.New("dial unix api.sock: connection refused"), false, "", false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Timing{})
			ls := r.acquire(t)
			renewAt := t0.Add(5 * time.Second)
			r.clock.advanceTo(t, renewAt)
			first := r.api.next(t, "renew")
			first.answer(reply{err: tc.err})
			if tc.read != nil {
				r.api.next(t, "read").answer(*tc.read)
			}
			if !tc.lost {
				if !stillOpen(ls.Lost()) {
					t.Fatalf("lease lost on %v", tc.err)
				}
				// The retry comes after a backoff of 50 to 150 ms.
				at := r.clock.waitRetry(t, first, t0.Add(9*time.Second))
				if d := at.Sub(renewAt); d < 50*time.Millisecond || d > 150*time.Millisecond {
					t.Fatalf("retry after %s, want a jittered 100ms backoff", d)
				}
				r.clock.advanceTo(t, at)
				r.api.next(t, "renew").answer(reply{})
				select {
				case <-ls.Renewed():
				case <-time.After(realWait):
					t.Fatal("the retry did not renew")
				}
				if got := ls.FenceDeadline(); !got.Equal(at.Add(9 * time.Second)) {
					t.Fatalf("fence deadline = t0+%s, want the retry's send time + 9s", got.Sub(t0))
				}
				return
			}
			if !closedWithin(ls.Lost()) {
				t.Fatalf("Lost() still open after %v", tc.err)
			}
			var le *LostError
			if err := ls.Err(); !errors.As(err, &le) || !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Err() = %v, want a LostError saying %q", err, tc.reason)
			}
			fence := t0.Add(9 * time.Second)
			if got := ls.StopDeadline(); !got.Equal(fence) {
				t.Fatalf("StopDeadline() = t0+%s, want the fence deadline t0+9s: someone else may hold the lock", got.Sub(t0))
			}
			r.clock.advanceTo(t, t0.Add(time.Minute))
			r.api.quiet(t) // a lost lease renews no more
		})
	}
}

// When Nomad does not answer, every renew is cut off at the fence deadline,
// so the lease is lost exactly then, however the requests hang; and since
// no one told us we lost it, the workload may take until the server could
// expire the lock (2*TTL - FenceMargin after the last renew) to stop.
func TestFenceDeadlineWhileRequestsHang(t *testing.T) {
	tests := []struct {
		name   string
		answer func(*call) // nil: the request hangs
	}{
		{"requests hang", nil},
		{"requests fail", func(c *call) { c.answer(reply{err: httpError{503, "no leader"}}) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Timing{})
			ls := r.acquire(t)
			fence := t0.Add(9 * time.Second)
			r.clock.advanceTo(t, t0.Add(5*time.Second))
			for {
				c := r.api.next(t, "renew")
				if d := c.deadline(); d.After(fence) {
					t.Fatalf("renew sent at t0+%s may run until t0+%s, past the fence deadline t0+9s", c.at.Sub(t0), d.Sub(t0))
				}
				if tc.answer != nil {
					tc.answer(c)
				}
				if tc.answer == nil {
					// The request hangs until its deadline, then is retried.
					if !c.deadline().Before(fence) {
						break
					}
					r.clock.advanceTo(t, c.deadline())
				}
				at := r.clock.waitRetry(t, c, fence)
				// A retry in the last millisecond is left pending: the clock is
				// next moved to just before the fence deadline.
				if !at.Before(fence.Add(-time.Millisecond)) {
					break
				}
				r.clock.advanceTo(t, at)
				if !stillOpen(ls.Lost()) {
					t.Fatalf("lost at t0+%s, before the fence deadline", r.clock.Now().Sub(t0))
				}
			}
			r.clock.advanceTo(t, fence.Add(-time.Millisecond))
			if !stillOpen(ls.Lost()) {
				t.Fatal("lost before the fence deadline")
			}
			r.clock.advanceTo(t, fence)
			if !closedWithin(ls.Lost()) {
				t.Fatal("Lost() still open at the fence deadline")
			}
			if err := ls.Err(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "fence deadline") {
				t.Fatalf("Err() = %v, want a loss at the fence deadline", err)
			}
			if got, want := ls.StopDeadline(), t0.Add(2*10*time.Second-time.Second); !got.Equal(want) {
				t.Fatalf("StopDeadline() = t0+%s, want t0+%s (the server keeps the lock until 2*TTL)", got.Sub(t0), want.Sub(t0))
			}
		})
	}
}

// Release stops the renewing, even mid-request, and releases under the
// lock ID at once; it retries what may pass, reports a lock that was no
// longer ours, and gives up when its context ends.
func TestRelease(t *testing.T) {
	tests := []struct {
		name        string
		renewHangs  bool    // a renew is in flight when Release is called
		answers     []error // one per release request, in order
		ctxTimeout  time.Duration
		wantErr     error // errors.Is; nil: success
		wantErrText string
		requests    int
	}{
		{"released at once", false, []error{nil}, 0, nil, "", 1},
		{"a hung renew does not hold it up", true, []error{nil}, 0, nil, "", 1},
		{"transient errors retried", false, []error{httpError{500, "no leader"}, errors.New("connection reset"), nil}, 0, nil, "", 3},
		{"409: it was no longer ours", false, []error{httpError{409, "conflict"}}, 0, ErrLost, "no longer ours", 1},
		{"500 saying the lock is gone", false, []error{httpError{500, "variable doesn't hold a lock"}}, 0, ErrLost, "no longer ours", 1},
		{"an identity refused once, then accepted (busy servers)", false, []error{httpError{500, "Server error authenticating request"}, nil}, 0, nil, "", 2},
		{"403 is not retried", false, []error{httpError{403, "Permission denied"}}, 0, nil, "403", 1},
		{"gives up when ctx ends", false, []error{httpError{500, "no leader"}}, 50 * time.Millisecond, nil, "expires on its own", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Timing{})
			ls := r.acquire(t)
			if tc.renewHangs {
				r.clock.advanceTo(t, t0.Add(5*time.Second))
				r.api.next(t, "renew") // never answered
			}
			at := r.clock.Now()
			ctx := context.Background()
			if tc.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout) // real time: the caller's budget
				defer cancel()
			}
			done := make(chan error, 1)
			go func() { done <- ls.Release(ctx) }()
			for i, ans := range tc.answers {
				c := r.api.next(t, "release")
				if c.v.Lock == nil || c.v.Lock.ID != testID {
					t.Fatalf("release %d sent %+v, want lock ID %s", i, c.v, testID)
				}
				if i == 0 && !c.at.Equal(at) {
					t.Fatalf("first release sent at t0+%s, want at once (t0+%s)", c.at.Sub(t0), at.Sub(t0))
				}
				c.answer(reply{err: ans})
				if i < len(tc.answers)-1 || (ans != nil && tc.wantErr == nil && tc.wantErrText == "") {
					r.clock.advanceTo(t, r.clock.waitRetry(t, c))
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(realWait):
				t.Fatal("Release did not return")
			}
			switch {
			case tc.wantErr == nil && tc.wantErrText == "":
				if err != nil || ls.Err() != ErrReleased {
					t.Fatalf("Release = %v, Err() = %v; want nil, ErrReleased", err, ls.Err())
				}
			case err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.wantErrText):
				t.Fatalf("Release = %v, want %v containing %q", err, tc.wantErr, tc.wantErrText)
			}
			r.clock.advanceTo(t, t0.Add(time.Minute))
			r.api.quiet(t) // neither renews nor further releases
		})
	}
}

// A purged allocation's identity never authenticates again: Release asks
// for a while (the servers may only have been busy), then says why, so the
// driver's plugin can release with the operator's token instead of the
// next holder waiting for the server's expiry.
func TestReleaseIdentityRejected(t *testing.T) {
	r := newRig(t, Timing{})
	ls := r.acquire(t)
	at := r.clock.Now()
	done := make(chan error, 1)
	go func() { done <- ls.Release(context.Background()) }()
	requests := 0
	for {
		c := r.api.next(t, "release")
		requests++
		c.answer(reply{err: httpError{500, "Server error authenticating request"}})
		select {
		case err := <-done:
			took := r.clock.Now().Sub(at)
			if !errors.Is(err, ErrIdentityRejected) || !strings.Contains(err.Error(), "authenticating") {
				t.Fatalf("Release = %v, want ErrIdentityRejected with Nomad's answer", err)
			}
			if requests < 2 || took < identityRejectedFor || took > identityRejectedFor+5*time.Second {
				t.Fatalf("gave up after %d requests and %s; want a few, for %s", requests, took, identityRejectedFor)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		if requests > 50 {
			t.Fatal("Release retries a rejected identity forever")
		}
		r.clock.advanceTo(t, r.clock.waitRetry(t, c))
	}
}

// Acquire waits for a held lock on a blocking query of the variable, not on
// a timer: every try follows a change of the variable (a release, or the
// expiry after the lock delay) or the end of the blocking query's wait. It
// backs off only after API errors, and ends when its wait does.
func TestAcquireBlocksOnTheVariable(t *testing.T) {
	other := Holder{AllocID: "alloc-other", Upstream: "10.0.0.2:8080", TTL: 10 * time.Second, LockDelay: time.Second}
	held := reply{v: &api.Variable{Path: testPath, ModifyIndex: 10, Items: other.items()}, index: 10}
	r := newRig(t, Timing{})
	var blocked []Holder
	got := make(chan *Lease, 1)
	go func() {
		ls, err := r.l.Acquire(context.Background(), AcquireOptions{OnBlocked: func(h Holder) { blocked = append(blocked, h) }})
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- ls
	}()
	// Held: 409, then park on the variable's index.
	r.api.next(t, "read").answer(held)
	r.api.next(t, "acquire").answer(reply{err: httpError{409, "lock held"}})
	w := r.api.next(t, "wait")
	if w.index != 10 || w.wait != 30*time.Second {
		t.Fatalf("blocking read on index %d for %s, want index 10 for 30s", w.index, w.wait)
	}
	if d := w.deadline().Sub(w.at); d != 2500*time.Millisecond+30*time.Second+30*time.Second/16 {
		t.Fatalf("blocking read deadline = sent + %s, want request timeout + wait + Nomad's wait/16 jitter", d)
	}
	// The holder's lock expired: the variable changed, but the lock delay
	// still refuses us. Try again on the next change only.
	w.answer(reply{index: 11})
	held.index = 11
	r.api.next(t, "read").answer(held)
	r.api.next(t, "acquire").answer(reply{err: httpError{409, "lock delay in effect"}})
	w = r.api.next(t, "wait")
	if w.index != 11 {
		t.Fatalf("second blocking read on index %d, want 11", w.index)
	}
	// The wait ended with no change (the lock delay ran out meanwhile).
	w.answer(reply{index: 11})
	r.api.next(t, "read").answer(held)
	c := r.api.next(t, "acquire")
	if !c.at.Equal(t0) {
		t.Fatalf("tries went at t0+%s: Acquire slept on a timer instead of the variable", c.at.Sub(t0))
	}
	if c.v.Lock == nil || c.v.Lock.TTL != "10s" || c.v.Lock.LockDelay != "1s" {
		t.Fatalf("acquire sent lock %+v, want TTL 10s, delay 1s", c.v.Lock)
	}
	if prev := c.v.Items[itemPrevious]; prev != other.Upstream {
		t.Fatalf("acquire recorded previous upstream %q, want %q", prev, other.Upstream)
	}
	c.answer(acquired())
	ls := <-got
	if ls == nil || ls.Fence != testFence || ls.Previous.AllocID != other.AllocID {
		t.Fatalf("lease = %+v, want fence %d after %s", ls, testFence, other.AllocID)
	}
	t.Cleanup(func() { ls.stopOnce.Do(func() { close(ls.stop); ls.cancelReq() }) })
	if len(blocked) != 1 || blocked[0].AllocID != other.AllocID {
		t.Fatalf("OnBlocked calls = %+v, want one, for %s", blocked, other.AllocID)
	}
}

// How Acquire ends when it cannot take the lock.
func TestAcquireEnds(t *testing.T) {
	held := reply{v: &api.Variable{Path: testPath, ModifyIndex: 10, Items: Holder{AllocID: "alloc-other"}.items()}, index: 10}
	tests := []struct {
		name     string
		opts     AcquireOptions
		maxRetry int
		script   func(t *testing.T, r *rig)
		want     error
		wantAt   time.Duration // fake time Acquire must have ended at
	}{
		{"try once: held", AcquireOptions{TryOnce: true}, 0, func(t *testing.T, r *rig) {
			r.api.next(t, "read").answer(held)
			r.api.next(t, "acquire").answer(reply{err: httpError{409, "held"}})
		}, ErrNotAcquired, 0},
		{"wait ends while parked", AcquireOptions{Wait: 20 * time.Second}, 0, func(t *testing.T, r *rig) {
			r.api.next(t, "read").answer(held)
			r.api.next(t, "acquire").answer(reply{err: httpError{409, "held"}})
			r.api.next(t, "wait") // hangs
			r.clock.advanceTo(t, t0.Add(20*time.Second))
		}, ErrWaitTimeout, 20 * time.Second},
		{"too many API errors", AcquireOptions{}, 3, func(t *testing.T, r *rig) {
			for i := 0; i < 3; i++ {
				c := r.api.next(t, "read")
				c.answer(reply{err: httpError{500, "no leader"}})
				if i < 2 {
					at := r.clock.waitRetry(t, c)
					if d := at.Sub(c.at); d < 50*time.Millisecond || d > 300*time.Millisecond {
						t.Fatalf("backoff %d = %s, want jittered 100ms doubling", i, d)
					}
					r.clock.advanceTo(t, at)
				}
			}
		}, ErrTooManyErrors, -1},
		{"403 is not retried", AcquireOptions{}, 0, func(t *testing.T, r *rig) {
			r.api.next(t, "read").answer(reply{err: httpError{403, "Permission denied"}})
		}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Timing{})
			r.l.cfg.MaxRetry = tc.maxRetry
			done := make(chan error, 1)
			go func() {
				ls, err := r.l.Acquire(context.Background(), tc.opts)
				if ls != nil {
					t.Errorf("Acquire returned a lease")
				}
				done <- err
			}()
			tc.script(t, r)
			var err error
			select {
			case err = <-done:
			case <-time.After(realWait):
				t.Fatal("Acquire did not return")
			}
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || (tc.want == nil && !permanent(err)) {
				t.Fatalf("Acquire = %v, want %v", err, tc.want)
			}
			if tc.wantAt >= 0 && !r.clock.Now().Equal(t0.Add(tc.wantAt)) {
				t.Fatalf("Acquire ended at t0+%s, want t0+%s", r.clock.Now().Sub(t0), tc.wantAt)
			}
			r.api.quiet(t)
		})
	}
}

// TestMarkReleasedClean: the mark is one write of the variable's Items plus
// released_clean, under the lock ID alone (Nomad refuses a write that
// carries the lock's TTL or delay), by check-and-set on the index of the
// acquire (so it never lands on a lock released or taken meanwhile), and
// nothing renews after it: Nomad keeps a lock so written with its default
// TTL, not the holder's, and a renew would set the server's timer by it.
func TestMarkReleasedClean(t *testing.T) {
	r := newRig(t, Timing{})
	ls := r.acquire(t)
	done := make(chan error, 1)
	go func() { done <- ls.MarkReleasedClean(context.Background()) }()
	r.api.next(t, "read").answer(reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence, Items: map[string]string{"holder_alloc_id": "a1"}}})
	c := r.api.next(t, "cas")
	if c.v.Lock == nil || c.v.Lock.ID != testID || c.v.Lock.TTL != "" || c.v.Lock.LockDelay != "" || c.v.ModifyIndex != testFence {
		t.Fatalf("write sent lock %+v on index %d, want the lock ID alone, on the acquire's index %d", c.v.Lock, c.v.ModifyIndex, testFence)
	}
	if c.v.Items["released_clean"] != "true" || c.v.Items["holder_alloc_id"] != "a1" {
		t.Fatalf("write sent items %v, want the holder's items and released_clean", c.v.Items)
	}
	c.answer(reply{v: &api.Variable{ModifyIndex: testFence + 1}})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("MarkReleasedClean: %v", err)
		}
	case <-time.After(realWait):
		t.Fatal("MarkReleasedClean did not return")
	}
	// Well past the renew interval: no renew may follow the mark.
	r.clock.advanceTo(t, t0.Add(20*time.Second))
	r.api.quiet(t)
	if got := holderFromItems(c.v.Items); !got.ReleasedClean {
		t.Fatalf("holderFromItems(%v).ReleasedClean = false", c.v.Items)
	}
}

// A new Nomad leader answers renews before it restores its lock timers, and
// a renew that finds no timer gets 409 "attempting to modify locked
// variable". The lease then reads the variable: only our lock ID at the
// ModifyIndex of our acquire proves the lock still ours, and then the renew
// is retried, never past the unchanged fence deadline. Anything else, or no
// answer within RequestTimeout, is a loss that must be acted on by the
// fence deadline.
func TestRenewConflictDuringElection(t *testing.T) {
	const locked = "attempting to modify locked variable"
	ours := reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence, Lock: &api.VariableLock{ID: testID}}}
	fence := t0.Add(9 * time.Second)
	renewAt := t0.Add(5 * time.Second)

	// conflict advances to the first renew, answers it 409 and returns the
	// read that checks the lock.
	conflict := func(t *testing.T) (*rig, *Lease, *call) {
		r := newRig(t, Timing{})
		ls := r.acquire(t)
		r.clock.advanceTo(t, renewAt)
		r.api.next(t, "renew").answer(reply{err: httpError{409, locked}})
		return r, ls, r.api.next(t, "read")
	}
	wantLost := func(t *testing.T, ls *Lease) {
		t.Helper()
		if !closedWithin(ls.Lost()) {
			t.Fatal("Lost() still open")
		}
		if err := ls.Err(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "409") {
			t.Fatalf("Err() = %v, want a loss on the 409", err)
		}
		if got := ls.StopDeadline(); !got.Equal(fence) {
			t.Fatalf("StopDeadline() = t0+%s, want the fence deadline t0+9s", got.Sub(t0))
		}
	}

	t.Run("still ours: retried, and the next renew holds", func(t *testing.T) {
		r, ls, read := conflict(t)
		if d := read.deadline(); d.After(fence) {
			t.Fatalf("check may run until t0+%s, past the fence deadline", d.Sub(t0))
		}
		read.answer(ours)
		if !stillOpen(ls.Lost()) {
			t.Fatal("lease lost although the lock is still ours")
		}
		at := r.clock.waitRetry(t, read, fence)
		if !at.Before(fence) {
			t.Fatalf("retry at t0+%s, not before the fence deadline", at.Sub(t0))
		}
		if got := ls.FenceDeadline(); !got.Equal(fence) {
			t.Fatalf("fence deadline moved to t0+%s on a 409", got.Sub(t0))
		}
		r.clock.advanceTo(t, at)
		r.api.next(t, "renew").answer(reply{})
		select {
		case <-ls.Renewed():
		case <-time.After(realWait):
			t.Fatal("the retry did not renew")
		}
		if got := ls.FenceDeadline(); !got.Equal(at.Add(9 * time.Second)) {
			t.Fatalf("fence deadline = t0+%s, want the retry's send time + 9s", got.Sub(t0))
		}
	})

	for _, tc := range []struct {
		name string
		read reply
	}{
		{"another lock ID", reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence + 3, Lock: &api.VariableLock{ID: "lock-id-2"}}}},
		{"our ID but a new ModifyIndex", reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence + 3, Lock: &api.VariableLock{ID: testID}}}},
		{"no lock", reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence + 3}}},
		{"variable gone", reply{}},
		{"no read permission", reply{err: httpError{403, "Permission denied"}}},
	} {
		t.Run(tc.name+": lost", func(t *testing.T) {
			r, ls, read := conflict(t)
			read.answer(tc.read)
			wantLost(t, ls)
			r.clock.advanceTo(t, t0.Add(time.Minute))
			r.api.quiet(t)
		})
	}

	t.Run("check unanswered within RequestTimeout: lost", func(t *testing.T) {
		r, ls, read := conflict(t)
		end := renewAt.Add(r.l.cfg.Timing.RequestTimeout)
		for c := read; ; c = r.api.next(t, "read") {
			c.answer(reply{err: httpError{500, "No cluster leader"}})
			if !stillOpen(ls.Lost()) {
				t.Fatalf("lost at t0+%s, before the check ran out of time", r.clock.Now().Sub(t0))
			}
			at := r.clock.waitRetry(t, c, fence, end)
			if !at.Before(end) {
				break
			}
			r.clock.advanceTo(t, at)
		}
		r.clock.advanceTo(t, end)
		wantLost(t, ls)
	})

	t.Run("409 until the fence deadline: lost then, stop at once", func(t *testing.T) {
		r, ls, read := conflict(t)
		read.answer(ours)
		for {
			at := r.clock.waitRetry(t, read, fence)
			if !at.Before(fence) {
				break
			}
			r.clock.advanceTo(t, at)
			if !stillOpen(ls.Lost()) {
				t.Fatalf("lost at t0+%s, before the fence deadline", r.clock.Now().Sub(t0))
			}
			r.api.next(t, "renew").answer(reply{err: httpError{409, locked}})
			read = r.api.next(t, "read")
			read.answer(ours)
		}
		r.clock.advanceTo(t, fence)
		wantLost(t, ls)
		if err := ls.Err(); !strings.Contains(err.Error(), "fence deadline") {
			t.Fatalf("Err() = %v, want a loss at the fence deadline", err)
		}
	})
}

// A failed renew is retried often enough near the fence deadline that one
// long backoff cannot step over the moment a new Nomad leader answers.
func TestRenewRetryDelayFitsBeforeTheFence(t *testing.T) {
	for _, c := range []struct {
		backoff, left, want time.Duration
	}{
		{200 * time.Millisecond, 9 * time.Second, 200 * time.Millisecond},             // far from the fence: the backoff's
		{1700 * time.Millisecond, 3500 * time.Millisecond, 437500 * time.Microsecond}, // near it: a retry every left/8
		{1700 * time.Millisecond, 0, minRenewRetry},                                   // at it: never a busy loop
		{10 * time.Millisecond, 9 * time.Second, minRenewRetry},
	} {
		if got := retryDelayBefore(c.backoff, c.left); got != c.want {
			t.Errorf("retryDelayBefore(%s, %s) = %s, want %s", c.backoff, c.left, got, c.want)
		}
	}
}
