// Package locktest is an in-memory Nomad Variables lock API, for tests of
// code that holds a lease (the supervisor's) without a Nomad agent. A
// Server answers acquire, renew, release, update and blocking reads of one
// variable as Nomad does, and puts under the test's control what a holder
// must survive: renews or releases refused, the lock taken by another
// holder, the server's expiry and its lock delay. Server.Locker builds a
// real *lockclient.Locker over it, so the lease's own renew, watch and
// fence logic runs unchanged.
//
// The lock never expires by itself: Expire is the server's expiry, at the
// moment the test chooses. Every Server serves one variable, whatever path
// it is asked for, but the paths below its Lockers' lock path (a
// step-down request, standby records: Vars serves those), which are
// empty and take writes without keeping them.
package locktest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/testkey"
)

// Timing is a lockclient.Timing for tests: the shortest TTL Nomad accepts,
// with renews every 50ms and requests, backoffs and blocking reads of
// 100ms or less, so that a lease reacts to the Server within a fraction of
// a second.
func Timing() lockclient.Timing {
	return lockclient.Timing{
		TTL:            lockclient.MinTTL,
		LockDelay:      100 * time.Millisecond,
		RenewInterval:  50 * time.Millisecond,
		RequestTimeout: 100 * time.Millisecond,
		BlockingWait:   100 * time.Millisecond,
		MaxBackoff:     20 * time.Millisecond,
	}
}

// Operations counted by Server.Calls.
const (
	OpRead      = "read"    // a read of the variable, blocking or not
	OpAcquire   = "acquire" // an acquire, granted or refused
	OpRefused   = "refused" // an acquire refused: held, or within the lock delay
	OpRenew     = "renew"
	OpRelease   = "release"
	OpUpdate    = "update"
	OpCreate    = "create"     // a check-and-set create (index 0), done or refused
	OpAlloc     = "alloc"      // a read of an allocation (Info), blocking or not
	OpJobAllocs = "job-allocs" // a list of a job's allocations (Allocations)
	OpDelete    = "delete"
)

// Server is an in-memory lock API for one variable. It is safe for
// concurrent use.
type Server struct {
	mu         sync.Mutex
	index      uint64            // the last write's Raft index (the variable's, or an allocation's)
	varIndex   uint64            // the variable's ModifyIndex: the index of its last write
	exists     bool              // the variable has been written
	items      map[string]string // the variable's items
	lock       *api.VariableLock // nil while unlocked
	lastGrant  uint64            // ModifyIndex of the last acquire through the API
	grantedAt  time.Time         // when it was granted
	delayUntil time.Time         // acquires are refused until then (lock delay)
	changed    chan struct{}     // closed at every write: wakes blocking reads
	lockIDs    int
	renewErr   error
	acquireErr error
	releaseErr error
	createErr  error
	onRelease  func()
	calls      map[string]int
	allocs     map[string]*api.Allocation // what Info answers, by ID
	hideLock   bool
	// below is the paths' prefix that holds no variable (isBelow).
	below string
	// hideConflictLock: check-and-set conflicts answer without the lock.
	hideConflictLock bool
	// denyReads, denyWrites: reads, writes (updates and deletes) answer 403.
	denyReads, denyWrites bool
}

// New returns a Server whose variable does not exist yet.
func New() *Server {
	return &Server{index: 10, changed: make(chan struct{}), calls: map[string]int{}}
}

// Locker builds a Locker over s with cfg (see lockclient.NewWithLockAPI);
// an invalid cfg fails the test.
func (s *Server) Locker(t testing.TB, cfg lockclient.Config) *lockclient.Locker {
	t.Helper()
	l, err := lockclient.NewWithLockAPI(testkey.Get(), cfg, s)
	if err != nil {
		t.Fatalf("locktest: %v", err)
	}
	s.mu.Lock()
	s.below = cfg.Path + "/"
	s.mu.Unlock()
	return l
}

// isBelow reports whether path is below the lock path (see the package
// doc): no variable there. Called with mu held.
func (s *Server) isBelow(path string) bool {
	return s.below != "/" && s.below != "" && strings.HasPrefix(path, s.below)
}

