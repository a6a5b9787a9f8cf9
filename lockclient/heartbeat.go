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

// Lease mode (docs/lease.md) is the Nomad lock, kept exactly as it is as
// the backstop, plus a faster path for a dead node: the holder writes a
// heartbeat record every Interval to a variable of its own, by
// check-and-set, and fences itself Fence after the send time of its last
// acknowledged heartbeat; a standby that sees the heartbeat unchanged for
// Takeover (Fence + KillGrace + TakeoverMargin) seals it and releases the
// lock with the lock ID the holder escrowed (takeover.go).

// Heartbeat is lease mode's holder half: where and how often the holder
// writes its heartbeat, and when it fences itself without one.
type Heartbeat struct {
	// Path is the heartbeat variable. The driver's is <lock path>/lease,
	// in the lock's own path tree, so the lock policy's path covers it
	// with a glob, or a line of its own.
	Path string
	// EscrowPath is the variable the holder writes its lock ID to: a path
	// outside nomad/jobs/ where its workload identity may write but not
	// read, and only the operator's release token reads (EscrowPathFor).
	EscrowPath string
	// Interval (R) is the time between heartbeats.
	Interval time.Duration
	// Fence (D): past the send time of the last acknowledged heartbeat
	// plus Fence, the holder no longer claims the lock.
	Fence time.Duration
	// KillGrace (K): the workload is SIGKILLed by Fence + KillGrace after
	// that send time (its kill grace after a heartbeat fence).
	KillGrace time.Duration
}

// TakeoverMargin is added to Fence + KillGrace to get the takeover time L:
// the SIGKILLed workload's exit, clock-rate error over D + K, and the
// standby's poll interval.
const TakeoverMargin = time.Second

// Takeover (L) is how long a standby must see the heartbeat unchanged
// before it may release the lock for a dead holder.
func (h Heartbeat) Takeover() time.Duration { return h.Fence + h.KillGrace + TakeoverMargin }

// Lease mode profiles: the default, and the aggressive one, whose cost is
// that any outage of heartbeat writes longer than Fence (a Nomad leader
// election of more than 2 s) fences the holder.
var (
	DefaultHeartbeat    = Heartbeat{Interval: time.Second, Fence: 6 * time.Second, KillGrace: 2 * time.Second}
	AggressiveHeartbeat = Heartbeat{Interval: 500 * time.Millisecond, Fence: 2 * time.Second, KillGrace: time.Second}
)

// MinHeartbeatInterval is the least Interval: every heartbeat is a Raft write.
const MinHeartbeatInterval = 250 * time.Millisecond

// EscrowPathFor is the escrow variable of the lock at lockPath in lease
// mode: singleton/escrow/<lock path>, outside nomad/jobs/, so that the
// implicit workload policy grants nothing there and a policy can grant
// write without read.
func EscrowPathFor(lockPath string) string { return "singleton/escrow/" + lockPath }

// HeartbeatPathFor is the heartbeat variable of the lock at lockPath.
func HeartbeatPathFor(lockPath string) string { return lockPath + "/lease" }

// Validate checks the heartbeat timings against each other and against
// the lease timing t (defaults filled in). Each error names the setting.
func (h Heartbeat) Validate(t Timing) error {
	t = t.withDefaults()
	switch {
	case h.Interval < MinHeartbeatInterval:
		return configErrorf("lease_interval %s is below its minimum of %s (every heartbeat is a Raft write)", h.Interval, MinHeartbeatInterval)
	case h.Fence < 2*h.Interval:
		return configErrorf("lease_fence %s must be at least twice lease_interval (%s): one lost heartbeat must not fence the holder", h.Fence, 2*h.Interval)
	case h.Fence >= t.TTL-t.FenceMargin:
		return configErrorf("lease_fence %s must be below the TTL less the fence margin (%s), or the lock's own fence comes first; "+
			"raise ttl or lower lease_fence", h.Fence, t.TTL-t.FenceMargin)
	case h.KillGrace < 0 || h.KillGrace > h.Fence:
		return configErrorf("lease_kill_grace %s must be between 0 and lease_fence (%s)", h.KillGrace, h.Fence)
	case h.Path == "" || h.EscrowPath == "":
		return configErrorf("lease mode needs a heartbeat and an escrow path")
	}
	if err := ValidatePath(h.Path); err != nil {
		return err
	}
	return ValidatePath(h.EscrowPath)
}

