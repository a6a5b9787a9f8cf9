package lockclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
)

// LockState is whether a lock is held, as far as a read can tell.
type LockState string

// The states a read tells.
const (
	LockHeld    LockState = "held"
	LockFree    LockState = "free"
	LockUnknown LockState = "unknown"
)

// Status is what `lock status` reports about a lock variable.
//
// Nomad shows a variable's Lock field to management tokens only (or with
// ACLs off). For any other token the state comes from what the holders
// write and from what Nomad answers, by this rule, first match wins:
//
//  1. no variable: free;
//  2. the Lock field shown (or absent, to a token that sees locks): as it
//     says;
//  3. a release mark in the record (Holder.ReleasedAt, written right after
//     each release by check-and-set on the index the release left; any
//     acquire writes a new record): free;
//  4. a token with write on the path: a renew under a lock ID nobody holds,
//     which Nomad answers without touching the lock: "doesn't hold a lock"
//     is free, any other refusal held;
//  5. lease mode, with read on the heartbeat: the lock's ModifyIndex equal
//     to the index its holder's heartbeat says it left the lock at (every
//     release, expiry and acquire moves it): held;
//  6. otherwise unknown: a lock whose holder died, or whose release was
//     not marked, looks the same as a held one.
//
// Held is never reported for a lock that is free, except for a release or
// an expiry that lands between the read and the answer.
type Status struct {
	Path      string
	Namespace string
	Exists    bool
	// State is held, free or unknown; Basis says which rule told it.
	State LockState
	Basis string
	// HeldKnown and Held are State in two booleans.
	HeldKnown bool
	Held      bool
	// Holder is the last holder recorded in the Items; it stays after a release.
	Holder Holder
	// Fence is the variable's ModifyIndex: the holder's fencing token while
	// held, unless its holder has written its record since (a gate).
	Fence      uint64
	TTL        string
	LockDelay  string
	ModifiedAt time.Time
	// Heartbeat is lease mode's heartbeat, when there is one and the token
	// may read it (Status only; nil from StatusAfter).
	Heartbeat *BeatStatus
}

// BeatStatus is a lease-mode heartbeat as read.
type BeatStatus struct {
	Path string
	// Seq and Epoch: the heartbeat's number and the fence of the
	// acquisition it belongs to.
	Seq, Epoch uint64
	AllocID    string
	// ModifiedAt is when the server applied it (its clock).
	ModifiedAt time.Time
	// RenewAge is how long before its send the holder's last acknowledged
	// renew was sent.
	RenewAge time.Duration
	// Interval is the holder's heartbeat interval.
	Interval time.Duration
	// SealedBy is the allocation of a standby that took the lock over.
	SealedBy string
	// lockIndex is the lock's ModifyIndex as the holder last left it, as
	// the heartbeat records it (0: not recorded, take Epoch).
	lockIndex uint64
}

func (st *Status) set(state LockState, basis string) {
	st.State, st.Basis = state, basis
	st.HeldKnown, st.Held = state != LockUnknown, state == LockHeld
}

// Status reads the variable and tells its state by the rule above.
func (l *Locker) Status(ctx context.Context) (Status, error) {
	snap, _, err := l.read(ctx, 0)
	if err != nil {
		return Status{}, err
	}
	return l.fullStatus(ctx, snap), nil
}

// fullStatus is the status of the variable as read in snap, by every rule.
func (l *Locker) fullStatus(ctx context.Context, snap snapshot) Status {
	st := l.statusOf(ctx, snap)
	if st.Exists {
		l.readHeartbeat(ctx, &st)
		if st.State == LockUnknown {
			l.probe(ctx, &st)
		}
		if st.State == LockUnknown {
			st.beatEvidence(snap.v.ModifyIndex)
		}
	}
	return st
}

// variableLister is the list of Nomad's variables API (*api.Variables).
type variableLister interface {
	PrefixList(prefix string, q *api.QueryOptions) ([]*api.VariableMetadata, *api.QueryMeta, error)
}

