package lockclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
)

// The standby half of lease mode (docs/lease.md, "The rule"). A standby
// polls the heartbeat with consistent reads and releases the lock for a
// dead holder only when both of these hold:
//
//  1. The holder is dead. Heartbeat N was applied before the first poll
//     that returned it was answered (received at F), so it was sent before
//     F, and the holder fences at its send + D and has its workload dead by
//     + K. The standby waits until L = D + K + TakeoverMargin after F
//     (counted only over continuous successful reads: any error restarts
//     the count), then seals the heartbeat by check-and-set on N's index:
//     no heartbeat after N can then ever be applied, so none was
//     acknowledged, and N was the holder's last.
//  2. The server's expiry has not begun. Nomad expires the lock 2×TTL
//     after processing the last renew, then clears whatever lock the
//     variable holds (expiry.md): the standby needs a lower bound on that
//     renew's send. The holder writes N by check-and-set on the index it
//     learned from the ack of N's predecessor, so N was sent after that
//     predecessor was applied; and the predecessor was applied after the
//     last poll that returned an older version was sent (P). N says how
//     long before its send the holder's last acknowledged renew was sent
//     (renew_age), so that renew was sent after P − renew_age. The lock may
//     be released only before that + 2×TTL − fence margin − request
//     timeout (Timing.ReleaseCutoff); a release that would be later is
//     skipped, and the server's expiry frees the lock.
//
// Assumptions: bounded clock-rate error (the margins); a poll of the
// leader sees every write applied before it was sent (Nomad's default,
// non-stale reads, served by the leader); a release sent before the cutoff
// is applied within the request timeout (as for every release, expiry.md).

// TakeoverPoll is the time between two reads of the heartbeat.
const TakeoverPoll = 250 * time.Millisecond

// beatObservation is one read of the heartbeat: sent and received on the
// standby's clock; index 0 and no record for a missing variable.
type beatObservation struct {
	sent, received time.Time
	err            error
	index          uint64
	rec            beatRecord
	ok             bool // rec is a heartbeat record
}

// takeoverCount is the standby's account of the heartbeat, fed with every
// read in order: the pure part of the decision, tested on its own.
type takeoverCount struct {
	own time.Duration // the standby's own L
	// minRenewAge is the least renew age the count takes from a record:
	// the standby's own heartbeat interval (see decide).
	minRenewAge time.Duration
	// versions holds the last three distinct indexes seen, oldest first,
	// each with the send time of the last poll that returned it.
	versions []seenVersion
	cur      beatObservation
	since    time.Time // count start: zero after an error, until the next good read
}

type seenVersion struct {
	index    uint64
	lastSent time.Time
}

func (c *takeoverCount) observe(o beatObservation) {
	if o.err != nil {
		c.since = time.Time{}
		return
	}
	n := len(c.versions)
	if n > 0 && c.versions[n-1].index == o.index {
		c.versions[n-1].lastSent = o.sent
	} else {
		c.versions = append(c.versions, seenVersion{index: o.index, lastSent: o.sent})
		if len(c.versions) > 3 {
			c.versions = c.versions[1:]
		}
		c.since = time.Time{}
	}
	c.cur = o
	if c.since.IsZero() {
		c.since = o.received
	}
}

// unchanged is how long the heartbeat has been seen unchanged at now.
func (c *takeoverCount) unchanged(now time.Time) time.Duration {
	if c.since.IsZero() || !c.cur.ok {
		return 0
	}
	return max(now.Sub(c.since), 0)
}

// takeoverVerdict is what the count allows at one moment.
type takeoverVerdict struct {
	ready bool
	why   string        // why not, for the log
	wait  time.Duration // L, as applied
	index uint64        // the heartbeat's index to seal on
	rec   beatRecord
	// renewAfter is the lower bound on the send time of the holder's last
	// acknowledged renew.
	renewAfter time.Time
}