// Items of the heartbeat record.
const (
	beatSeq       = "seq"
	beatEpoch     = "epoch" // the lock's fence: the ModifyIndex of the acquire
	beatInterval  = "interval_ms"
	beatFence     = "fence_ms"
	beatKillGrace = "kill_grace_ms"
	beatRenewAge  = "renew_age_ms" // since the send of the last acknowledged renew, at this heartbeat's send
	beatTTL       = "ttl_ms"       // the lock's TTL, as the holder acquired it
	beatAlloc     = "alloc_id"
	beatLockIndex = "lock_index" // the lock's ModifyIndex as the holder last left it (lock status)
	beatSealed    = "sealed_by"  // set by a standby that took the lock over: no heartbeat may follow
)

// beatRecord is one heartbeat as the variable holds it.
type beatRecord struct {
	Seq, Epoch                 uint64
	Interval, Fence, KillGrace time.Duration
	RenewAge, TTL              time.Duration
	Alloc, SealedBy            string
	// LockIndex is the lock's ModifyIndex as the holder last left it: its
	// acquire's (Epoch) or its own last write of the lock's record. A
	// reader shown no lock state tells from it that the lock is still held
	// (Status). Optional: 0 when absent.
	LockIndex uint64
}

// items is the record in milliseconds, each rounded the safe way for the
// standby: D, K and the renew age up (its wait stays at least D + K +
// TakeoverMargin, its bound on the last renew below it), the TTL down (its
// release cutoff stays early), the interval down.
func (r beatRecord) items() map[string]string {
	down := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	up := func(d time.Duration) string { return down(d + time.Millisecond - 1) }
	it := map[string]string{
		beatSeq: strconv.FormatUint(r.Seq, 10), beatEpoch: strconv.FormatUint(r.Epoch, 10),
		beatInterval: down(r.Interval), beatFence: up(r.Fence), beatKillGrace: up(r.KillGrace),
		beatRenewAge: up(r.RenewAge), beatTTL: down(r.TTL), beatAlloc: r.Alloc,
	}
	if r.SealedBy != "" {
		it[beatSealed] = r.SealedBy
	}
	if r.LockIndex != 0 {
		it[beatLockIndex] = strconv.FormatUint(r.LockIndex, 10)
	}
	return it
}

// parseBeat reads a heartbeat record; ok is false for anything else.
func parseBeat(items map[string]string) (r beatRecord, ok bool) {
	u := func(k string) (uint64, bool) {
		n, err := strconv.ParseUint(items[k], 10, 64)
		return n, err == nil
	}
	d := func(k string) (time.Duration, bool) {
		n, ok := u(k)
		return time.Duration(n) * time.Millisecond, ok
	}
	var oks [7]bool
	r.Seq, oks[0] = u(beatSeq)
	r.Epoch, oks[1] = u(beatEpoch)
	r.Interval, oks[2] = d(beatInterval)
	r.Fence, oks[3] = d(beatFence)
	r.KillGrace, oks[4] = d(beatKillGrace)
	r.RenewAge, oks[5] = d(beatRenewAge)
	r.TTL, oks[6] = d(beatTTL)
	r.Alloc, r.SealedBy = items[beatAlloc], items[beatSealed]
	r.LockIndex, _ = u(beatLockIndex)
	for _, ok := range oks {
		if !ok {
			return r, false
		}
	}
	return r, true
}

// casAPI is the check-and-set write of a variable: *api.Variables
// implements it (CheckedUpdate; a conflict is an api.ErrCASConflict).
type casAPI interface {
	CheckedUpdate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error)
}

// ErrSealed means a standby sealed our heartbeat to take the lock over:
// the holder's fence deadline passed on the standby's count.
var ErrSealed = errors.New("a standby sealed the heartbeat and took the lock over")

