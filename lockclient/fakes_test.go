package lockclient

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// realWait bounds how long a test waits, in real time, for the lease's
// goroutines to react to a step of the fake clock. Nothing waits this long
// when the code is right.
const realWait = 2 * time.Second

// t0 is the fake clock's start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a clock that moves only when the test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	pending map[*fakeTimer]bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0, pending: map[*fakeTimer]bool{}} }

type fakeTimer struct {
	c    *fakeClock
	ch   chan time.Time
	when time.Time
	fire func() // set for deadline contexts; else a value is sent on ch
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	was := t.c.pending[t]
	t.drain()
	t.when = t.c.now.Add(d)
	t.c.pending[t] = true
	t.c.mu.Unlock()
	t.c.advance(0) // a timer for now or earlier fires at once
	return was
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.c.pending[t]
	delete(t.c.pending, t)
	t.drain()
	return was
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

// advance moves the clock forward by d, firing every timer that comes due,
// earliest first, with the clock set to its time.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *fakeTimer
		for t := range c.pending {
			if !t.when.After(end) && (next == nil || t.when.Before(next.when)) {
				next = t
			}
		}
		if next == nil {
			if end.After(c.now) {
				c.now = end
			}
			c.mu.Unlock()
			return
		}
		delete(c.pending, next)
		if next.when.After(c.now) {
			c.now = next.when
		}
		now := c.now
		c.mu.Unlock()
		if next.fire != nil {
			next.fire()
		} else {
			next.ch <- now
		}
	}
}

// advanceTo moves the clock to at.
func (c *fakeClock) advanceTo(t *testing.T, at time.Time) {
	t.Helper()
	if d := at.Sub(c.Now()); d < 0 {
		t.Fatalf("cannot move the clock back from %s to %s", c.Now().Sub(t0), at.Sub(t0))
	} else {
		c.advance(d)
	}
}

// waitTimer waits until a timer is pending whose time satisfies ok, and
// returns that time.
func (c *fakeClock) waitTimer(t *testing.T, what string, ok func(time.Time) bool) time.Time {
	t.Helper()
	end := time.Now().Add(realWait)
	for {
		c.mu.Lock()
		var found []time.Duration
		for tm := range c.pending {
			if ok(tm.when) {
				c.mu.Unlock()
				return tm.when
			}
			found = append(found, tm.when.Sub(t0))
		}
		c.mu.Unlock()
		if time.Now().After(end) {
			t.Fatalf("no timer %s pending; pending (after t0): %v", what, found)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitTimerAt waits for a timer set for exactly at.
func (c *fakeClock) waitTimerAt(t *testing.T, at time.Time) {
	t.Helper()
	c.waitTimer(t, "at t0+"+at.Sub(t0).String(), func(w time.Time) bool { return w.Equal(at) })
}

// waitRetry waits for the timer of the retry after request c: the earliest
// timer set after c was sent other than c's own deadline (which its end
// cancels, maybe not yet) and the times in not.
func (c *fakeClock) waitRetry(t *testing.T, after *call, not ...time.Time) time.Time {
	t.Helper()
	return c.waitTimer(t, "for the retry after t0+"+after.at.Sub(t0).String(), func(w time.Time) bool {
		if !w.After(after.at) || w.Equal(after.deadline()) {
			return false
		}
		for _, n := range not {
			if w.Equal(n) {
				return false
			}
		}
		return true
	})
}

// WithDeadline returns a context that ends with DeadlineExceeded when the
// fake clock reaches at.
func (c *fakeClock) WithDeadline(parent context.Context, at time.Time) (context.Context, context.CancelFunc) {
	ctx := &fakeDeadlineCtx{Context: parent, deadline: at, done: make(chan struct{})}
	tm := &fakeTimer{c: c, ch: make(chan time.Time, 1), fire: func() { ctx.end(context.DeadlineExceeded) }}
	go func() {
		select {
		case <-parent.Done():
			ctx.end(parent.Err())
		case <-ctx.done:
		}
	}()
	tm.Reset(at.Sub(c.Now()))
	return ctx, func() { tm.Stop(); ctx.end(context.Canceled) }
}

type fakeDeadlineCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	err      error
}

func (c *fakeDeadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *fakeDeadlineCtx) Done() <-chan struct{}       { return c.done }
func (c *fakeDeadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *fakeDeadlineCtx) end(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

// httpError is an answer with an HTTP status, as api.UnexpectedResponseError.
type httpError struct {
	code int
	body string
}

func (e httpError) Error() string {
	return "Unexpected response code: " + strconv.Itoa(e.code) + " (" + e.body + ")"
}
func (e httpError) HasStatusCode() bool { return true }
func (e httpError) StatusCode() int     { return e.code }
func (e httpError) Body() string        { return e.body }

// call is one request the lease made of the fake lock API. The test answers
// it on reply, or leaves it hanging until its context ends.
type call struct {
	op    string // read, wait (a blocking read), acquire, renew, release
	at    time.Time
	v     *api.Variable // the variable sent (acquire, renew, release)
	index uint64        // a blocking read's WaitIndex
	wait  time.Duration // a blocking read's WaitTime
	ctx   context.Context
	reply chan reply
}

type reply struct {
	v     *api.Variable
	index uint64
	err   error
}

func (c *call) answer(r reply) { c.reply <- r }

func (c *call) deadline() time.Time { d, _ := c.ctx.Deadline(); return d }

// fakeAPI is a lockAPI whose every request is put to the test.
type fakeAPI struct {
	clock *fakeClock
	calls chan *call
	// auto answers the calls it returns true for without the test: the
	// lease's watcher, for tests about something else.
	auto func(*call) (reply, bool)
}

func newFakeAPI(c *fakeClock) *fakeAPI { return &fakeAPI{clock: c, calls: make(chan *call, 64)} }

func (f *fakeAPI) do(c *call) reply {
	c.at, c.reply = f.clock.Now(), make(chan reply, 1)
	if f.auto != nil {
		if r, ok := f.auto(c); ok {
			return r
		}
	}
	f.calls <- c
	select {
	case r := <-c.reply:
		return r
	case <-c.ctx.Done():
		return reply{err: c.ctx.Err()}
	}
}

func (f *fakeAPI) Peek(path string, q *api.QueryOptions) (*api.Variable, *api.QueryMeta, error) {
	c := &call{op: "read", ctx: q.Context(), v: &api.Variable{Path: path}}
	if q.WaitIndex > 0 {
		c.op, c.index, c.wait = "wait", q.WaitIndex, q.WaitTime
	}
	r := f.do(c)
	return r.v, &api.QueryMeta{LastIndex: r.index}, r.err
}

func (f *fakeAPI) AcquireLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	r := f.do(&call{op: "acquire", v: v, ctx: w.Context()})
	return r.v, nil, r.err
}

func (f *fakeAPI) RenewLock(v *api.Variable, w *api.WriteOptions) (*api.VariableMetadata, *api.WriteMeta, error) {
	r := f.do(&call{op: "renew", v: v, ctx: w.Context()})
	return nil, nil, r.err
}

func (f *fakeAPI) ReleaseLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	r := f.do(&call{op: "release", v: v, ctx: w.Context()})
	return nil, nil, r.err
}

func (f *fakeAPI) CheckedCreate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	r := f.do(&call{op: "create", v: v, ctx: w.Context()})
	return r.v, nil, r.err
}

