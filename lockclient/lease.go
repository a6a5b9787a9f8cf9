package lockclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/nomad/api"
)

// Lease is one held lock. It renews itself until Release, or until it is lost.
type Lease struct {
	// Fence is the variable's ModifyIndex written by our acquire: a Raft index,
	// so it grows with every grant cluster-wide. Hand it to the workload as a
	// fencing token; never hand out the lock ID.
	Fence uint64
	// Previous is the holder recorded in the variable before we acquired it
	// (zero if none). The LB hook removes its upstream.
	Previous Holder
	// Slot is the semaphore slot this lease holds, 0 to Holders-1, and
	// Holders the semaphore's N; Holders is 0 for a plain lock.
	Slot, Holders int
	// Adopted: taken over from this holder's previous run (Adopt), not
	// acquired.
	Adopted bool

	locker *Locker
	id     string
	// previousItems is the record of Previous as read before the acquire.
	previousItems map[string]string

	mu        sync.Mutex
	lastRenew time.Time // send time of the last successful acquire or renew
	err       error     // why the lease ended; nil while held
	conflict  bool      // the server said we no longer hold it
	// refused: a renew since the last good one was answered 409 (the lock
	// then proven still ours, see stillOurs). If no renew succeeds before
	// the fence deadline, the loss then counts as the server's word.
	refused bool
	// Lease mode (heartbeat.go): lastBeat is the send time of the last
	// acknowledged heartbeat (the acquire's before the first), beatSeq
	// and beatIndex the last heartbeat's sequence and ModifyIndex;
	// beating is closed once the first heartbeat is written.
	lastBeat  time.Time
	beatSeq   uint64
	beatIndex uint64
	beating   chan struct{}
	// prevSealed is the allocation of the heartbeat found sealed by a
	// standby when the heartbeat started (PreviousTakenOver).
	prevSealed string
	// itemsIndex is the variable's ModifyIndex after this lease's last
	// write of its record (writeItem); 0: none since the acquire (Fence).
	itemsIndex uint64

	lost      chan struct{}
	renewed   chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
	cancelReq context.CancelFunc
	done      chan struct{}
}

func newLease(l *Locker, id string, fence uint64, sent time.Time, previous Holder) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	ls := &Lease{
		Fence:     fence,
		Previous:  previous,
		locker:    l,
		id:        id,
		lastRenew: sent,
		lastBeat:  sent,
		beating:   make(chan struct{}),
		lost:      make(chan struct{}),
		renewed:   make(chan struct{}, 1),
		stop:      make(chan struct{}),
		cancelReq: cancel,
		done:      make(chan struct{}),
	}
	go ls.renewLoop(ctx)
	return ls
}

// LockID is the secret that renews and releases this lease. Hand it only to
// a party that may end the lease (the driver, for a crashed supervisor);
// never to the workload.
func (ls *Lease) LockID() string { return ls.id }

// PreviousItem is the item key of the previous holder's record, as read
// before the acquire ("" if none): one its caller wrote (AcquireOptions.Items).
func (ls *Lease) PreviousItem(key string) string { return ls.previousItems[key] }

// Path is the variable path of the lock.
func (ls *Lease) Path() string { return ls.locker.cfg.Path }

// Lost is closed the moment the lease is lost: renew got 404, or 409 and the
// variable no longer shows our lock unchanged since our acquire, or the
// fence deadline passed without a successful renew.
func (ls *Lease) Lost() <-chan struct{} { return ls.lost }

// Renewed receives after successful renews (coalesced: a slow reader sees
// one value for several renews). Use it to republish FenceDeadline.
func (ls *Lease) Renewed() <-chan struct{} { return ls.renewed }

// Err is nil while held, a *LostError after a loss, ErrReleased after Release.
func (ls *Lease) Err() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// FenceDeadline is last good renew + TTL - FenceMargin. Past it we no longer
// claim the lock, whatever the server thinks.
func (ls *Lease) FenceDeadline() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.fenceDeadlineLocked()
}

// until is how long from now, on the lease's clock, to t.
func (ls *Lease) until(t time.Time) time.Duration { return t.Sub(ls.locker.clock.Now()) }

