package shim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/ctxsleep"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// LBFollower keeps one allocation's upstream in the load balancer for
// exactly the tenures in which that allocation holds the lock, and only
// while its health check passes. It is `lock lb follow`: a poststart sidecar
// beside a task that holds the lock itself (a docker task with lock as its
// entrypoint), which outlives the holder's restarts, so that it sees every
// tenure of its allocation, the first and every one won back.
//
// It reads only the lock variable (blocking queries: read on the lock path
// is all its token needs) and its own upstream's health, and it sends only
// requests of its own allocation: the ADD of a
// tenure (`<allocID>-ADD-<fence>`, which also removes the previous holder's
// upstream as recorded in the lock) and the REMOVE of its own upstream.
//
// A tenure of the allocation is a holder record (holder_alloc_id,
// acquired_at, holder_pid) naming it. It ends when the record names another
// allocation, says released_clean, shows the lock free (tokens that see the
// Lock field), or, for the workload identity, which does not see it, when
// the variable's ModifyIndex moves on while the record stays: only a
// release or the server's expiry does that (a renew writes nothing).
// Whatever the lock says, the upstream is taken out as soon as its health
// check fails twice in a row: a holder killed outright (docker kill, OOM)
// keeps its lock until the server expires it, 2×TTL later, but its upstream
// leaves the LB within about one check interval.
//
// With a semaphore (a Locker with Holders) it follows every slot: a tenure
// is a slot's record naming the allocation, and the ADD swaps out that
// slot's previous holder's upstream. Each holder of a slot is listed while
// it holds; every slot's next holder removes the previous one, so at most
// N upstreams of holders stay listed.
type LBFollower struct {
	LB      *LoadBalancer // Upstream and Health resolved; Health nil: a tcp check of Upstream
	Client  *lbhook.Client
	Locker  *lockclient.Locker
	AllocID string
	Logger  hclog.Logger
}

// ErrLBFollowADD is wrapped by Run's error when the LB refused an ADD.
var ErrLBFollowADD = errors.New("the load balancer refused the ADD")

// Run follows the lock until ctx ends (the sidecar's kill signal), then
// removes its upstream if it may be registered, and returns that REMOVE's
// error (nil when it succeeded or was not needed). It returns earlier,
// with an error, when the lock cannot be read for good (an ACL) or an ADD
// ended FAILED, CANCELED or INVALID_REQUEST_NOOP (its upstream removed
// first, if it was listed before).
func (f *LBFollower) Run(ctx context.Context) error {
	r := newFollowRun(f)
	defer r.stopHealth()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	for i, l := range r.lockers {
		go f.watchLock(watchCtx, l, i, r.statuses[i])
	}
	merged := make(chan lockRead)
	for _, ch := range r.statuses {
		go func() {
			for {
				select {
				case <-watchCtx.Done():
					return
				case st := <-ch:
					select {
					case merged <- st:
					case <-watchCtx.Done():
						return
					}
				}
			}
		}()
	}
	r.refresh(ctx)
	recheck := time.NewTicker(max(f.LB.Recheck, time.Second))
	defer recheck.Stop()
	var err error
	for err == nil {
		if ctx.Err() != nil {
			return r.shutdown()
		}
		if s := r.v.next(); s.kind != stepNone {
			err = r.do(ctx, s)
			continue
		}
		select {
		case <-ctx.Done():
			return r.shutdown()
		case st := <-merged:
			if st.err != nil {
				err = st.err
				break
			}
			r.observe(ctx, st.slot, st.Status)
		case h := <-r.health:
			if h.gen == r.gen {
				r.v.healthy = h.ok
				if !h.ok {
					f.Logger.Warn("health check failed", "address", r.check.Address, "error", h.err)
				}
			}
		case <-recheck.C:
			r.refresh(ctx)
		}
	}
	if ctx.Err() != nil {
		return r.shutdown()
	}
	if sErr := r.shutdown(); sErr != nil {
		f.Logger.Error("lb remove on the way out failed", "error", sErr)
	}
	return err
}

// followView is what the follower knows, and decides from: its
// allocation's current tenure, that tenure's health, and its registration.
// It sends nothing itself; next says what to send.
type followView struct {
	alloc string
	// tenure is the allocation's current tenure; nil while it holds none.
	tenure *tenure
	// ended is the key of the last tenure seen to end, so that the same
	// record, read again, does not start it over.
	ended string
	// read is set by the first read of the lock; until then nothing is sent.
	read bool
	// index is the variable's latest ModifyIndex seen.
	index   uint64
	healthy bool
	// listed: our upstream is, or may be, in the LB (an ADD was sent and
	// no REMOVE succeeded since), registered under listedFence.
	listed      bool
	listedFence uint64
	// failedADD holds new ADDs back until the next recheck, after one
	// whose success the LB's state did not show.
	failedADD bool
}