// prefixList lists every variable under prefix that the token may list,
// in the Locker's namespace, page by page; errors are Nomad's, unclassified.
func (l *Locker) prefixList(ctx context.Context, prefix string) ([]*api.VariableMetadata, error) {
	lister, ok := l.vars.(variableLister)
	if !ok {
		return nil, errors.New("this lock API cannot list variables")
	}
	var metas []*api.VariableMetadata
	q := &api.QueryOptions{Namespace: l.cfg.Namespace}
	for {
		rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
		page, meta, err := lister.PrefixList(prefix, q.WithContext(rctx))
		cancel()
		if err != nil {
			return nil, err
		}
		metas = append(metas, page...)
		if meta == nil || meta.NextToken == "" {
			return metas, nil
		}
		q.NextToken = meta.NextToken
	}
}

// List is the Status of every lock under prefix that the token may list,
// in the Locker's namespace ("*" for all): each variable whose record
// names a holder, or whose lock Nomad shows. A lease-mode heartbeat, a
// semaphore's record and any other variable are left out.
func (l *Locker) List(ctx context.Context, prefix string) ([]Status, error) {
	metas, err := l.prefixList(ctx, prefix)
	if err != nil {
		return nil, l.classify("list", err)
	}
	var out []Status
	for _, m := range metas {
		at := l.at(m.Path, m.Namespace)
		snap, _, err := at.read(ctx, 0)
		if err != nil {
			if permanent(err) {
				continue // listed, but not readable by this token
			}
			return nil, err
		}
		if isLock(snap) {
			out = append(out, at.fullStatus(ctx, snap))
		}
	}
	return out, nil
}

// isLock reports whether a variable is a lock: its lock shown, or a
// holder's record in it.
func isLock(s snapshot) bool {
	if s.v == nil {
		return false
	}
	_, pid := s.v.Items[itemPID]
	_, acquired := s.v.Items[itemAcquiredAt]
	return s.v.Lock != nil || pid || acquired
}

// at is a Locker that reads the lock at path in namespace with l's client.
func (l *Locker) at(path, namespace string) *Locker {
	c := l.cfg
	c.Path, c.Namespace, c.Holders = path, namespace, 0
	return &Locker{cfg: c, api: l.api, vars: l.vars, cas: l.cas, clock: l.clock,
		log: l.cfg.Logger.With("path", path)}
}

// StatusAfter is a blocking read of the lock: it answers once the
// variable's ModifyIndex passes index (at once for index 0, or after the
// blocking wait), with the lock's status (rules 1 to 3 and 6 only) and the
// index to pass next time. A follower of the holder record (`lock lb
// follow`) calls it in a loop.
func (l *Locker) StatusAfter(ctx context.Context, index uint64) (Status, uint64, error) {
	snap, next, err := l.read(ctx, index)
	if err != nil {
		return Status{}, 0, err
	}
	return l.statusOf(ctx, snap), next, nil
}

// Permanent reports whether err, from a read of the lock, will not go away
// by retrying: permission denied, or a bad request.
func Permanent(err error) bool { return permanent(err) }

// statusOf is rules 1 to 3 and 6.
func (l *Locker) statusOf(ctx context.Context, snap snapshot) Status {
	st := Status{Path: l.cfg.Path, Namespace: l.cfg.Namespace}
	v := snap.v
	if v == nil {
		st.set(LockFree, "the variable does not exist")
		return st
	}
	st.Exists = true
	st.Namespace = v.Namespace
	st.Holder = holderFromItems(v.Items)
	st.Fence = v.ModifyIndex
	st.ModifiedAt = time.Unix(0, v.ModifyTime)
	st.TTL, st.LockDelay = st.Holder.TTL.String(), st.Holder.LockDelay.String()
	switch {
	case v.Lock != nil:
		state := LockFree
		if v.Lock.ID != "" {
			state = LockHeld
		}
		st.set(state, "Nomad shows the lock (a management token, or ACLs off)")
		st.TTL, st.LockDelay = v.Lock.TTL, v.Lock.LockDelay
	case !st.Holder.ReleasedAt.IsZero():
		st.set(LockFree, "released at "+st.Holder.ReleasedAt.Format(time.RFC3339)+" (the release mark in its record)")
	case l.seesLocks(ctx):
		st.set(LockFree, "Nomad shows no lock (a management token, or ACLs off)")
	default:
		st.set(LockUnknown, "no release is recorded since its holder's acquire: it is held, or expired on the server; "+
			"a token with write on the path, or a management token, tells which")
	}
	return st
}