func (ls *Lease) fenceDeadlineLocked() time.Time {
	t := ls.locker.cfg.Timing
	fence := ls.lastRenew.Add(t.TTL - t.FenceMargin)
	if hb := ls.locker.cfg.Heartbeat; hb != nil {
		fence = earliest(fence, ls.lastBeat.Add(hb.Fence))
	}
	return fence
}

// beatFencedLocked reports whether the heartbeat fence, not the renew's,
// is the fence deadline.
func (ls *Lease) beatFencedLocked() bool {
	t := ls.locker.cfg.Timing
	hb := ls.locker.cfg.Heartbeat
	return hb != nil && ls.lastBeat.Add(hb.Fence).Before(ls.lastRenew.Add(t.TTL-t.FenceMargin))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// StopDeadline is when the workload must be gone after a loss. If the server
// told us we lost the lock, that is the fence deadline. If we merely could not
// renew, the server keeps the lock for 2*TTL + LockDelay after the last renew,
// so the workload may use up to 2*TTL - FenceMargin to stop.
func (ls *Lease) StopDeadline() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.conflict {
		return ls.fenceDeadlineLocked()
	}
	t := ls.locker.cfg.Timing
	stop := ls.lastRenew.Add(2*t.TTL - t.FenceMargin)
	if hb := ls.locker.cfg.Heartbeat; hb != nil {
		// Lease mode: a standby may release the lock Fence + KillGrace +
		// TakeoverMargin after our last acknowledged heartbeat.
		stop = earliest(stop, ls.lastBeat.Add(hb.Fence+hb.KillGrace))
	}
	return stop
}

func (ls *Lease) lose(reason string, cause LostCause, conflict bool) {
	ls.mu.Lock()
	if ls.err != nil {
		ls.mu.Unlock()
		return
	}
	ls.err = &LostError{Reason: reason, Cause: cause}
	ls.conflict = conflict
	close(ls.lost)
	ls.mu.Unlock()
	if o := ls.locker.observer.get(); o != nil {
		o.Lost(cause)
	}
}