// tenure is one acquisition of the lock by the allocation.
type tenure struct {
	key      string // the holder record: acquired_at and pid
	fence    uint64 // the ModifyIndex at which the record was first seen
	previous string // the previous holder's upstream, as recorded
}

// observe takes a read of the lock. It reports whether the allocation's
// tenure began or ended with it.
func (v *followView) observe(st lockclient.Status) (began, ended bool) {
	v.read, v.index = true, max(v.index, st.Fence)
	h := st.Holder
	key := h.AcquiredAt.UTC().Format(time.RFC3339Nano) + "/" + strconv.Itoa(h.PID)
	own := st.Exists && h.AllocID == v.alloc && !h.ReleasedClean && h.ReleasedAt.IsZero() && (!st.HeldKnown || st.Held)
	switch {
	case !own:
		if v.tenure != nil {
			v.ended, v.tenure = v.tenure.key, nil
			return false, true
		}
		return false, false
	case v.tenure != nil && v.tenure.key == key:
		if st.Fence != v.tenure.fence && !st.HeldKnown {
			// The record stayed and the index moved: a release or an
			// expiry (a renew writes nothing; the holder's other
			// write, released_clean, says so).
			v.ended, v.tenure = key, nil
			return false, true
		}
		return false, false
	case v.tenure == nil && v.ended == key:
		return false, false
	}
	ended = v.tenure != nil
	if ended {
		v.ended = v.tenure.key
	}
	v.tenure = &tenure{key: key, fence: st.Fence, previous: h.PreviousUpstream}
	v.healthy = false
	return true, ended
}

type stepKind int

const (
	stepNone stepKind = iota
	stepAdd
	stepRemove
)

// step is one LB request to send.
type step struct {
	kind     stepKind
	fence    uint64 // the request ids' fence
	previous string // ADD: the upstream to swap out
}

// next is the request that brings the LB to what the view wants: our
// upstream listed exactly while the allocation holds a tenure and passes
// its health check, under that tenure's fence.
func (v *followView) next() step {
	want := v.tenure != nil && v.healthy
	switch {
	case !v.read:
	case v.listed && !want:
		fence := v.listedFence
		if fence == 0 {
			fence = v.index // listed before we started: its fence is unknown
		}
		return step{kind: stepRemove, fence: fence}
	case want && !v.failedADD && (!v.listed || v.listedFence != v.tenure.fence):
		// A new tenure of ours after one we had listed (the task was
		// restarted and won the lock back at once) is added under its own
		// fence: the previous holder may have been listed between.
		return step{kind: stepAdd, fence: v.tenure.fence, previous: v.tenure.previous}
	}
	return step{}
}

// followRun is one Run's working state, owned by Run's loop.
type followRun struct {
	f *LBFollower
	// v is the allocation's view: its tenure is the latest of its slots'
	// (a plain lock has one slot); slots are each slot's own view, of
	// which only the tenure is used.
	v       followView
	slots   []followView
	lockers []*lockclient.Locker
	self    lbhook.UpstreamInfo
	check   HealthCheck
	// statuses are each slot's reads, the latest replacing one not taken.
	statuses []chan lockRead
	health   chan healthResult
	gen      int // the health watch's generation: one per tenure
	stopH    context.CancelFunc
	// attempts is the last attempt sent per fence and kind.
	attempts map[string]int
}

type lockRead struct {
	lockclient.Status
	slot int
	err  error
}

type healthResult struct {
	gen int
	ok  bool
	err error
}

func newFollowRun(f *LBFollower) *followRun {
	check := HealthCheck{Type: "tcp", Address: f.LB.Upstream}
	if f.LB.Health != nil {
		check = *f.LB.Health
	}
	lockers := f.Locker.Slots()
	if len(lockers) == 0 {
		lockers = []*lockclient.Locker{f.Locker}
	}
	r := &followRun{
		f: f, v: followView{alloc: f.AllocID}, lockers: lockers,
		self:     f.Client.Self(f.LB.Upstream),
		check:    check,
		health:   make(chan healthResult, 1),
		attempts: map[string]int{},
	}
	for range lockers {
		r.slots = append(r.slots, followView{alloc: f.AllocID})
		r.statuses = append(r.statuses, make(chan lockRead, 1))
	}
	return r
}