// Allocs builds an allocation reader over s (see allocs.NewWithAPI): it
// reads the allocations SetAllocation wrote. An invalid cfg fails the test.
func (s *Server) Allocs(t testing.TB, cfg allocs.Config) *allocs.Reader {
	t.Helper()
	r, err := allocs.NewWithAPI(testkey.Get(), cfg, s)
	if err != nil {
		t.Fatalf("locktest: %v", err)
	}
	return r
}

// Error is an answer with an HTTP status, as Nomad's API client returns
// one (api.UnexpectedResponseError): what FailRenew and FailRelease take.
func Error(code int, body string) error { return statusError{code, body} }

type statusError struct {
	code int
	body string
}

func (e statusError) Error() string {
	return "Unexpected response code: " + strconv.Itoa(e.code) + " (" + e.body + ")"
}
func (e statusError) HasStatusCode() bool { return true }
func (e statusError) StatusCode() int     { return e.code }
func (e statusError) Body() string        { return e.body }

// errNotHolder is Nomad's answer to a renew or release with a lock ID that
// does not hold the lock.
var errNotHolder = Error(409, "variable doesn't hold a lock with this ID")

// Nomad's answers to a renew (nomad/variables_endpoint.go, RenewLock): of
// a variable that holds no lock, and of one locked under another ID.
var (
	errNoLock = Error(409, "variable doesn't hold a lock")
	errLocked = Error(409, "attempting to modify locked variable")
)

// TakeOver gives the lock to another holder at once, whoever held it: as if
// the server had expired our lock and a standby had taken it. The new
// holder, allocation OtherAlloc on node OtherNode, asks for lockDelay (see
// Expire). A lease on the lock learns at its next renew, or sooner from its
// watch.
func (s *Server) TakeOver(lockDelay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lock = &api.VariableLock{ID: s.newLockID(), TTL: lockclient.MinTTL.String(), LockDelay: lockDelay.String()}
	// The holder's items in lockclient's on-Nomad format (holder.go).
	s.items = map[string]string{"holder_alloc_id": OtherAlloc, "holder_node": OtherNode}
	s.write()
}

// The holder TakeOver installs.
const (
	OtherAlloc = "0th3r000-alloc"
	OtherNode  = "locktest-node"
)

// SetItems writes the variable's items, whoever holds the lock: a
// previous holder's record (lockclient's on-Nomad format, holder.go).
func (s *Server) SetItems(items map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items = maps.Clone(items)
	s.write()
}

// Items are the variable's items as last written.
func (s *Server) Items() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.items)
}

// Free releases the lock, whoever holds it, as its holder would: no lock
// delay follows.
func (s *Server) Free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lock = nil
	s.write()
}

// Expire is the server expiring the lock: it is free, but refused to every
// acquire for the lock delay its holder asked for.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock != nil {
		delay, _ := time.ParseDuration(s.lock.LockDelay)
		s.delayUntil = time.Now().Add(delay)
	}
	s.lock = nil
	s.write()
}

// HideLock makes reads answer as Nomad answers a token that is not a
// management token (a workload identity): without the Lock field, so that
// the reader cannot tell a held lock from a free one.
func (s *Server) HideLock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hideLock = true
}

// HideConflictLock makes a check-and-set conflict answer without the lock
// too: a Nomad that no longer shows the lock ID to a token with write on
// the path (docs/security.md). By default a conflict shows it, HideLock or
// not, as Nomad v1.11 does.
func (s *Server) HideConflictLock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hideConflictLock = true
}

// errDenied is Nomad's answer to a token without the capability.
var errDenied = Error(403, "Permission denied")

// DenyReads makes every read answer 403, as to a token without read.
func (s *Server) DenyReads() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denyReads = true
}

// DenyWrites makes every update, check-and-set write and delete answer
// 403, as to a token without write (or destroy).
func (s *Server) DenyWrites() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denyWrites = true
}

// Delete deletes the variable, as Nomad does (a missing one is no error).
func (s *Server) Delete(path string, w *api.WriteOptions) (*api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpDelete]++
	if s.denyWrites {
		return nil, errDenied
	}
	if s.exists && !s.isBelow(path) {
		s.exists, s.items, s.lock = false, nil, nil
		s.bump()
	}
	return &api.WriteMeta{}, nil
}