func (c *takeoverCount) decide(now time.Time) takeoverVerdict {
	v := takeoverVerdict{wait: c.own, index: c.cur.index, rec: c.cur.rec}
	switch {
	case c.since.IsZero():
		v.why = "no successful read of the heartbeat since the last error"
		return v
	case !c.cur.ok:
		v.why = "no heartbeat record"
		return v
	case c.cur.rec.SealedBy != "":
		v.why = "the heartbeat is sealed (taken over already)"
		return v
	}
	v.wait = max(c.own, c.cur.rec.Fence+c.cur.rec.KillGrace+TakeoverMargin)
	if unchanged := now.Sub(c.since); unchanged < v.wait {
		v.why = fmt.Sprintf("the heartbeat is unchanged for %s of %s", unchanged.Round(time.Millisecond), v.wait)
		return v
	}
	if len(c.versions) < 3 {
		v.why = "too few heartbeat changes seen to bound the holder's last renew"
		return v
	}
	// The record's renew age is its writer's word: taken no smaller than
	// the standby's own heartbeat interval, so that a record that claims
	// a renew at its very send (renew_age 0) moves the bound no later.
	v.renewAfter = c.versions[0].lastSent.Add(-max(c.cur.rec.RenewAge, c.minRenewAge))
	v.ready = true
	return v
}

// TakeoverOptions shape a standby's watch.
type TakeoverOptions struct {
	// Heartbeat is the task's own lease mode: its paths and its L (the
	// holder's record may ask for a longer one).
	Heartbeat Heartbeat
	// SealedBy names the standby in the sealed record (its allocation).
	SealedBy string
	// MayAct reports whether the standby's task still waits for the lock.
	MayAct func() bool
	// OnSkip is told once per heartbeat when a takeover is not made
	// although the heartbeat went stale (the server's expiry is left to
	// free the lock, or the escrow does not match).
	OnSkip func(msg string)
	// OnRead, if set, hears after each read of the heartbeat how long it
	// has been unchanged as this standby counts it (over continuous
	// successful reads: 0 after a change, an error or a missing record).
	// It must return at once.
	OnRead func(unchanged time.Duration)
}

// ErrTakenOver is WatchTakeover's answer after it released the lock.
var ErrTakenOver = errors.New("released the lock of a holder whose heartbeat stopped")

// WatchTakeover is the standby half of lease mode, for the lock at the
// locker's path, with the operator's token (it reads the escrow): it polls
// the heartbeat every TakeoverPoll and, once the decision above allows it,
// seals the heartbeat and releases the lock with the escrowed lock ID. It
// returns ErrTakenOver after a release, or ctx's error.
func (l *Locker) WatchTakeover(ctx context.Context, opts TakeoverOptions) error {
	c := &takeoverCount{own: opts.Heartbeat.Takeover(), minRenewAge: opts.Heartbeat.Interval}
	skipped := uint64(0)
	for {
		if err := sleep(ctx, l.clock, TakeoverPoll); err != nil {
			return err
		}
		c.observe(l.readBeat(ctx, opts.Heartbeat.Path))
		now := l.clock.Now()
		if opts.OnRead != nil {
			opts.OnRead(c.unchanged(now))
		}
		v := c.decide(now)
		if !v.ready || (opts.MayAct != nil && !opts.MayAct()) {
			continue
		}
		err := l.takeOver(ctx, opts, v)
		switch {
		case err == nil:
			return ErrTakenOver
		case ctx.Err() != nil:
			return ctx.Err()
		}
		l.log.Info("lease takeover not made", "why", err)
		if skipped != v.index && opts.OnSkip != nil {
			opts.OnSkip(err.Error())
		}
		skipped = v.index
		c.since = time.Time{} // count again from the next read
	}
}