// observeSlot takes a read of one slot into that slot's view, and makes
// the allocation's tenure the latest (highest fence) of its slots': the
// allocation holds one slot at a time, though a slot's end may be read
// after the next slot's start. It reports whether the allocation's tenure
// began or ended with it.
func (r *followRun) observeSlot(slot int, st lockclient.Status) (began, ended bool) {
	if len(r.slots) == 1 {
		return r.v.observe(st)
	}
	sv := &r.slots[slot]
	sv.observe(st)
	read := true
	var cur *tenure
	for i := range r.slots {
		read = read && r.slots[i].read
		if t := r.slots[i].tenure; t != nil && (cur == nil || t.fence > cur.fence) {
			cur = t
		}
	}
	v := &r.v
	v.read, v.index = read, max(v.index, st.Fence)
	old := v.tenure
	if old == cur {
		return false, false
	}
	v.tenure = cur
	if old != nil {
		v.ended = old.key
	}
	if cur != nil {
		v.healthy = false
	}
	return cur != nil, old != nil
}

// watchLock reads the lock with blocking queries and passes every answer
// on, the latest replacing one not yet taken.
func (f *LBFollower) watchLock(ctx context.Context, l *lockclient.Locker, slot int, out chan lockRead) {
	var index uint64
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		st, next, err := l.StatusAfter(ctx, index)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if lockclient.Permanent(err) {
				latest(out, lockRead{slot: slot, err: fmt.Errorf("read the lock %s: %w", l.Config().Path, err)})
				return
			}
			f.Logger.Warn("reading the lock failed; retrying", "error", err, "backoff", wait)
			if ctxsleep.Sleep(ctx, wait) != nil {
				return
			}
			wait = min(2*wait, 5*time.Second)
			continue
		}
		wait = 100 * time.Millisecond
		latest(out, lockRead{Status: st, slot: slot})
		if next == 0 && ctxsleep.Sleep(ctx, time.Second) != nil {
			return
		}
		index = next
	}
}

// latest sends v on a channel of capacity 1, replacing a value not yet taken.
func latest[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// observe applies a read of the lock, and (re)starts the health watch for
// a new tenure.
func (r *followRun) observe(ctx context.Context, slot int, st lockclient.Status) {
	began, ended := r.observeSlot(slot, st)
	log := r.f.Logger
	if ended {
		log.Info("this allocation's tenure of the lock ended", "fence", st.Fence)
		r.stopHealth()
	}
	if began {
		log.Info("this allocation holds the lock: waiting for the health check", "fence", r.v.tenure.fence,
			"address", r.check.Address)
		r.startHealth(ctx)
	}
}

func (r *followRun) startHealth(ctx context.Context) {
	r.stopHealth()
	r.gen++
	hctx, cancel := context.WithCancel(ctx)
	r.stopH = cancel
	go watchHealth(hctx, r.check, r.gen, r.health)
}

func (r *followRun) stopHealth() {
	if r.stopH != nil {
		r.stopH()
		r.stopH = nil
	}
	r.gen++
	r.v.healthy = false
}

// watchHealth waits for the check to pass (fast at first: the workload is
// starting), reports it, then checks every interval; a failure is
// confirmed by a second check at once, and reported. Then it waits again.
func watchHealth(ctx context.Context, h HealthCheck, gen int, out chan healthResult) {
	interval := h.Interval
	if interval == 0 {
		interval = DefaultHealthInterval
	}
	for {
		if h.Wait(ctx) != nil {
			return
		}
		latest(out, healthResult{gen: gen, ok: true})
		h.Grace = 0
		for {
			if ctxsleep.Sleep(ctx, interval) != nil {
				return
			}
			err := checkOnce(ctx, &h)
			if err != nil && ctxsleep.Sleep(ctx, min(interval/4, 250*time.Millisecond)) == nil {
				err = checkOnce(ctx, &h)
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				latest(out, healthResult{gen: gen, err: err})
				break
			}
		}
	}
}

// refresh reads the LB's state and takes from it whether our upstream is
// listed: the truth, after a restart of the follower, an id Baragon had
// already finished, or a change made out of band.
func (r *followRun) refresh(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 2*r.f.Client.Config().RequestTimeout)
	defer cancel()
	st, err := r.f.Client.ServiceState(rctx)
	if errors.Is(err, lbhook.ErrNotFound) {
		err = nil // an unknown service lists no one
	}
	ups := st.Upstreams
	if err != nil {
		if ctx.Err() == nil {
			r.f.Logger.Warn("lb re-check failed; trying again next interval", "error", err)
		}
		return
	}
	r.v.failedADD = false
	listed := lbhook.HasUpstream(ups, r.self)
	if listed != r.v.listed {
		r.f.Logger.Warn("the load balancer's state differs from what this follower sent; following the state",
			"upstream", r.self.Upstream, "listed", listed)
		r.v.listed = listed
		if !listed {
			r.v.listedFence = 0
		}
	}
}

