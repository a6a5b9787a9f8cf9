package lockclient

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// A step-down moves a lock on purpose (`lock step-down`, docs/cli.md): an
// operator asks the holder to hand the lock over, and it runs its normal
// stop path, releases, and waits as a standby again.
//
// A holder must never act on a request from a token that could not have
// released the lock. Releasing needs the lock ID, which Nomad shows to a
// management token on a read, and to any token with write on the lock
// path in the answer to a check-and-set write that conflicts
// (docs/security.md). So a request carries a proof that its writer knew
// the lock ID: an HMAC-SHA256 keyed by it over the request's fields. The
// holder checks it with its own lock ID; a request for an earlier
// acquisition, or from anyone who does not know the ID, fails by itself.
// The lock ID never appears in the request, in output or in logs.
//
// The request lives in a variable beside the lock (StepDownPathFor), which
// the holder watches with a blocking query while it holds the lock (read
// on that path alone). Before it releases, the holder writes into the
// lock's record whom the standbys give way to and until when (Handover),
// so that every standby sees it the moment the lock is free.

// StepDownMode is how a holder steps down, as its record says.
type StepDownMode string

const (
	// StepDownStop is a holder that stops its own workload: lock, or a
	// driver task. It runs its stop path (LB REMOVE first, kill signal,
	// kill timeout, proof of death), releases, and waits again.
	StepDownStop StepDownMode = "stop"
	// StepDownRestart is a gate, whose gated tasks are Nomad's: the
	// requester restarts its whole allocation, in which Nomad kills every
	// task and holds the main tasks back until the gate runs again; the
	// gate releases once its gated tasks are proven dead, and its next run
	// waits as a standby.
	StepDownRestart StepDownMode = "restart"
)

// StepDownItems are the items of the holder's record that offer a
// step-down in mode, whose stop takes at most within (Holder.StepDown):
// its step-down hook passes them to the acquire (AcquireOptions.Items).
func StepDownItems(mode StepDownMode, within time.Duration) map[string]string {
	return map[string]string{itemStepDown: string(mode), itemStepWithin: within.String()}
}

// StepDownPathFor is the step-down request variable of the lock at lockPath.
func StepDownPathFor(lockPath string) string { return lockPath + "/step-down" }

// StepDownRequest asks one holder to step down.
type StepDownRequest struct {
	// Holder is the Key of the holder asked.
	Holder string
	// To is the Key of the standby that alone may take the lock next;
	// "" lets any standby but the holder take it.
	To string
	// Wait is how long, from the holder's release, the other standbys give
	// way to To (or, without To, the holder stays out of the race).
	Wait time.Duration
	// Expires: the holder acts on the request only before then (its clock).
	Expires time.Time
	// Nonce makes each request unique.
	Nonce string
}

// Items of a step-down request.
const (
	reqVersion = "version"
	reqHolder  = "holder"
	reqTo      = "to"
	reqWait    = "wait"
	reqExpires = "expires"
	reqNonce   = "nonce"
	reqMAC     = "mac"
	// reqCanceled replaces a request that its requester withdrew.
	reqCanceled = "canceled"
)

// stepDownVersion is the request format's version; it is in the MAC.
const stepDownVersion = "1"

// message is what the MAC covers: every field, and the lock's path.
func (r StepDownRequest) message(path string) []byte {
	return []byte(strings.Join([]string{"nomad-driver-singleton step-down", stepDownVersion, path, r.Holder, r.To,
		r.Wait.String(), r.Expires.UTC().Format(time.RFC3339Nano), r.Nonce}, "\x00"))
}

// mac is the request's proof that its writer knew lockID.
func (r StepDownRequest) mac(lockID, path string) []byte {
	m := hmac.New(sha256.New, []byte(lockID))
	m.Write(r.message(path))
	return m.Sum(nil)
}

func (r StepDownRequest) items(lockID, path string) map[string]string {
	m := map[string]string{
		reqVersion: stepDownVersion,
		reqHolder:  r.Holder,
		reqWait:    r.Wait.String(),
		reqExpires: r.Expires.UTC().Format(time.RFC3339Nano),
		reqNonce:   r.Nonce,
		reqMAC:     hex.EncodeToString(r.mac(lockID, path)),
	}
	if r.To != "" {
		m[reqTo] = r.To
	}
	return m
}

// Why a request is not acted on.
var (
	errNoRequest    = errors.New("no step-down request")
	errNotForHolder = errors.New("the request names another holder")
	errBadProof     = errors.New("the request's proof does not match this holder's lock ID (a request for an earlier acquisition, or from a token that does not know the lock ID)")
	errExpired      = errors.New("the request has expired")
)