// readBeat is one consistent read of the heartbeat.
func (l *Locker) readBeat(ctx context.Context, path string) beatObservation {
	o := beatObservation{sent: l.clock.Now()}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	v, _, err := l.vars.Peek(path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	o.received = l.clock.Now()
	switch {
	case err != nil && statusCode(err) != http.StatusNotFound:
		o.err = err
	case v != nil:
		o.index = v.ModifyIndex
		o.rec, o.ok = parseBeat(v.Items)
	}
	return o
}

// takeOver checks the lock's epoch, the release cutoff and the escrow,
// seals the heartbeat at v.index and releases the lock with the escrowed
// ID. Any error means nothing was released.
func (l *Locker) takeOver(ctx context.Context, opts TakeoverOptions, v takeoverVerdict) error {
	lock, t, err := l.lockInEpoch(ctx, v.rec)
	if err != nil {
		return err
	}
	if err := t.MayRelease(v.renewAfter, l.clock.Now()); err != nil {
		return fmt.Errorf("the holder's heartbeat is stale, but its lock is left to the server's expiry: %w", err)
	}
	id, err := l.readEscrow(ctx, opts.Heartbeat.EscrowPath, v.rec.Epoch)
	if err != nil {
		return err
	}
	if err := l.seal(ctx, opts, v); err != nil {
		return err
	}
	rl := &Locker{cfg: l.cfg, vars: l.vars, clock: l.clock, log: l.log}
	rl.cfg.Timing = t
	rl.cfg.Path = lock.Path
	rctx, cancel := withTimeout(ctx, l.clock, t.RequestTimeout+time.Second)
	defer cancel()
	if err := rl.ReleaseID(rctx, id, v.renewAfter); err != nil {
		return err
	}
	l.log.Info("lease takeover: released the lock of a holder whose heartbeat stopped",
		"fence", v.rec.Epoch, "holder_alloc_id", v.rec.Alloc, "heartbeat_seq", v.rec.Seq, "unchanged_for", v.wait)
	return nil
}

// lockInEpoch reads the lock: at the index of the acquire the heartbeat
// names (every acquire, release, expiry and write moves it, so the lock is
// still that holder's), and held, where the token is shown lock state
// (Nomad shows it to management tokens only). It returns the lock's
// timing: its own TTL and delay where shown, else the TTL the holder
// recorded in its heartbeat, never more than the standby's own (the record
// is its writer's word, and a longer TTL would put the release cutoff
// later; the delay does not bear on the cutoff).
func (l *Locker) lockInEpoch(ctx context.Context, rec beatRecord) (*api.Variable, Timing, error) {
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	lock, _, err := l.vars.Peek(l.cfg.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil {
		return nil, Timing{}, fmt.Errorf("read the lock: %w", err)
	}
	if lock == nil || lock.ModifyIndex != rec.Epoch {
		return nil, Timing{}, fmt.Errorf("the lock is no longer in the heartbeat's epoch %d (index %d)", rec.Epoch, modifyIndex(lock))
	}
	ttl, delay := min(rec.TTL, l.cfg.Timing.TTL), time.Second
	if lock.Lock != nil {
		var err1, err2 error
		ttl, err1 = time.ParseDuration(lock.Lock.TTL)
		delay, err2 = time.ParseDuration(lock.Lock.LockDelay)
		if err1 != nil || err2 != nil {
			return nil, Timing{}, fmt.Errorf("the lock's TTL %q or delay %q cannot be read", lock.Lock.TTL, lock.Lock.LockDelay)
		}
	}
	if ttl < MinTTL {
		return nil, Timing{}, fmt.Errorf("the lock's TTL %s is below Nomad's minimum", ttl)
	}
	return lock, Timing{TTL: ttl, LockDelay: max(delay, time.Millisecond)}.withDefaults(), nil
}

// readEscrow reads the lock ID the holder of epoch escrowed. It is never
// logged.
func (l *Locker) readEscrow(ctx context.Context, path string, epoch uint64) (string, error) {
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	v, _, err := l.vars.Peek(path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	switch {
	case statusCode(err) == http.StatusForbidden:
		return "", fmt.Errorf("read the lock escrow %s: permission denied (HTTP 403): the release token needs read on it "+
			"(examples/acl/singleton-release.policy.hcl)", path)
	case err != nil:
		return "", fmt.Errorf("read the lock escrow %s: %w", path, err)
	case v == nil || v.Items["lock_id"] == "" || v.Items["fence"] != strconv.FormatUint(epoch, 10):
		return "", fmt.Errorf("the lock escrow %s holds no lock ID for epoch %d", path, epoch)
	}
	return v.Items["lock_id"], nil
}

// seal writes a sealed record over heartbeat v.index by check-and-set:
// once it is applied no later heartbeat of the holder can be, so its last
// acknowledged one is the one we counted on.
func (l *Locker) seal(ctx context.Context, opts TakeoverOptions, v takeoverVerdict) error {
	if l.cas == nil {
		return errors.New("no check-and-set write to seal the heartbeat with")
	}
	rec := v.rec
	rec.SealedBy = cmp.Or(opts.SealedBy, "standby")
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	hv := &api.Variable{Namespace: l.cfg.Namespace, Path: opts.Heartbeat.Path, Items: rec.items(), ModifyIndex: v.index}
	if _, _, err := l.cas.CheckedUpdate(hv, l.writeOptions(rctx)); err != nil {
		var conflict api.ErrCASConflict
		if errors.As(err, &conflict) {
			return errors.New("the heartbeat changed before it could be sealed: the holder (or another standby) is alive")
		}
		return fmt.Errorf("seal the heartbeat: %w", err)
	}
	return nil
}
