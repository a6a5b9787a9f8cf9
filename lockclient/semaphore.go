package lockclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
)

// A semaphore of N holders (Config.Holders) is N plain locks, its slots,
// at SlotPath(prefix, 0) … SlotPath(prefix, N-1). A lease holds one slot
// and is that slot's lock in every respect: renew, fence deadline, loss,
// release cutoff, crash release and status are the single lock's, per
// slot. Nomad grants each slot to one holder at a time, so at most N leases
// exist at once. N is written into every slot's Items
// (Holder.Holders); a contender that asks for another N is refused before
// it takes anything (ErrHoldersMismatch).
//
// A waiter parks one blocking query per slot, each on its own index, and
// tries only the slot whose variable changed: waiting costs no requests
// while nothing is released, and never wakes on other variables' writes
// (a prefix list would).
//
// N is also the semaphore's record, SemaphorePath(prefix), which the first
// contender creates with check-and-set on index 0 before it tries any
// slot, and which every contender reads first: of two contenders that
// start at once on a new prefix asking different N, exactly one writes it
// and the other is refused before it takes anything.

// MaxHolders bounds a semaphore's N: a waiter parks one blocking query per
// slot.
const MaxHolders = 64

// ErrHoldersMismatch is wrapped by the error of a contender whose N differs
// from the N recorded in the semaphore's slots.
var ErrHoldersMismatch = errors.New("semaphore holders mismatch")

// SlotPath is the variable of slot i of the semaphore at prefix.
func SlotPath(prefix string, i int) string { return prefix + "/slot-" + strconv.Itoa(i) }

// SemaphorePath is the variable recording the N of the semaphore at
// prefix (Items semaphore_holders), written once by its first contender.
func SemaphorePath(prefix string) string { return prefix + "/semaphore" }

func (cfg Config) validateHolders() error {
	switch {
	case cfg.Holders < 0 || cfg.Holders > MaxHolders:
		return configErrorf("holders = %d is out of range: a semaphore has 1 to %d holders (0: a single lock)", cfg.Holders, MaxHolders)
	case cfg.Holders > 0:
		if err := ValidatePath(SemaphorePath(cfg.Path)); err != nil {
			return err
		}
		return ValidatePath(SlotPath(cfg.Path, cfg.Holders-1))
	}
	return nil
}

// slotLockers are a semaphore's per-slot Lockers (nil for a plain lock):
// each is a plain Locker of one slot path, whose holder record carries N
// and the slot.
func (l *Locker) slotLockers() []*Locker {
	var slots []*Locker
	for i := range l.cfg.Holders {
		c := l.cfg
		c.Path, c.Holders = SlotPath(l.cfg.Path, i), 0
		c.Holder.Holders, c.Holder.Slot = l.cfg.Holders, i
		slots = append(slots, &Locker{cfg: c, api: l.api, vars: l.vars, cas: l.cas, clock: l.clock,
			log: l.cfg.Logger.With("path", c.Path)})
	}
	return slots
}

// Slots are a semaphore's per-slot Lockers, slot i at index i (nil for a
// plain lock): each reads, and could hold, its slot's lock alone.
func (l *Locker) Slots() []*Locker { return l.slots }

// policyPath is the variable path an ACL policy must grant: a semaphore
// slot's lock needs every slot, <prefix>/*.
func (l *Locker) policyPath() string {
	if l.cfg.Holder.Holders == 0 {
		return l.cfg.Path
	}
	return strings.TrimSuffix(l.cfg.Path, "/slot-"+strconv.Itoa(l.cfg.Holder.Slot)) + "/*"
}

// slotOrder is the order a contender tries the slots in: its preferred
// slot first, then the others from there on.
func slotOrder(prefer, n int) []int {
	first := ((prefer % n) + n) % n
	order := make([]int, 0, n)
	for i := range n {
		order = append(order, (first+i)%n)
	}
	return order
}