// Write sets the variable's items as a holder's acquire would, and takes
// the lock for a holder other than any Locker's: a test's other
// allocation. It returns the new index, the holder's fence.
func (s *Server) Write(items map[string]string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lock = &api.VariableLock{ID: s.newLockID(), TTL: lockclient.MinTTL.String(), LockDelay: "100ms"}
	s.items = maps.Clone(items)
	s.write()
	return s.index
}

// FailAcquire makes every acquire answer err until FailAcquire(nil).
func (s *Server) FailAcquire(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acquireErr = err
}

// FailRenew makes every renew answer err until FailRenew(nil).
func (s *Server) FailRenew(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewErr = err
}

// FailRelease makes every release answer err until FailRelease(nil).
func (s *Server) FailRelease(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseErr = err
}

// FailCreate makes every CheckedCreate answer err.
func (s *Server) FailCreate(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createErr = err
}

// OnRelease runs f at every release request, before it is answered: at
// the moment a holder gives the lock up.
func (s *Server) OnRelease(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRelease = f
}

// Calls is how many requests of op (OpRead, OpAcquire, …) were made.
func (s *Server) Calls(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// Held reports whether anyone holds the lock.
func (s *Server) Held() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lock != nil
}

// LastGrant is the ModifyIndex, and so the fence, of the last acquire
// granted through the API, and when it was granted (0 if none).
func (s *Server) LastGrant() (fence uint64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastGrant, s.grantedAt
}

func (s *Server) newLockID() string {
	s.lockIDs++
	return "locktest-lock-" + strconv.Itoa(s.lockIDs)
}

// write records a change of the variable: a new index, which is now its
// ModifyIndex, and blocking reads woken. Called with mu held.
func (s *Server) write() {
	s.bump()
	s.exists = true
	s.varIndex = s.index
}

// bump records a change of something else (an allocation): a new index,
// and blocking reads woken; the variable's ModifyIndex stays. Called with
// mu held.
func (s *Server) bump() {
	s.index++
	close(s.changed)
	s.changed = make(chan struct{})
}

// variable is the variable as Nomad returns it. Called with mu held.
func (s *Server) variable(path string) *api.Variable {
	if !s.exists {
		return nil
	}
	v := &api.Variable{Path: path, ModifyIndex: s.varIndex, Items: maps.Clone(s.items)}
	if s.lock != nil && !s.hideLock {
		l := *s.lock
		v.Lock = &l
	}
	return v
}

// holds reports whether id holds the lock. Called with mu held.
func (s *Server) holds(v *api.Variable) bool {
	return s.lock != nil && v.Lock != nil && v.Lock.ID == s.lock.ID
}