// renewLoop renews every RenewInterval; after an error it retries with backoff.
// Every call is bounded by the fence deadline, so a hung Nomad cannot keep us
// believing we hold the lock. A change of the variable seen by watchLoop
// triggers a renew at once, so an external release is noticed in milliseconds
// rather than at the next renew.
func (ls *Lease) renewLoop(ctx context.Context) {
	defer close(ls.done)
	l := ls.locker
	t := l.cfg.Timing
	bo := l.newBackoff()

	changed := make(chan struct{}, 1)
	go ls.watchLoop(ctx, changed)
	var beat chan struct{}
	if l.cfg.Heartbeat != nil {
		beat = make(chan struct{}, 1)
		go func() {
			select {
			case <-ls.beating:
				ls.heartbeatLoop(ctx, beat)
			case <-ls.stop:
			}
		}()
	}

	renew := l.clock.NewTimer(t.RenewInterval)
	defer renew.Stop()
	fence := l.clock.NewTimer(ls.until(ls.FenceDeadline()))
	defer fence.Stop()

	for {
		select {
		case <-ls.stop:
			return
		case <-fence.C():
			if d := ls.until(ls.FenceDeadline()); d > 0 {
				fence.Reset(d)
				continue
			}
			ls.mu.Lock()
			refused, beatFenced := ls.refused, ls.beatFencedLocked()
			ls.mu.Unlock()
			why := fmt.Sprintf("no successful renew before the fence deadline (%s after the last renew, TTL %s)", t.TTL-t.FenceMargin, t.TTL)
			if beatFenced {
				why = fmt.Sprintf("no acknowledged heartbeat before the lease fence (lease_fence %s after the last one): "+
					"a standby may take the lock over %s after it", l.cfg.Heartbeat.Fence, l.cfg.Heartbeat.Takeover())
				refused = false
			}
			if refused {
				why += "; Nomad answered 409 to the last renews"
			}
			ls.lose(why, LostFenceDeadline, refused)
			return
		case <-changed:
			l.log.Debug("lock variable changed, renewing now to confirm we still hold it")
		case <-beat:
			// A heartbeat moved the fence deadline: republish it.
			fence.Reset(ls.until(ls.FenceDeadline()))
			select {
			case ls.renewed <- struct{}{}:
			default:
			}
			continue
		case <-renew.C():
		}

		sent, deadline := l.clock.Now(), ls.FenceDeadline()
		err := ls.renewOnce(ctx)
		ls.reportRenew(OpRenew, sent, deadline, err)
		switch code := statusCode(err); {
		case err == nil:
			ls.mu.Lock()
			ls.lastRenew = sent
			ls.refused = false
			ls.mu.Unlock()
			bo.Reset()
			renew.Reset(t.RenewInterval)
			fence.Reset(ls.until(ls.FenceDeadline()))
			select {
			case ls.renewed <- struct{}{}:
			default:
			}
		case code == http.StatusConflict && !notHeld(err) && ls.stillOurs(ctx):
			// A new Nomad leader answers renews before it has restored
			// its lock timers, and a renew that finds no timer gets 409.
			// The lock is proven ours and untouched since our acquire, and
			// the server cannot expire it before 2*TTL after our last good
			// renew: ask again, until the unchanged fence deadline.
			ls.mu.Lock()
			ls.refused = true
			ls.mu.Unlock()
			d := ls.renewRetryDelay(bo)
			l.log.Warn("renew answered 409, but the lock is still ours and unchanged (a new Nomad leader not yet tracking it?); retrying",
				"answer", responseBody(err), "backoff", d, "fence_deadline_in", ls.until(ls.FenceDeadline()).Round(time.Millisecond))
			renew.Reset(d)
		case code == http.StatusConflict || notHeld(err):
			cause := LostConflict
			if notHeld(err) {
				cause = LostExpiry
			}
			ls.lose("Nomad answered "+strconv.Itoa(code)+" on renew: the lock is no longer ours ("+responseBody(err)+")", cause, true)
			return
		case code == http.StatusNotFound:
			ls.lose("Nomad answered 404 on renew: the lock variable was deleted", LostDeleted, true)
			return
		case errors.Is(ctx.Err(), context.Canceled):
			return
		default:
			d := ls.renewRetryDelay(bo)
			l.log.Warn("renew failed, retrying", "error", l.classify("renew", err), "backoff", d,
				"fence_deadline_in", ls.until(ls.FenceDeadline()).Round(time.Millisecond))
			renew.Reset(d)
		}
	}
}

// reportRenew tells the observer of a renew or heartbeat sent at sent,
// when the fence deadline was fence, and answered now with err; a
// cancelled one (the lease ends) is not reported.
func (ls *Lease) reportRenew(op RenewOp, sent, fence time.Time, err error) {
	o := ls.locker.observer.get()
	if o == nil || errors.Is(err, context.Canceled) {
		return
	}
	now := ls.locker.clock.Now()
	o.Renewed(RenewReport{Op: op, Took: now.Sub(sent), FenceLeft: fence.Sub(now), Failed: err != nil})
}

// renewRetriesLeft is how many retries of a failed renew at least fit
// before the fence deadline: the backoff never waits longer than the time
// left over this many. A Nomad leader election ends with a window of
// 409s and then a leader that answers; one long backoff can step over
// that moment into the next outage and lose the lock (row
// 9-leader-election, several elections a minute).
const renewRetriesLeft = 8

// renewRetryDelay is the wait before the next renew after a failed one:
// the backoff's, but no longer than the time left to the fence deadline
// over renewRetriesLeft, and at least minRenewRetry.
func (ls *Lease) renewRetryDelay(bo backoff.BackOff) time.Duration {
	return retryDelayBefore(bo.NextBackOff(), ls.until(ls.FenceDeadline()))
}

const minRenewRetry = 50 * time.Millisecond

func retryDelayBefore(backoff, left time.Duration) time.Duration {
	return max(minRenewRetry, min(backoff, left/renewRetriesLeft))
}

// lastIndex is the variable's ModifyIndex as this lease last left it: its
// acquire's (Fence), or its own last write of the lock's record.
func (ls *Lease) lastIndex() uint64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return cmp.Or(ls.itemsIndex, ls.Fence)
}