// acquireSlot is Acquire for a semaphore: it tries every slot, its
// preferred one first, and while all are held waits on all of them at
// once, then tries the slot that changed.
func (l *Locker) acquireSlot(ctx context.Context, opts AcquireOptions) (*Lease, error) {
	if opts.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, l.clock, opts.Wait)
		defer cancel()
	}
	n := l.cfg.Holders
	retry := l.newRetrier()
	retryAfter := func(err error) error { return retry.after(ctx, err) }
	indexes := make([]uint64, n)
	retryIn := make([]time.Duration, n)
	pending := slotOrder(l.cfg.PreferSlot, n)
	changed := map[int]bool{} // the pending slots whose variable changed
	var reported Holder
	var deferred deferral
	checked := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, l.waitError(ctx, opts)
		}
		if !checked {
			// The semaphore's record, then every slot's, before any
			// acquire: a free slot says nothing of the N the others
			// were taken with, and slots written before the record
			// existed carry their N.
			err := l.claimHolders(ctx)
			if err == nil {
				err = l.checkAllHolders(ctx)
			}
			switch {
			case err != nil && permanent(err):
				return nil, err
			case err != nil:
				if err := retryAfter(err); err != nil {
					return nil, l.waitError(ctx, opts, err)
				}
				continue
			}
			checked = true
		}
		var apiErr error
		round := &slotRound{}
		for _, i := range pending {
			lease, holder, index, err := l.trySlot(ctx, i, opts, round, &deferred)
			switch {
			case err == nil:
				return lease, nil
			case errors.Is(err, ErrNotAcquired):
				indexes[i], retryIn[i] = index, l.retryIn(index, holder, changed[i])
				if round.wait > 0 && round.free[i] && (retryIn[i] == 0 || round.wait < retryIn[i]) {
					retryIn[i] = round.wait // given way: try again once the grace is up
				}
				if i == pending[0] && holder != reported {
					reported = holder
					l.log.Info("semaphore slots are held, waiting", "slot", i, "holder", holder.String())
					if opts.OnBlocked != nil {
						opts.OnBlocked(holder)
					}
				}
			case permanent(err):
				return nil, err
			default:
				apiErr = err
			}
		}
		if apiErr != nil {
			if err := retryAfter(apiErr); err != nil {
				return nil, l.waitError(ctx, opts, err)
			}
			pending = slotOrder(l.cfg.PreferSlot, n)
			continue
		}
		retry.reset()
		if !round.anyFree {
			deferred = deferral{}
		}
		if opts.TryOnce {
			return nil, fmt.Errorf("acquire %s: %w (all %d slots are held)", l.cfg.Path, ErrNotAcquired, n)
		}
		woke, err := l.waitSlots(ctx, indexes, retryIn)
		if err != nil {
			continue // ctx ended
		}
		pending, changed = nil, map[int]bool{}
		var readErr error
		for _, w := range woke {
			pending = append(pending, w.slot)
			changed[w.slot] = !w.timer && w.err == nil
			readErr = cmp.Or(readErr, w.err)
		}
		switch {
		case readErr != nil && permanent(readErr):
			return nil, readErr
		case readErr != nil:
			if err := retryAfter(readErr); err != nil {
				return nil, l.waitError(ctx, opts, err)
			}
		}
	}
}

// retryIn is when a waiter tries a refused slot again whatever its
// variable does. A slot refused just after it changed (released, or
// expired) may be in its lock delay, at whose end Nomad need not write the
// variable again: it is tried once more after the delay its last holder
// recorded. A slot with no index to block on is tried again after a
// second. Others wait for a change.
func (l *Locker) retryIn(index uint64, last Holder, changed bool) time.Duration {
	switch {
	case index == 0:
		return time.Second
	case changed:
		return cmp.Or(last.LockDelay, l.cfg.LockDelay) + 50*time.Millisecond
	}
	return 0
}

// slotRound is what one round of tries over the pending slots learned of
// opts.Defer (a rolling update's deferral, see Acquire): asked once a
// round, when a slot first looks free.
type slotRound struct {
	asked, anyFree bool
	// wait, above 0, is how long to give way before taking a free slot.
	wait time.Duration
	free map[int]bool // the slots seen free
}

// deferSlot asks opts.Defer, for a slot that looks free, whether to give
// way, as Acquire's deferAttempt does for a single lock: it returns how
// long to wait before trying again, 0 to take it now.
func (l *Locker) deferSlot(ctx context.Context, opts AcquireOptions, previous Holder, d *deferral) time.Duration {
	grace, hold := opts.Defer(ctx, previous)
	now := l.clock.Now().UnixNano()
	switch {
	case hold:
		*d = deferral{}
		return l.cfg.BlockingWait
	case grace <= 0:
		*d = deferral{}
		return 0
	}
	if d.since == 0 {
		d.since, d.until = now, now+int64(grace)
		l.log.Info("a semaphore slot is free: giving way to another standby first", "grace", grace)
	}
	if left := time.Duration(d.until - now); left > 0 {
		return left
	}
	l.log.Info("semaphore slot still free after the grace: acquiring", "grace", grace)
	return 0
}