// verifyStepDown returns the request that items hold if it is for the
// holder self of the lock at path held under lockID, and has not expired
// at now.
func verifyStepDown(items map[string]string, lockID, path, self string, now time.Time) (StepDownRequest, error) {
	if items[reqMAC] == "" || items[reqCanceled] != "" {
		return StepDownRequest{}, errNoRequest
	}
	if v := items[reqVersion]; v != stepDownVersion {
		return StepDownRequest{}, fmt.Errorf("step-down request of version %q: this build reads version %s", v, stepDownVersion)
	}
	r := StepDownRequest{Holder: items[reqHolder], To: items[reqTo], Nonce: items[reqNonce]}
	var err error
	if r.Wait, err = time.ParseDuration(items[reqWait]); err != nil {
		return StepDownRequest{}, fmt.Errorf("step-down request: wait: %w", err)
	}
	if r.Expires, err = time.Parse(time.RFC3339Nano, items[reqExpires]); err != nil {
		return StepDownRequest{}, fmt.Errorf("step-down request: expires: %w", err)
	}
	got, err := hex.DecodeString(items[reqMAC])
	switch {
	case err != nil || !hmac.Equal(got, r.mac(lockID, path)):
		return StepDownRequest{}, errBadProof
	case r.Holder != self:
		return StepDownRequest{}, errNotForHolder
	case !now.Before(r.Expires):
		return StepDownRequest{}, errExpired
	}
	return r, nil
}

// Handover is what a holder that steps down writes into the lock's record
// just before its release: the standbys give way to To until Until, or,
// without To, the former holder From stays out of the race until then.
type Handover struct {
	From, To string
	Until    time.Time
}

// Items are the handover's items of the holder's record, which a holder
// that steps down writes with its release marks (Lease.MarkReleasing).
func (h Handover) Items() map[string]string {
	if h.From == "" {
		return nil
	}
	m := map[string]string{itemDownFrom: h.From, itemDownUntil: h.Until.UTC().Format(time.RFC3339Nano)}
	if h.To != "" {
		m[itemDownTo] = h.To
	}
	return m
}

func handoverFromItems(items map[string]string) Handover {
	h := Handover{From: items[itemDownFrom], To: items[itemDownTo]}
	h.Until, _ = time.Parse(time.RFC3339Nano, items[itemDownUntil])
	return h
}

// Grace is how long, from now, the standby whose Key is self gives way
// before it takes the lock this handover left free: until Until while
// another standby is named, or while self is the one that stepped down
// and nobody is named; 0 otherwise. Until is the former holder's clock,
// so a skew between hosts moves it by as much: it decides who goes first,
// never whether two hold.
func (h Handover) Grace(self string, now time.Time) time.Duration {
	if h.From == "" || !now.Before(h.Until) {
		return 0
	}
	if (h.To != "" && h.To != self) || (h.To == "" && h.From == self) {
		return h.Until.Sub(now)
	}
	return 0
}

// readPath reads the variable at path in the Locker's namespace; with
// index > 0 it is a blocking query (see read).
func (l *Locker) readPath(ctx context.Context, path string, index uint64) (*api.Variable, uint64, error) {
	timeout := l.cfg.RequestTimeout
	q := &api.QueryOptions{Namespace: l.cfg.Namespace}
	if index > 0 {
		q.WaitIndex, q.WaitTime = index, l.cfg.BlockingWait
		timeout += l.cfg.BlockingWait + l.cfg.BlockingWait/16
	}
	rctx, cancel := withTimeout(ctx, l.clock, timeout)
	defer cancel()
	v, meta, err := l.vars.Peek(path, q.WithContext(rctx))
	if err != nil {
		return nil, 0, err
	}
	if meta == nil {
		return v, 0, nil
	}
	return v, meta.LastIndex, nil
}

// StepDownReadable reports whether the token may read the lock's step-down
// requests: a holder that may not never acts on one, and its record does
// not offer a step-down. An error other than a refusal counts as yes (the
// watch then says what it meets).
func (l *Locker) StepDownReadable(ctx context.Context) bool {
	_, _, err := l.readPath(ctx, StepDownPathFor(l.cfg.Path), 0)
	return statusCode(err) != http.StatusForbidden
}

// StepDownRequested reads the lock's request variable once and returns
// the request in it, if it is for this lease's holder and proves its
// writer knew the lease's lock ID, and has not expired.
func (ls *Lease) StepDownRequested(ctx context.Context) (StepDownRequest, bool) {
	l := ls.locker
	v, _, err := l.readPath(ctx, StepDownPathFor(l.cfg.Path), 0)
	if err != nil || v == nil {
		return StepDownRequest{}, false
	}
	r, err := verifyStepDown(v.Items, ls.id, l.cfg.Path, l.cfg.Holder.Key(), time.Now())
	if err != nil {
		l.log.Debug("step-down request not acted on", "reason", err)
		return StepDownRequest{}, false
	}
	return r, true
}