func (r *followRun) nextAttempt(kind lbhook.RequestKind, fence uint64) int {
	k := fmt.Sprintf("%s/%d", kind, fence)
	r.attempts[k]++
	return r.attempts[k]
}

// do sends one step and records its outcome in the view.
func (r *followRun) do(ctx context.Context, s step) error {
	hook, err := r.f.Client.ForAlloc(r.f.AllocID, s.fence)
	if err != nil {
		return err
	}
	if s.kind == stepRemove {
		return r.remove(ctx, hook)
	}
	var prev []lbhook.UpstreamInfo
	if s.previous != "" {
		prev = []lbhook.UpstreamInfo{{Upstream: s.previous, Group: r.f.LB.Group}}
	}
	attempt := r.nextAttempt(lbhook.KindAdd, s.fence)
	wasListed, wasFence := r.v.listed, r.v.listedFence
	r.v.listed, r.v.listedFence = true, s.fence
	began := time.Now()
	resp, err := hook.AddAt(ctx, r.self, prev, attempt)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopping: shutdown removes it
		}
		var oe *lbhook.OutcomeError
		if errors.As(err, &oe) || errors.Is(err, lbhook.ErrNeverReached) {
			// Baragon applied nothing, or never saw it: we are listed as
			// we were before it.
			r.v.listed, r.v.listedFence = wasListed, wasFence
			return fmt.Errorf("%w: %s", ErrLBFollowADD, lbhook.Diagnose(err, r.f.Client.Config()).String())
		}
		r.f.Logger.Warn("lb add did not finish; following the LB's state", "error", err)
		r.refresh(ctx)
		return nil
	}
	r.refresh(ctx)
	if !r.v.listed {
		r.f.Logger.Warn("lb add answered SUCCESS, but the service's state does not list us; adding again at the next re-check",
			"request_id", resp.LoadBalancerRequestID)
		r.v.failedADD = true
		return nil
	}
	r.v.listedFence = s.fence
	r.f.Logger.Info("registered with the load balancer", "upstream", r.self.Upstream, "fence", s.fence,
		"request_id", resp.LoadBalancerRequestID, "removed_previous", s.previous, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

func (r *followRun) remove(ctx context.Context, hook *lbhook.Hook) error {
	k := fmt.Sprintf("%s/%d", lbhook.KindRemove, hook.Fence())
	began := time.Now()
	resp, last, err := hook.RemoveFrom(ctx, r.self, r.attempts[k]+1)
	r.attempts[k] = last
	if err != nil {
		if ctx.Err() == nil {
			r.f.Logger.Error("lb remove failed; following the LB's state", "error", lbhook.Diagnose(err, r.f.Client.Config()).String())
			r.refresh(ctx)
			if r.v.listed {
				// Try again at the next re-check, not in a tight loop.
				r.v.listedFence = hook.Fence()
				return ctxsleep.Sleep(ctx, max(r.f.LB.Recheck, time.Second)) // ctx's end is Run's to see
			}
		}
		return nil
	}
	r.v.listed, r.v.listedFence = false, 0
	r.f.Logger.Info("removed from the load balancer", "upstream", r.self.Upstream, "fence", hook.Fence(),
		"request_id", resp.LoadBalancerRequestID, "took", time.Since(began).Round(time.Millisecond))
	r.refresh(ctx)
	return nil
}

// shutdown removes our upstream, if it may be listed, within the
// REMOVE's deadline.
func (r *followRun) shutdown() error {
	r.stopHealth()
	if !r.v.listed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.f.Client.Config().RemoveDeadline+r.f.Client.Config().RequestTimeout)
	defer cancel()
	fence := r.v.listedFence
	if fence == 0 {
		fence = r.v.index
	}
	hook, err := r.f.Client.ForAlloc(r.f.AllocID, fence)
	if err != nil {
		return err
	}
	k := fmt.Sprintf("%s/%d", lbhook.KindRemove, fence)
	resp, _, err := hook.RemoveFrom(ctx, r.self, r.attempts[k]+1)
	if err != nil {
		return fmt.Errorf("lb remove of %s: %s", r.self.Upstream, lbhook.Diagnose(err, r.f.Client.Config()).String())
	}
	r.v.listed = false
	r.f.Logger.Info("removed from the load balancer on the way out", "upstream", r.self.Upstream,
		"request_id", resp.LoadBalancerRequestID)
	return nil
}