// trySlot reads slot i, refuses a different N, and tries to acquire it.
// On ErrNotAcquired it returns the slot's holder and the index to block
// on. With opts.Defer, a slot held as we are shown is not tried (as
// Acquire does), and one that looks free is taken only if the round's
// deferral says so.
func (l *Locker) trySlot(ctx context.Context, i int, opts AcquireOptions, round *slotRound, d *deferral) (*Lease, Holder, uint64, error) {
	sl := l.slots[i]
	current, index, err := sl.read(ctx, 0)
	if err != nil {
		return nil, Holder{}, 0, err
	}
	holder := holderFromItems(current.items())
	if err := l.checkHolders(sl.cfg.Path, current.items()); err != nil {
		return nil, holder, 0, err
	}
	if opts.Defer != nil {
		switch {
		case current.heldVisibly():
			return nil, holder, index, ErrNotAcquired
		case sl.looksFree(ctx, current):
			round.anyFree = true
			if round.free == nil {
				round.free = map[int]bool{}
			}
			round.free[i] = true
			if !round.asked {
				round.asked, round.wait = true, l.deferSlot(ctx, opts, holder, d)
			}
			if round.wait > 0 {
				return nil, holder, index, ErrNotAcquired
			}
		}
	}
	lease, err := sl.tryAcquire(ctx, current, opts)
	if err != nil {
		return nil, holder, index, err
	}
	lease.Slot, lease.Holders = i, l.cfg.Holders
	l.log.Info("semaphore slot acquired", "slot", i, "holders", l.cfg.Holders, "fence", lease.Fence)
	return lease, holder, index, nil
}

// recordLocker reads the semaphore's record (SemaphorePath).
func (l *Locker) recordLocker() *Locker {
	c := l.cfg
	c.Path, c.Holders = SemaphorePath(l.cfg.Path), 0
	return &Locker{cfg: c, api: l.api, vars: l.vars, clock: l.clock, log: l.log}
}

// claimHolders reads the semaphore's record and refuses another N; if
// there is none yet it creates it with our N, by check-and-set on index 0,
// so that of contenders racing on a new prefix one writes it and the
// others read it.
func (l *Locker) claimHolders(ctx context.Context) error {
	rec := l.recordLocker()
	for range 3 {
		snap, _, err := rec.read(ctx, 0)
		if err != nil {
			return withPolicyPath(err, l.cfg.Path)
		}
		if snap.v != nil {
			return l.checkRecord(rec.cfg.Path, snap.items())
		}
		v := &api.Variable{Namespace: l.cfg.Namespace, Path: rec.cfg.Path,
			Items: map[string]string{itemHolders: strconv.Itoa(l.cfg.Holders)}}
		rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
		_, _, err = l.vars.CheckedCreate(v, rec.writeOptions(rctx))
		cancel()
		var conflict api.ErrCASConflict
		switch {
		case err == nil:
			l.log.Info("semaphore recorded", "record", rec.cfg.Path, "holders", l.cfg.Holders)
			return nil
		case errors.As(err, &conflict):
			continue // another contender wrote it first: read it
		default:
			return withPolicyPath(rec.classify("record the semaphore's holders in", err), l.cfg.Path)
		}
	}
	return fmt.Errorf("record the semaphore's holders in %s: it was written and removed again while we read it", rec.cfg.Path)
}

// withPolicyPath makes a PermissionError name the path a semaphore's
// policy must grant, <prefix>/*.
func withPolicyPath(err error, prefix string) error {
	var pe *PermissionError
	if errors.As(err, &pe) {
		pe.Path = prefix + "/*"
	}
	return err
}

// checkRecord refuses a semaphore record that names another N, or none.
func (l *Locker) checkRecord(path string, items map[string]string) error {
	if _, ok := items[itemHolders]; !ok {
		return &ConfigError{Msg: fmt.Sprintf("%s: %s exists but records no %s: it is not this semaphore's record; "+
			"remove it or use another path", ErrHoldersMismatch, path, itemHolders), Err: ErrHoldersMismatch}
	}
	return l.checkHolders(path, items)
}