// WatchStepDown watches the lock's request variable with blocking queries
// until ctx ends, and delivers the first request that StepDownRequested
// would return; the channel is then closed. A token that may not read the
// variable ends the watch at once (logged): the holder then never steps
// down, and its record does not offer it (StepDownReadable).
func (ls *Lease) WatchStepDown(ctx context.Context) <-chan StepDownRequest {
	out := make(chan StepDownRequest, 1)
	l := ls.locker
	path, self := StepDownPathFor(l.cfg.Path), l.cfg.Holder.Key()
	go func() {
		defer close(out)
		bo := l.newBackoff()
		var index uint64
		for ctx.Err() == nil {
			v, next, err := l.readPath(ctx, path, index)
			switch {
			case ctx.Err() != nil:
				return
			case statusCode(err) == http.StatusForbidden:
				l.log.Warn("cannot read step-down requests: this holder does not step down", "path", path, "error", err)
				return
			case err != nil:
				_ = sleep(ctx, l.clock, bo.NextBackOff())
				continue
			}
			bo.Reset()
			if v != nil {
				r, err := verifyStepDown(v.Items, ls.id, l.cfg.Path, self, time.Now())
				if err == nil {
					l.log.Info("step-down requested", "to", r.To, "wait", r.Wait)
					out <- r
					return
				}
				if !errors.Is(err, errNoRequest) {
					l.log.Debug("step-down request not acted on", "reason", err)
				}
			}
			if next <= index {
				// No index to block on (or it went back): do not spin.
				_ = sleep(ctx, l.clock, time.Second)
			}
			index = next
		}
	}()
	return out
}

// Errors of a requester.
var (
	// ErrNoHolder: the lock is free, or its variable does not exist.
	ErrNoHolder = errors.New("no holder: the lock is free")
	// ErrLockIDHidden: Nomad showed the token no lock ID, neither on a read
	// nor in the answer to a conflicting check-and-set write.
	ErrLockIDHidden = errors.New("Nomad shows this token no lock ID")
)

// StepDownTarget is the lock as a requester found it: its holder, and what
// proves the requester may ask it to step down (never shown).
type StepDownTarget struct {
	Holder Holder
	// Index is the lock variable's ModifyIndex when it was read.
	Index  uint64
	lockID string
}

// StepDownTarget reads the lock and learns its lock ID as Nomad shows it to
// this token: on a read to a management token (or with ACLs off), else in
// the answer to a check-and-set write on an index the variable is past,
// which Nomad refuses without writing and answers with the variable,
// its lock included, to a token with write on the path. A token without
// write gets a *StepDownPermissionError.
func (l *Locker) StepDownTarget(ctx context.Context) (StepDownTarget, error) {
	cur, _, err := l.read(ctx, 0)
	if err != nil {
		return StepDownTarget{}, l.stepDownError(err, l.cfg.Path, "read")
	}
	v := cur.v
	if v == nil {
		return StepDownTarget{}, fmt.Errorf("step down %s: %w (the variable does not exist)", l.cfg.Path, ErrNoHolder)
	}
	t := StepDownTarget{Holder: holderFromItems(v.Items), Index: v.ModifyIndex}
	if v.Lock != nil && v.Lock.ID != "" {
		t.lockID = v.Lock.ID
		return t, nil
	}
	if st := l.fullStatus(ctx, cur); st.State == LockFree {
		return StepDownTarget{}, fmt.Errorf("step down %s: %w (%s)", l.cfg.Path, ErrNoHolder, st.Basis)
	}
	if l.cas == nil || v.ModifyIndex < 2 {
		return StepDownTarget{}, fmt.Errorf("step down %s: %w", l.cfg.Path, ErrLockIDHidden)
	}
	items := maps.Clone(v.Items)
	if len(items) == 0 {
		items = map[string]string{"step_down_probe": "never written"}
	}
	// ModifyIndex - 1 is below every index the variable can have from now
	// on (Raft indexes only grow; a deleted one gets a conflict too), so
	// this write never lands.
	probe := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Items: items, ModifyIndex: v.ModifyIndex - 1}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	_, _, err = l.cas.CheckedUpdate(probe, l.writeOptions(rctx))
	var conflict api.ErrCASConflict
	switch {
	case errors.As(err, &conflict):
	case err == nil:
		return StepDownTarget{}, fmt.Errorf("step down %s: Nomad took a check-and-set write on an index the variable was past", l.cfg.Path)
	default:
		return StepDownTarget{}, l.stepDownError(err, l.cfg.Path, "write")
	}
	c := conflict.Conflict
	switch {
	case c == nil || c.ModifyIndex == 0:
		return StepDownTarget{}, fmt.Errorf("step down %s: %w (the variable was deleted)", l.cfg.Path, ErrNoHolder)
	case c.ModifyIndex != v.ModifyIndex:
		return StepDownTarget{}, fmt.Errorf("step down %s: the lock changed while it was read (index %d, then %d): try again",
			l.cfg.Path, v.ModifyIndex, c.ModifyIndex)
	case c.Lock == nil:
		return StepDownTarget{}, fmt.Errorf("step down %s: %w", l.cfg.Path, ErrLockIDHidden)
	case c.Lock.ID == "":
		return StepDownTarget{}, fmt.Errorf("step down %s: %w", l.cfg.Path, ErrNoHolder)
	}
	t.lockID = c.Lock.ID
	return t, nil
}