func (f *fakeAPI) Update(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	r := f.do(&call{op: "update", v: v, ctx: w.Context()})
	return r.v, nil, r.err
}

// next returns the next request, which must be op.
func (f *fakeAPI) next(t *testing.T, op string) *call {
	t.Helper()
	select {
	case c := <-f.calls:
		if c.op != op {
			t.Fatalf("request at t0+%s: got %s, want %s", c.at.Sub(t0), c.op, op)
		}
		return c
	case <-time.After(realWait):
		t.Fatalf("no %s request (clock at t0+%s)", op, f.clock.Now().Sub(t0))
		return nil
	}
}

// quiet checks that no request is made while the clock stands still.
func (f *fakeAPI) quiet(t *testing.T) {
	t.Helper()
	select {
	case c := <-f.calls:
		t.Fatalf("unexpected %s request at t0+%s", c.op, c.at.Sub(t0))
	case <-time.After(20 * time.Millisecond):
	}
}

// rig is a Locker on a fake clock and a fake lock API.
type rig struct {
	clock *fakeClock
	api   *fakeAPI
	l     *Locker
}

const (
	testPath  = "locks/web"
	testFence = 20
	testID    = "lock-id-1"
)

func newRig(t *testing.T, timing Timing) *rig {
	t.Helper()
	if timing.TTL == 0 {
		timing.TTL = 10 * time.Second
	}
	if timing.LockDelay == 0 {
		timing.LockDelay = time.Second
	}
	cfg, err := Config{Path: testPath, Timing: timing, Holder: Holder{AllocID: "alloc-self"}}.prepared()
	if err != nil {
		t.Fatal(err)
	}
	c := newFakeClock()
	f := newFakeAPI(c)
	// The watcher's blocking query is an accelerator only: the tests of
	// renew timing switch it off the way Nomad does for a token without
	// read capability.
	f.auto = func(c *call) (reply, bool) {
		if c.op == "wait" && c.index == testFence {
			return reply{err: httpError{403, "Permission denied"}}, true
		}
		return reply{}, false
	}
	return &rig{clock: c, api: f, l: newLocker(cfg, nil, f, c)}
}

// acquired is the answer to an acquire that grants the lock.
func acquired() reply {
	return reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence, Lock: &api.VariableLock{ID: testID}}}
}

// acquire takes the lock at t0 with no one holding it, and waits until the
// lease has set its renew and fence timers.
func (r *rig) acquire(t *testing.T) *Lease {
	t.Helper()
	got := make(chan *Lease, 1)
	go func() {
		ls, err := r.l.Acquire(context.Background(), AcquireOptions{})
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- ls
	}()
	r.api.next(t, "read").answer(reply{index: 5})
	r.api.next(t, "acquire").answer(acquired())
	ls := <-got
	if ls == nil {
		t.FailNow()
	}
	t.Cleanup(func() { ls.stopOnce.Do(func() { close(ls.stop); ls.cancelReq() }) })
	tm := r.l.cfg.Timing
	r.clock.waitTimerAt(t, t0.Add(tm.RenewInterval))
	r.clock.waitTimerAt(t, t0.Add(tm.TTL-tm.FenceMargin))
	return ls
}

// closedWithin reports whether ch closes within realWait.
func closedWithin(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(realWait):
		return false
	}
}

// stillOpen reports whether ch stays open for a short real while.
func stillOpen(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	case <-time.After(20 * time.Millisecond):
		return true
	}
}

func (f *fakeAPI) CheckedUpdate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	r := f.do(&call{op: "cas", v: v, ctx: w.Context()})
	return r.v, nil, r.err
}