// stillOurs reads the variable after a renew was answered 409 and reports
// whether it proves the lock still ours: held under our lock ID with the
// ModifyIndex we left it at (every acquire, release, expiry or write moves
// it). Failed reads are retried for up to RequestTimeout, never past the
// fence deadline; no proof by then counts as a loss.
func (ls *Lease) stillOurs(ctx context.Context) bool {
	l := ls.locker
	rctx, cancel := ls.requestContext(ctx)
	defer cancel()
	bo := l.newBackoff()
	for {
		cur, _, err := l.read(rctx, 0)
		if err == nil {
			v := cur.v
			ours := v != nil && v.Lock != nil && v.Lock.ID == ls.id && v.ModifyIndex == ls.lastIndex()
			if !ours {
				l.log.Debug("renew answered 409 and the lock is no longer ours", "modify_index", modifyIndex(v), "fence", ls.Fence)
			}
			return ours
		}
		if permanent(err) || sleep(rctx, l.clock, bo.NextBackOff()) != nil {
			l.log.Warn("renew answered 409 and reading the lock to check it failed", "error", err)
			return false
		}
	}
}

func modifyIndex(v *api.Variable) uint64 {
	if v == nil {
		return 0
	}
	return v.ModifyIndex
}

// watchLoop parks a blocking query on the variable and reports every change
// (a release, an expiry, another acquire) on changed. It is only an
// accelerator: renews remain the authority, so errors merely pause it.
func (ls *Lease) watchLoop(ctx context.Context, changed chan<- struct{}) {
	l := ls.locker
	index := ls.lastIndex()
	bo := l.newBackoff()
	for ctx.Err() == nil {
		_, next, err := l.read(ctx, index)
		switch {
		case ctx.Err() != nil:
			return
		case statusCode(err) == http.StatusForbidden:
			l.log.Debug("cannot watch the lock variable (no read capability); relying on renews", "error", err)
			return
		case err != nil:
			_ = sleep(ctx, l.clock, bo.NextBackOff())
			continue
		}
		bo.Reset()
		if next > index {
			index = next
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}
}

// requestContext bounds one request (retries included) of the renew path:
// RequestTimeout from now, never past the fence deadline.
func (ls *Lease) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	l := ls.locker
	deadline := l.clock.Now().Add(l.cfg.RequestTimeout)
	if fence := ls.FenceDeadline(); fence.Before(deadline) {
		deadline = fence
	}
	return l.clock.WithDeadline(ctx, deadline)
}

func (ls *Lease) renewOnce(ctx context.Context) error {
	l := ls.locker
	rctx, cancel := ls.requestContext(ctx)
	defer cancel()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Lock: &api.VariableLock{ID: ls.id}}
	_, _, err := l.vars.RenewLock(v, l.writeOptions(rctx))
	return err
}

// Release stops renewing and releases the lock at once (no lock delay applies
// to a release). Call it only once the workload is gone. It retries transport
// errors until ctx ends. A lock that was already lost is reported, not an error
// to retry. Past the release cutoff (Timing.ReleaseCutoff) nothing is sent:
// the error wraps ErrLeftToExpire and the lock expires on the server.
func (ls *Lease) Release(ctx context.Context) error {
	ls.stopRenewing()
	// Lease mode: the escrowed lock ID is overwritten first, and only
	// while the lease is still ours: once lost (fenced, or sealed by a
	// standby), a standby may have released the lock and the next holder
	// escrowed its own ID, which this write would overwrite.
	ls.clearEscrow(ctx)
	if err := ls.locker.ReleaseID(ctx, ls.id, ls.LastRenew()); err != nil {
		return err
	}
	ls.mu.Lock()
	if ls.err == nil {
		ls.err = ErrReleased
	}
	ls.mu.Unlock()
	ls.locker.log.Info("lock released", "fence", ls.Fence)
	return nil
}

// LastRenew is when the last renew the server acknowledged (or the acquire)
// was sent, on the lease's clock (CLOCK_BOOTTIME in production: BootNanos
// turns it into a reading another process can use). The server's expiry
// timer started no earlier.
func (ls *Lease) LastRenew() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.lastRenew
}

// ReleaseCutoff is Timing.ReleaseCutoff of the lease's last acknowledged
// renew: from then on the lease is left to expire.
func (ls *Lease) ReleaseCutoff() time.Time {
	return ls.locker.cfg.ReleaseCutoff(ls.LastRenew())
}