// startHeartbeat is lease mode's part of the acquire: the escrow of the
// lock ID and the first heartbeat, both before the workload may start, so
// that a missing policy is refused at once. On error the caller releases.
func (ls *Lease) startHeartbeat(ctx context.Context) error {
	l := ls.locker
	hb := l.cfg.Heartbeat
	if l.cas == nil {
		return errors.New("lease mode: no check-and-set write available")
	}
	if err := ls.writeEscrow(ctx, ls.id); err != nil {
		return err
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	v, meta, err := l.vars.Peek(hb.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	cancel()
	switch {
	case err != nil && statusCode(err) != http.StatusNotFound:
		return l.classifyPath("read heartbeat", hb.Path, err)
	case v != nil:
		ls.beatIndex = v.ModifyIndex
		if rec, ok := parseBeat(v.Items); ok && rec.SealedBy != "" {
			ls.prevSealed = rec.Alloc
		}
	case meta != nil:
		ls.beatIndex = 0
	}
	if err := ls.beatOnce(ctx); err != nil {
		return err
	}
	return nil
}

// adoptHeartbeat is startHeartbeat for an adopted lease: the heartbeat must
// be the previous run's (our epoch, not sealed); the next one is written
// by check-and-set on it, so a standby's seal of it can no longer succeed.
func (ls *Lease) adoptHeartbeat(ctx context.Context) error {
	l := ls.locker
	hb := l.cfg.Heartbeat
	if l.cas == nil {
		return errors.New("lease mode: no check-and-set write available")
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	v, _, err := l.vars.Peek(hb.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	cancel()
	if err != nil {
		return l.classifyPath("read heartbeat", hb.Path, err)
	}
	var rec beatRecord
	ok := false
	if v != nil {
		rec, ok = parseBeat(v.Items)
	}
	switch {
	case !ok || rec.Epoch != ls.Fence:
		return &LostError{Reason: fmt.Sprintf("the heartbeat %s is no longer the previous run's (fence %d)", hb.Path, ls.Fence)}
	case rec.SealedBy != "":
		return &LostError{Reason: fmt.Sprintf("a standby (allocation %s) sealed the previous run's heartbeat to take the lock over", rec.SealedBy)}
	}
	ls.mu.Lock()
	ls.beatIndex, ls.beatSeq = v.ModifyIndex, rec.Seq
	ls.mu.Unlock()
	if err := ls.beatOnce(ctx); err != nil {
		if errors.Is(err, ErrSealed) {
			return &LostError{Reason: err.Error()}
		}
		return err
	}
	return ls.writeEscrow(ctx, ls.id)
}

// PreviousTakenOver reports whether, when this lease started its
// heartbeat, the heartbeat variable held a heartbeat of the previous
// holder (Previous.AllocID) sealed by a standby. A standby seals only a
// heartbeat it saw unchanged for Takeover, by check-and-set on it, so that
// holder fenced itself and its work was killed (lease_fence +
// lease_kill_grace) before the seal: its work is dead, and the next holder
// need not wait for Nomad to report it.
func (ls *Lease) PreviousTakenOver() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.prevSealed != "" && ls.prevSealed == ls.Previous.AllocID
}

// writeEscrow writes id (or, empty, the mark of a released lock) to the
// escrow variable. The workload identity may write but not read it.
func (ls *Lease) writeEscrow(ctx context.Context, id string) error {
	l := ls.locker
	items := map[string]string{"fence": strconv.FormatUint(ls.Fence, 10), "lock_path": l.cfg.Path}
	if id != "" {
		items["lock_id"] = id
	} else {
		items["released"] = "true"
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Heartbeat.EscrowPath, Items: items}
	if _, _, err := l.vars.Update(v, l.writeOptions(rctx)); err != nil {
		return l.classifyPath("write lock escrow", l.cfg.Heartbeat.EscrowPath, err)
	}
	return nil
}

// beatOnce writes the next heartbeat by check-and-set on the index of the
// last one we know of. Acknowledged within the request timeout (and before
// the fence deadline), it moves the heartbeat fence to its send time + D.
func (ls *Lease) beatOnce(ctx context.Context) error {
	l := ls.locker
	hb := l.cfg.Heartbeat
	ls.mu.Lock()
	ls.beatSeq++
	sent := l.clock.Now()
	rec := beatRecord{Seq: ls.beatSeq, Epoch: ls.Fence, Interval: hb.Interval, Fence: hb.Fence, KillGrace: hb.KillGrace,
		RenewAge: max(sent.Sub(ls.lastRenew), 0), TTL: l.cfg.TTL, Alloc: l.cfg.Holder.AllocID, LockIndex: cmp.Or(ls.itemsIndex, ls.Fence)}
	index := ls.beatIndex
	ls.mu.Unlock()

	rctx, cancel := ls.requestContext(ctx)
	defer cancel()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: hb.Path, Items: rec.items(), ModifyIndex: index}
	out, _, err := l.cas.CheckedUpdate(v, l.writeOptions(rctx))
	var conflict api.ErrCASConflict
	switch {
	case err == nil && out != nil:
		ls.mu.Lock()
		ls.beatIndex = out.ModifyIndex
		// A lease already lost keeps its deadlines: a heartbeat must not
		// move them once the server (or the fence) ended it.
		if ls.err == nil && sent.After(ls.lastBeat) {
			ls.lastBeat = sent
		}
		ls.mu.Unlock()
		return nil
	case errors.As(err, &conflict):
		return ls.beatConflict(ctx)
	case err == nil:
		return errors.New("heartbeat: Nomad answered without the variable")
	}
	return l.classifyPath("heartbeat", hb.Path, err)
}

// beatConflict reads the heartbeat after a check-and-set conflict: sealed
// by a standby, or another epoch's, is the end of the lease; our own (an
// earlier attempt applied after all) gives the index to write on next.
func (ls *Lease) beatConflict(ctx context.Context) error {
	l := ls.locker
	rctx, cancel := ls.requestContext(ctx)
	defer cancel()
	v, _, err := l.vars.Peek(l.cfg.Heartbeat.Path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil {
		return fmt.Errorf("heartbeat: check-and-set conflict, and reading it failed: %w", err)
	}
	if v == nil {
		return errors.New("heartbeat: check-and-set conflict on a deleted heartbeat")
	}
	rec, ok := parseBeat(v.Items)
	switch {
	case ok && rec.SealedBy != "":
		return fmt.Errorf("%w (allocation %s)", ErrSealed, rec.SealedBy)
	case !ok || rec.Epoch != ls.Fence:
		return fmt.Errorf("%w: the heartbeat belongs to another holder (epoch %d, ours %d)", ErrSealed, rec.Epoch, ls.Fence)
	}
	ls.mu.Lock()
	ls.beatIndex = v.ModifyIndex
	ls.beatSeq = max(ls.beatSeq, rec.Seq)
	ls.mu.Unlock()
	return errors.New("heartbeat: check-and-set conflict with an earlier heartbeat of ours; writing the next")
}

// heartbeatLoop writes a heartbeat every Interval until the lease ends.
// Each acknowledged one republishes the deadlines (Renewed); a sealed
// heartbeat is a loss at once. Failures are retried at once, then every
// Interval, until the fence deadline ends the lease (renewLoop).
func (ls *Lease) heartbeatLoop(ctx context.Context, moved chan<- struct{}) {
	l := ls.locker
	hb := l.cfg.Heartbeat
	t := l.clock.NewTimer(hb.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ls.stop:
			return
		case <-ls.lost:
			return
		case <-t.C():
		}
		if ls.until(ls.FenceDeadline()) <= 0 {
			return // renewLoop ends the lease
		}
		sent, fence := l.clock.Now(), ls.FenceDeadline()
		err := ls.beatOnce(ctx)
		ls.reportRenew(OpHeartbeat, sent, fence, err)
		switch {
		case err == nil:
			select {
			case moved <- struct{}{}:
			default:
			}
		case errors.Is(err, ErrSealed):
			ls.lose("taken over: "+err.Error(), LostTakeover, true)
			return
		case ctx.Err() != nil:
			return
		default:
			l.log.Warn("heartbeat failed, retrying", "error", err,
				"fence_deadline_in", ls.until(ls.FenceDeadline()).Round(time.Millisecond))
		}
		t.Reset(hb.Interval)
	}
}

// LastHeartbeat is the send time of the last acknowledged heartbeat (the
// acquire's before the first), on the lease's clock; zero outside lease
// mode.
func (ls *Lease) LastHeartbeat() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.lastBeat
}

// clearEscrow overwrites the escrowed lock ID before the lock is
// released, within escrowClearTimeout: a release is not held up longer.
// Only a lease still ours, before its fence deadline, does: no standby
// may have taken it over by then (it waits D + K + TakeoverMargin after
// the last heartbeat), so no next holder's ID can be in the escrow.
func (ls *Lease) clearEscrow(ctx context.Context) {
	l := ls.locker
	if l.cfg.Heartbeat == nil {
		return
	}
	fence := ls.FenceDeadline()
	if ls.Err() != nil || ls.until(fence) <= 0 {
		l.log.Debug("the lease is no longer ours: leaving the lock escrow as it is")
		return
	}
	ctx, cancel := l.clock.WithDeadline(ctx, earliest(l.clock.Now().Add(min(l.cfg.RequestTimeout, escrowClearTimeout)), fence))
	defer cancel()
	if err := ls.writeEscrow(ctx, ""); err != nil {
		l.log.Warn("could not clear the lock escrow (once the lock is released, the lock ID in it releases nothing)", "error", err)
	}
}

// escrowClearTimeout bounds the escrow's overwrite before a release.
const escrowClearTimeout = time.Second

// classifyPath turns a failed read or write of lease mode's own variables
// into an error; a 403 names the policy that fixes it.
func (l *Locker) classifyPath(op, path string, err error) error {
	if statusCode(err) == http.StatusForbidden {
		return configErrorf("%s %s: permission denied (HTTP 403): lease mode needs the job's workload identity to have "+
			"write and read on the heartbeat variable %s and write (only) on the escrow variable %s: "+
			"apply examples/acl/singleton-lease.policy.hcl with the paths filled in (docs/lease.md)",
			op, path, l.cfg.Heartbeat.Path, l.cfg.Heartbeat.EscrowPath)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: no answer within the request timeout: %w", op, path, err)
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}