// Peek reads the variable (nil if it does not exist). With a WaitIndex it
// is a blocking query: it answers once the index passes it, or after
// WaitTime.
func (s *Server) Peek(path string, q *api.QueryOptions) (*api.Variable, *api.QueryMeta, error) {
	ctx := q.Context()
	if q.WaitIndex > 0 {
		if err := s.waitPast(ctx, q.WaitIndex, q.WaitTime); err != nil {
			return nil, nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpRead]++
	if s.denyReads {
		return nil, nil, errDenied
	}
	if s.isBelow(path) {
		return nil, &api.QueryMeta{LastIndex: s.index}, nil
	}
	return s.variable(path), &api.QueryMeta{LastIndex: s.index}, nil
}

// blockUntil is the wait of a blocking query q (none without a
// WaitIndex); it fails if q's context ends.
func (s *Server) blockUntil(q *api.QueryOptions) error {
	ctx := q.Context()
	if q.WaitIndex > 0 {
		if err := s.waitPast(ctx, q.WaitIndex, q.WaitTime); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// waitPast waits until the index passes index, wait passes or ctx ends.
func (s *Server) waitPast(ctx context.Context, index uint64, wait time.Duration) error {
	if wait <= 0 {
		wait = 5 * time.Minute // Nomad's default
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		past, changed := s.index > index, s.changed
		s.mu.Unlock()
		if past {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// AcquireLock grants the lock unless someone holds it or the lock delay
// runs (409).
func (s *Server) AcquireLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpAcquire]++
	if err := w.Context().Err(); err != nil {
		return nil, nil, err
	}
	if s.acquireErr != nil {
		return nil, nil, s.acquireErr
	}
	if v.Lock == nil {
		return nil, nil, Error(400, "lock-acquire without a lock")
	}
	if v.Lock.ID != "" && s.holds(v) {
		// Nomad takes an acquire by the ID that holds the lock: it writes
		// the variable again, with the lock's TTL and delay as sent.
		s.lock = &api.VariableLock{ID: v.Lock.ID, TTL: v.Lock.TTL, LockDelay: v.Lock.LockDelay}
		s.items = maps.Clone(v.Items)
		s.write()
		return s.variable(v.Path), nil, nil
	}
	if s.lock != nil || time.Now().Before(s.delayUntil) {
		s.calls[OpRefused]++
		return nil, nil, Error(409, "variable is already locked")
	}
	s.lock = &api.VariableLock{ID: cmp.Or(v.Lock.ID, s.newLockID()), TTL: v.Lock.TTL, LockDelay: v.Lock.LockDelay}
	s.items = maps.Clone(v.Items)
	s.write()
	s.lastGrant, s.grantedAt = s.index, time.Now()
	return s.variable(v.Path), nil, nil
}

// RenewLock answers FailRenew's error if set, else 409 unless v's lock ID
// holds the lock.
func (s *Server) RenewLock(v *api.Variable, w *api.WriteOptions) (*api.VariableMetadata, *api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpRenew]++
	switch {
	case w.Context().Err() != nil:
		return nil, nil, w.Context().Err()
	case s.renewErr != nil:
		return nil, nil, s.renewErr
	case s.lock == nil:
		return nil, nil, errNoLock
	case !s.holds(v):
		return nil, nil, errLocked
	}
	return &api.VariableMetadata{Path: v.Path, ModifyIndex: s.varIndex}, nil, nil
}

// ReleaseLock runs the OnRelease hook, then answers FailRelease's error if
// set, else frees the lock if v's lock ID holds it (409 if not).
func (s *Server) ReleaseLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	s.mu.Lock()
	hook := s.onRelease
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpRelease]++
	switch {
	case w.Context().Err() != nil:
		return nil, nil, w.Context().Err()
	case s.releaseErr != nil:
		return nil, nil, s.releaseErr
	case !s.holds(v):
		return nil, nil, errNotHolder
	}
	s.lock = nil
	s.write()
	return s.variable(v.Path), nil, nil
}

// Update writes the variable's items as Nomad does: a locked variable only
// with its lock ID (409 otherwise), never with a lock TTL or delay (400);
// the lock is then kept with Nomad's default TTL and delay (15s), not its
// own, and a lock ID written to a free variable makes a lock of it (Held).
func (s *Server) Update(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpUpdate]++
	if err := w.Context().Err(); err != nil {
		return nil, nil, err
	}
	if s.denyWrites {
		return nil, nil, errDenied
	}
	if s.isBelow(v.Path) {
		return v, nil, nil
	}
	return s.update(v)
}

// CheckedUpdate is Update by check-and-set on v.ModifyIndex (0: only if
// the variable does not exist): otherwise api.ErrCASConflict with the
// variable as it is.
func (s *Server) CheckedUpdate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpUpdate]++
	if err := w.Context().Err(); err != nil {
		return nil, nil, err
	}
	if s.denyWrites {
		return nil, nil, errDenied
	}
	if cur := s.variable(v.Path); (cur == nil) != (v.ModifyIndex == 0) || cur != nil && cur.ModifyIndex != v.ModifyIndex {
		if cur == nil {
			cur = &api.Variable{Path: v.Path}
		} else if s.hideConflictLock {
			cur.Lock = nil
		} else if s.lock != nil {
			// Nomad answers a conflict with the stored variable's
			// metadata, lock included, to any token with write.
			l := *s.lock
			cur.Lock = &l
		}
		return nil, nil, api.ErrCASConflict{CheckIndex: v.ModifyIndex, Conflict: cur}
	}
	return s.update(v)
}