// stopRenewing ends the renew and watch loops and waits for them.
func (ls *Lease) stopRenewing() {
	ls.stopOnce.Do(func() {
		close(ls.stop)
		ls.cancelReq()
	})
	<-ls.done
}

// ReleaseID releases the lock held under lock ID id, whose last
// acknowledged renew (or acquire) was sent at lastRenew on the locker's
// clock. The driver uses it for a supervisor that died holding the lock,
// once it has proven that every process of the task is gone. It retries
// transport errors until ctx ends; an answer that the lock is not (or no
// longer) held under id wraps ErrLost. No attempt is sent from the release
// cutoff on (see Timing.ReleaseCutoff): the error then wraps
// ErrLeftToExpire.
func (l *Locker) ReleaseID(ctx context.Context, id string, lastRenew time.Time) error {
	bo := l.newBackoff()
	var rejectedSince time.Time
	for {
		if err := l.mayRelease("release", lastRenew); err != nil {
			return err
		}
		rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
		v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Lock: &api.VariableLock{ID: id}}
		out, _, err := l.vars.ReleaseLock(v, l.writeOptions(rctx))
		cancel()
		switch code := statusCode(err); {
		case err == nil:
			l.markReleased(ctx, modifyIndex(out))
			return nil
		case code == http.StatusConflict || code == http.StatusNotFound || notHeld(err):
			return fmt.Errorf("release %s: %w: Nomad answered %d, the lock was no longer ours", l.cfg.Path, ErrLost, code)
		case permanent(err):
			return l.classify("release", err)
		case identityRejected(err):
			// The servers are asked again for a while (they may have been
			// busy); an allocation that is gone stays gone, and the caller
			// may have another way to release (the plugin's token).
			if rejectedSince.IsZero() {
				rejectedSince = l.clock.Now()
			} else if l.clock.Now().Sub(rejectedSince) >= identityRejectedFor {
				return fmt.Errorf("release %s: %w (%v)", l.cfg.Path, ErrIdentityRejected, err)
			}
		}
		d := bo.NextBackOff()
		l.log.Warn("release failed, retrying", "error", l.classify("release", err), "backoff", d)
		if serr := sleep(ctx, l.clock, d); serr != nil {
			return fmt.Errorf("release %s: gave up, the lock expires on its own: %w", l.cfg.Path, l.classify("release", err))
		}
	}
}

// identityRejectedFor is how long ReleaseID retries answers that the
// identity does not authenticate before it reports ErrIdentityRejected.
const identityRejectedFor = 2 * time.Second

// notHeld recognises Nomad's answer for a variable whose lock is gone. Release
// reports it as a 500, renew as a 409.
func notHeld(err error) bool {
	return err != nil && strings.Contains(responseBody(err), "doesn't hold a lock")
}

// releasedMarkTimeout bounds the write of the release mark (markReleased).
const releasedMarkTimeout = 2 * time.Second

// markReleased records in the lock's record, after a release that left
// the variable at index, when it was released (Holder.ReleasedAt): a token
// that is not shown lock state (any but a management token) then sees the
// lock free. The write is a check-and-set on index, so it lands only if
// nothing happened since the release: a next holder's acquire (which
// writes its own record) wins, and no lock is created. It is made after
// the release, so the handover does not wait for it; it is bounded, and a
// failure only leaves the lock's state unknown to such a token.
func (l *Locker) markReleased(ctx context.Context, index uint64) {
	if l.cas == nil || index == 0 {
		return
	}
	rctx, cancel := withTimeout(context.WithoutCancel(ctx), l.clock, min(l.cfg.RequestTimeout, releasedMarkTimeout))
	defer cancel()
	cur, _, err := l.vars.Peek(l.cfg.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil || cur == nil || cur.ModifyIndex != index || (cur.Lock != nil && cur.Lock.ID != "") {
		return
	}
	items := maps.Clone(cur.Items)
	if items == nil {
		items = map[string]string{}
	}
	items[itemReleasedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Items: items, ModifyIndex: index}
	if _, _, err := l.cas.CheckedUpdate(v, l.writeOptions(rctx)); err != nil {
		l.log.Debug("could not mark the lock released in its record", "error", err)
	}
}