// probe is rule 4: a renew under a lock ID nobody holds. Nomad checks the
// ID before it touches the lock's timer, so the renew changes nothing; a
// token without write gets a 403 and learns nothing.
func (l *Locker) probe(ctx context.Context, st *Status) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return
	}
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	v := &api.Variable{Namespace: l.cfg.Namespace, Path: l.cfg.Path, Lock: &api.VariableLock{ID: id}}
	_, _, err := l.vars.RenewLock(v, l.writeOptions(rctx))
	switch code := statusCode(err); {
	case err == nil:
		// A renew under an ID nobody else knows cannot succeed: learn nothing.
	case notHeld(err):
		st.set(LockFree, "Nomad says the variable holds no lock (a renew under another lock ID, which changes nothing)")
	case code == http.StatusNotFound:
		st.set(LockFree, "the variable was deleted")
	case code == http.StatusConflict:
		st.set(LockHeld, "Nomad refused a renew under another lock ID, which changes nothing")
	}
}

// readHeartbeat reads lease mode's heartbeat into st, if there is one that the
// token may read.
func (l *Locker) readHeartbeat(ctx context.Context, st *Status) {
	path := HeartbeatPathFor(l.cfg.Path)
	if ValidatePath(path) != nil {
		return
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	v, _, err := l.vars.Peek(path, (&api.QueryOptions{Namespace: l.cfg.Namespace}).WithContext(rctx))
	if err != nil || v == nil {
		return
	}
	rec, ok := parseBeat(v.Items)
	if !ok {
		return
	}
	st.Heartbeat = &BeatStatus{Path: path, Seq: rec.Seq, Epoch: rec.Epoch, AllocID: rec.Alloc, SealedBy: rec.SealedBy,
		ModifiedAt: time.Unix(0, v.ModifyTime), RenewAge: rec.RenewAge, Interval: rec.Interval}
	st.Heartbeat.lockIndex = rec.LockIndex
}

// beatEvidence is rule 5: the heartbeat says at which index its holder
// left the lock; the lock still there means nothing has moved it since.
func (st *Status) beatEvidence(index uint64) {
	hb := st.Heartbeat
	if hb == nil {
		return
	}
	left := hb.Epoch
	if hb.lockIndex != 0 {
		left = hb.lockIndex
	}
	if left != 0 && left == index {
		st.set(LockHeld, "the lock is at the index its holder's heartbeat (seq "+strconv.FormatUint(hb.Seq, 10)+
			") says it left it at: nothing released or expired it since")
	}
}

// seesLocks reports whether a missing Lock field means "not held": true with
// ACLs disabled or a management token, false for any other token.
func (l *Locker) seesLocks(ctx context.Context) bool {
	if l.api == nil {
		return false // a lock API of locktest's: no ACL to ask
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	tok, _, err := l.api.ACLTokens().Self((&api.QueryOptions{}).WithContext(rctx))
	if err != nil || tok == nil {
		return false
	}
	return tok.Type == "management" || tok.AccessorID == aclsDisabledAccessor
}

// aclsDisabledAccessor is what token/self answers when the cluster runs without ACLs.
const aclsDisabledAccessor = "acls-disabled"