// update is Update's write. Called with mu held.
func (s *Server) update(v *api.Variable) (*api.Variable, *api.WriteMeta, error) {
	switch {
	case v.Lock != nil && (v.Lock.TTL != "" || v.Lock.LockDelay != ""):
		return nil, nil, Error(400, "variable should not contain lock definition")
	case s.lock != nil && !s.holds(v):
		return nil, nil, errNotHolder
	}
	if v.Lock != nil {
		s.lock = &api.VariableLock{ID: v.Lock.ID, TTL: "15s", LockDelay: "15s"} // Nomad's defaults
	}
	s.items = maps.Clone(v.Items)
	s.write()
	return s.variable(v.Path), nil, nil
}

// CheckedCreate is Nomad's check-and-set create on index 0: it writes the
// variable's items only if it was never written, and otherwise answers
// api.ErrCASConflict with the variable as it is.
func (s *Server) CheckedCreate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpCreate]++
	if err := w.Context().Err(); err != nil {
		return nil, nil, err
	}
	if s.createErr != nil {
		return nil, nil, s.createErr
	}
	if s.exists {
		return nil, nil, api.ErrCASConflict{CheckIndex: 0, Conflict: s.variable(v.Path)}
	}
	s.items = maps.Clone(v.Items)
	s.write()
	return s.variable(v.Path), nil, nil
}

// SetAllocation makes Info answer with a copy of alloc (by its ID) from now
// on, and wakes blocking reads: as if the servers' view of it changed.
// The copy's ModifyIndex is the server's index.
func (s *Server) SetAllocation(alloc *api.Allocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.allocs == nil {
		s.allocs = map[string]*api.Allocation{}
	}
	a := *alloc
	s.allocs[a.ID] = &a
	s.bump()
	a.ModifyIndex = s.index
}

// RemoveAllocation makes Info answer 404 for id (a purged job, garbage
// collection).
func (s *Server) RemoveAllocation(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.allocs, id)
	s.bump()
}

// Info is the Allocations API's read of one allocation, as Nomad answers
// it: the allocation SetAllocation last wrote, or 404. With a WaitIndex it
// is a blocking query over the server's index (every write passes it).
func (s *Server) Info(allocID string, q *api.QueryOptions) (*api.Allocation, *api.QueryMeta, error) {
	if err := s.blockUntil(q); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpAlloc]++
	a, ok := s.allocs[allocID]
	if !ok {
		return nil, nil, Error(404, "alloc not found")
	}
	out := *a
	return &out, &api.QueryMeta{LastIndex: s.index}, nil
}

// String describes the lock for test failures.
func (s *Server) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return fmt.Sprintf("unlocked at index %d", s.index)
	}
	return fmt.Sprintf("locked by %s at index %d", s.lock.ID, s.index)
}

// Allocations is the Jobs API's list of one job's allocations, as Nomad
// answers it: a stub of every allocation SetAllocation wrote whose JobID is
// jobID, in the order of their IDs. With a WaitIndex it is a blocking
// query over the server's index.
func (s *Server) Allocations(jobID string, _ bool, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	if err := s.blockUntil(q); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[OpJobAllocs]++
	var out []*api.AllocationListStub
	for _, id := range slices.Sorted(maps.Keys(s.allocs)) {
		a := s.allocs[id]
		if a.JobID != jobID {
			continue
		}
		var version uint64
		if a.Job != nil && a.Job.Version != nil {
			version = *a.Job.Version
		}
		out = append(out, &api.AllocationListStub{ID: a.ID, Name: a.Name, Namespace: a.Namespace, NodeID: a.NodeID,
			JobID: a.JobID, JobVersion: version, TaskGroup: a.TaskGroup, DesiredStatus: a.DesiredStatus,
			DesiredDescription: a.DesiredDescription, ClientStatus: a.ClientStatus, TaskStates: a.TaskStates,
			NextAllocation: a.NextAllocation})
	}
	return out, &api.QueryMeta{LastIndex: s.index}, nil
}