// checkAllHolders reads every slot once and refuses a different N
// recorded in any.
func (l *Locker) checkAllHolders(ctx context.Context) error {
	for _, sl := range l.slots {
		snap, _, err := sl.read(ctx, 0)
		if err != nil {
			return err
		}
		if err := l.checkHolders(sl.cfg.Path, snap.items()); err != nil {
			return err
		}
	}
	return nil
}

// checkHolders refuses a slot whose recorded N differs from ours.
func (l *Locker) checkHolders(path string, items map[string]string) error {
	recorded, ok := items[itemHolders]
	if !ok || recorded == strconv.Itoa(l.cfg.Holders) {
		return nil
	}
	return &ConfigError{Msg: fmt.Sprintf("%s: the semaphore %s has %s holders (recorded in %s) but this contender asks for %d: "+
		"ask for the same number (lock -n, the driver's lock.holders), or use another path", ErrHoldersMismatch,
		l.cfg.Path, recorded, path, l.cfg.Holders), Err: ErrHoldersMismatch}
}

// slotWake is a slot a waiter tries next: its variable changed (or its
// read failed, err), or its retry time came (timer).
type slotWake struct {
	slot  int
	timer bool
	err   error
}

// waitSlots parks one blocking query per slot, each on its own index, and
// returns the slots that woke once one has: its variable changed, its read
// failed, or retryIn[slot] (if above 0) passed.
func (l *Locker) waitSlots(ctx context.Context, indexes []uint64, retryIn []time.Duration) ([]slotWake, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wakes := make(chan slotWake, len(indexes))
	var wg sync.WaitGroup
	for i, index := range indexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wakes <- l.waitSlot(wctx, i, index, retryIn[i])
		}()
	}
	select {
	case w := <-wakes:
		wakes <- w // put back: collected with the others below
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	close(wakes)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var woke []slotWake
	for w := range wakes {
		if w.slot >= 0 {
			woke = append(woke, w)
		}
	}
	return woke, nil
}

// waitSlot blocks on slot i's variable past index, for at most retryIn if
// it is above 0. Its slot is -1 if ctx ended first.
func (l *Locker) waitSlot(ctx context.Context, i int, index uint64, retryIn time.Duration) slotWake {
	rctx := ctx
	if retryIn > 0 {
		var cancel context.CancelFunc
		rctx, cancel = withTimeout(ctx, l.clock, retryIn)
		defer cancel()
	}
	for {
		if index == 0 { // nothing to block on: only the retry time
			<-rctx.Done()
		} else if _, next, err := l.slots[i].read(rctx, index); rctx.Err() == nil && (err != nil || next != index) {
			return slotWake{slot: i, err: err}
		}
		switch {
		case ctx.Err() != nil:
			return slotWake{slot: -1}
		case rctx.Err() != nil:
			return slotWake{slot: i, timer: true}
		}
	}
}

// SlotStatus reads every slot of the semaphore once (Config.Holders).
func (l *Locker) SlotStatus(ctx context.Context) ([]Status, error) {
	if l.cfg.Holders == 0 {
		return nil, configErrorf("%s is not a semaphore: no holders given", l.cfg.Path)
	}
	out := make([]Status, 0, len(l.slots))
	for _, sl := range l.slots {
		st, err := sl.Status(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// RecordedHolders is the N of the semaphore at the Locker's path, from
// its record (SemaphorePath) or, for a semaphore written before records
// existed, from slot 0: 0 if there is no such semaphore.
func (l *Locker) RecordedHolders(ctx context.Context) (int, error) {
	snap, _, err := l.recordLocker().read(ctx, 0)
	if err != nil {
		return 0, err
	}
	if n, err := strconv.Atoi(snap.items()[itemHolders]); err == nil && n > 0 {
		return n, nil
	}
	c := l.cfg
	c.Path, c.Holders = SlotPath(l.cfg.Path, 0), 0
	probe := &Locker{cfg: c, api: l.api, vars: l.vars, clock: l.clock, log: l.log}
	snap, _, err = probe.read(ctx, 0)
	if err != nil {
		return 0, err
	}
	n, _ := strconv.Atoi(snap.items()[itemHolders])
	return n, nil
}