// MayRequestStepDown checks, writing nothing, that the token may write
// the lock's step-down request: a check-and-set write on an index no
// variable there can have, which Nomad refuses with a 403 (a
// *StepDownPermissionError) to a token without write there, and
// otherwise with a conflict. So a refusal has no effect.
func (l *Locker) MayRequestStepDown(ctx context.Context) error {
	path := StepDownPathFor(l.cfg.Path)
	if l.cas == nil {
		return fmt.Errorf("step down %s: no check-and-set write available", l.cfg.Path)
	}
	probe := &api.Variable{Namespace: l.cfg.Namespace, Path: path, Items: map[string]string{"step_down_probe": "never written"},
		ModifyIndex: math.MaxUint64}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	_, _, err := l.cas.CheckedUpdate(probe, l.writeOptions(rctx))
	var conflict api.ErrCASConflict
	switch {
	case errors.As(err, &conflict):
		return nil
	case err == nil:
		return fmt.Errorf("step down %s: Nomad took a check-and-set write on index %d", l.cfg.Path, probe.ModifyIndex)
	}
	return l.stepDownError(err, path, "write")
}

// SendStepDown writes the request r for t's holder, with its proof. The
// caller has checked that the holder offers a step-down
// (t.Holder.StepDown) and that a standby waits.
func (l *Locker) SendStepDown(ctx context.Context, t StepDownTarget, r StepDownRequest) (StepDownRequest, error) {
	if r.Nonce == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return r, err
		}
		r.Nonce = hex.EncodeToString(b[:])
	}
	r.Holder = t.Holder.Key()
	path := StepDownPathFor(l.cfg.Path)
	if err := l.writeVar(ctx, path, r.items(t.lockID, l.cfg.Path)); err != nil {
		return r, l.stepDownError(err, path, "write")
	}
	return r, nil
}

// CancelStepDown replaces the request r with a mark that withdraws it: a
// holder that reads it afterwards does not act (a gate's allocation that
// could not be restarted).
func (l *Locker) CancelStepDown(ctx context.Context, r StepDownRequest) error {
	path := StepDownPathFor(l.cfg.Path)
	if err := l.writeVar(ctx, path, map[string]string{reqVersion: stepDownVersion, reqCanceled: r.Nonce}); err != nil {
		return l.stepDownError(err, path, "write")
	}
	return nil
}

// writeVar writes items to the (unlocked) variable at path.
func (l *Locker) writeVar(ctx context.Context, path string, items map[string]string) error {
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	_, _, err := l.vars.Update(&api.Variable{Namespace: l.cfg.Namespace, Path: path, Items: items}, l.writeOptions(rctx))
	return err
}

// StepDownPermissionError is a refusal of the requester's token: it may
// not do what a step-down needs on Path (Capability).
type StepDownPermissionError struct {
	LockPath, Path, Capability, Namespace string
	Err                                   error
}

func (e *StepDownPermissionError) Unwrap() error { return e.Err }

func (e *StepDownPermissionError) Error() string {
	return fmt.Sprintf("step down %s: permission denied (HTTP 403) to %s %s.\n"+
		"Only a token that could release the lock may ask its holder to step down: a management token, or one with "+
		"the step-down policy (examples/acl/singleton-step-down.policy.hcl): write and read on the lock path, write on "+
		"%s, list and read on %s*, and read-job and alloc-lifecycle on namespace %q (a gate's allocation is restarted)",
		e.LockPath, e.Capability, e.Path, StepDownPathFor(e.LockPath), StandbyPrefixFor(e.LockPath), nsOr(e.Namespace))
}

func nsOr(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

// stepDownError names the policy for a refusal, and classifies the rest.
func (l *Locker) stepDownError(err error, path, capability string) error {
	if statusCode(err) == http.StatusForbidden {
		return &StepDownPermissionError{LockPath: l.cfg.Path, Path: path, Capability: capability, Namespace: l.cfg.Namespace, Err: err}
	}
	return l.classify("step down", err)
}
