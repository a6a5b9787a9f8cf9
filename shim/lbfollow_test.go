package shim

import (
	"context"
	"net"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// followMove is one thing a follower learns, and the request it must send
// next: a read of the lock, a health check's verdict, or the outcome of
// the request it was asked to send (sent: it succeeded).
type followMove struct {
	lock   *lockclient.Status
	health string // "pass" or "fail"
	sent   bool
	listed string // "yes" or "no": what a read of the LB's state says
	want   step
}

// record is a read of the lock whose holder record names alloc, acquired
// at second n; held is what a token that sees the Lock field reads, and
// "hidden" what the workload identity reads (no Lock field).
func record(alloc string, n int, index uint64, held, previous string) *lockclient.Status {
	st := &lockclient.Status{Exists: true, Fence: index, Holder: lockclient.Holder{
		AllocID: alloc, PID: 1, AcquiredAt: time.Unix(int64(n), 0), Upstream: alloc + ":80", PreviousUpstream: previous}}
	switch held {
	case "held":
		st.HeldKnown, st.Held = true, true
	case "free":
		st.HeldKnown = true
	}
	return st
}

func clean(st *lockclient.Status) *lockclient.Status {
	st.Holder.ReleasedClean = true
	return st
}

var (
	none = step{}
	add  = func(fence uint64, previous string) step { return step{kind: stepAdd, fence: fence, previous: previous} }
	rm   = func(fence uint64) step { return step{kind: stepRemove, fence: fence} }
)

// TestFollowDecisions: what a follower of allocation "a" sends for a
// sequence of holder records, health verdicts and LB answers. It ADDs
// exactly once per healthy tenure of its own allocation (the first, one
// after a restart, one won back), swapping out the previous holder's
// upstream; it REMOVEs its own upstream when the tenure ends or the health
// check fails; another allocation's records never make it send anything.
func TestFollowDecisions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moves []followMove
	}{
		{"first tenure: ADD once healthy, swapping out the previous holder", []followMove{
			{lock: record("a", 1, 20, "hidden", "b:80"), want: none},
			{health: "pass", want: add(20, "b:80")},
			{sent: true, want: none},
			{lock: record("a", 1, 20, "hidden", "b:80"), want: none}, // the same read again
		}},
		{"another allocation's tenures send nothing", []followMove{
			{lock: record("b", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: none},
			{lock: record("c", 2, 30, "held", "b:80"), want: none},
			{lock: record("b", 3, 40, "free", "c:80"), want: none},
		}},
		{"the lock moves to another allocation: REMOVE", []followMove{
			{lock: record("a", 1, 20, "held", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: record("b", 2, 25, "held", "a:80"), want: rm(20)},
			{sent: true, want: none},
			{health: "pass", want: none}, // a late verdict of the ended tenure
		}},
		{"won back: the next tenure is ADDed again, swapping out the one between", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: record("b", 2, 25, "hidden", "a:80"), want: rm(20)},
			{sent: true, want: none},
			{lock: record("a", 3, 40, "hidden", "b:80"), want: none},
			{health: "pass", want: add(40, "b:80")},
			{sent: true, want: none},
		}},
		{"workload identity: the index moves under the same record (release, expiry): REMOVE, and not again", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: record("a", 1, 23, "hidden", ""), want: rm(20)},
			{sent: true, want: none},
			{lock: record("a", 1, 23, "hidden", ""), want: none},
			{health: "pass", want: none},
		}},
		{"a token that sees the Lock field: the lock freed under the same record ends the tenure", []followMove{
			{lock: record("a", 1, 20, "held", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: record("a", 1, 20, "held", ""), want: none},
			{lock: record("a", 1, 22, "free", ""), want: rm(20)},
		}},
		{"released_clean ends the tenure", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: clean(record("a", 1, 21, "hidden", "")), want: rm(20)},
		}},
		{"a dead holder fails its health check: REMOVE before the lock expires; ADD again if it passes", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{health: "fail", want: rm(20)},
			{sent: true, want: none},
			{health: "pass", want: add(20, "")},
		}},
		{"a restart won straight back: REMOVE until healthy, then ADD under the new fence", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{lock: record("a", 2, 30, "hidden", "a:80"), want: rm(20)}, // not healthy yet: the workload restarts
			{sent: true, want: none},
			{health: "pass", want: add(30, "a:80")},
		}},
		{"started while the LB lists it and another allocation holds: REMOVE under the index seen", []followMove{
			{listed: "yes", want: none}, // nothing before the first read of the lock
			{lock: record("b", 2, 30, "hidden", "a:80"), want: rm(30)},
			{sent: true, want: none},
		}},
		{"the LB lost our upstream out of band: ADD again", []followMove{
			{lock: record("a", 1, 20, "hidden", ""), want: none},
			{health: "pass", want: add(20, "")},
			{sent: true, want: none},
			{listed: "no", want: add(20, "")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := followView{alloc: "a"}
			var last step
			for i, m := range tc.moves {
				switch {
				case m.lock != nil:
					v.observe(*m.lock)
				case m.health != "":
					if v.tenure != nil { // the run drops verdicts outside a tenure
						v.healthy = m.health == "pass"
					}
				case m.sent:
					switch last.kind {
					case stepAdd:
						v.listed, v.listedFence = true, last.fence
					case stepRemove:
						v.listed, v.listedFence = false, 0
					default:
						t.Fatalf("move %d: sent, but nothing was to send", i)
					}
				case m.listed != "":
					v.listed = m.listed == "yes"
					if !v.listed {
						v.listedFence = 0
					}
				}
				last = v.next()
				if last != m.want {
					t.Fatalf("move %d (%+v): next = %+v, want %+v", i, m, last, m.want)
				}
			}
		})
	}
}

// followRig is two allocations' followers, a and b, of one lock in memory
// (read as the workload identity reads it: no Lock field), against the
// reference LB API over HTTP. Each allocation's workload is a TCP listener
// that the test starts and stops.
type followRig struct {
	t      *testing.T
	lock   *locktest.Server
	lb     *lbapi.Server
	uri    string
	ts     *httptest.Server
	addr   map[string]string
	lis    map[string]net.Listener
	cancel map[string]context.CancelFunc
	done   map[string]chan error
	logs   *proctest.SyncBuffer
	// vars and holders, when set, make the followers follow a semaphore of
	// holders slots at semFollowPrefix (lock lb follow -n).
	vars    *locktest.Vars
	holders int
	top     uint64 // the highest index written to any slot
}

const followService = "web"

func newFollowRig(t *testing.T) *followRig {
	t.Helper()
	return newFollowRigWith(t, nil, 0, "alloc-a", "alloc-b")
}

func newFollowRigWith(t *testing.T, vars *locktest.Vars, holders int, allocs ...string) *followRig {
	t.Helper()
	lb, ts := startLBAPI(t)
	r := &followRig{t: t, lock: locktest.New(), lb: lb, uri: lb.RequestURL(ts.URL), ts: ts,
		addr: map[string]string{}, lis: map[string]net.Listener{},
		cancel: map[string]context.CancelFunc{}, done: map[string]chan error{}, logs: &proctest.SyncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("followers' logs:\n%s", r.logs.String())
		}
	})
	r.vars, r.holders = vars, holders
	r.lock.HideLock()
	for i := range holders {
		vars.Server(lockclient.SlotPath(semFollowPrefix, i)).HideLock()
	}
	for _, alloc := range allocs {
		r.serve(alloc)
		r.follow(alloc)
	}
	return r
}

// serve starts alloc's workload: a listener, on the same address as before.
func (r *followRig) serve(alloc string) {
	r.t.Helper()
	addr := r.addr[alloc]
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.addr[alloc], r.lis[alloc] = l.Addr().String(), l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// kill stops alloc's workload: nothing listens at its address any more.
func (r *followRig) kill(alloc string) { r.lis[alloc].Close() }

func (r *followRig) follow(alloc string) {
	r.t.Helper()
	lb := &LoadBalancer{Config: lbhook.Config{URI: r.uri, ServiceID: followService, BasePath: "/web",
		Groups: []string{lbapi.DefaultGroup}, PortLabel: "http", RequestTimeout: time.Second,
		PollInterval: lbhook.MinPollInterval, AddDeadline: 5 * time.Second, RemoveDeadline: 2 * time.Second}.WithDefaults(),
		Upstream: r.addr[alloc], Recheck: time.Second,
		Health: &HealthCheck{Type: "tcp", Address: r.addr[alloc], Interval: 50 * time.Millisecond, Timeout: 200 * time.Millisecond}}
	client, err := lbhook.NewClient(lb.Config, lbhook.ClientOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	f := &LBFollower{LB: lb, Client: client, AllocID: alloc, Logger: hclog.New(&hclog.LoggerOptions{Name: alloc, Output: r.logs}),
		Locker: r.lock.Locker(r.t, lockclient.Config{Path: "nomad/jobs/web/lock", Timing: locktest.Timing()})}
	if r.vars != nil {
		f.Locker = r.vars.Locker(r.t, lockclient.Config{Path: semFollowPrefix, Holders: r.holders, Timing: locktest.Timing()})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	r.cancel[alloc], r.done[alloc] = cancel, done
	r.t.Cleanup(func() { r.stop(alloc) })
}

// stop is the sidecar's kill signal; it returns Run's error.
func (r *followRig) stop(alloc string) error {
	r.cancel[alloc]()
	if r.done[alloc] == nil {
		return nil // stopped already
	}
	select {
	case err := <-r.done[alloc]:
		r.done[alloc] = nil
		return err
	case <-time.After(ceiling):
		r.t.Fatalf("follower %s did not return within %s of its stop", alloc, ceiling)
	}
	return nil
}

// acquire writes alloc's holder record as its lock would, and returns the fence.
func (r *followRig) acquire(alloc string, previous string, n int) uint64 {
	return r.lock.Write(map[string]string{"holder_alloc_id": alloc, "holder_pid": "1",
		"acquired_at":     time.Unix(int64(n), 0).UTC().Format(time.RFC3339Nano),
		"holder_upstream": r.addr[alloc], "previous_upstream": previous})
}

// waitListed waits until the LB lists exactly want.
func (r *followRig) waitListed(what string, want ...string) {
	r.t.Helper()
	deadline := time.Now().Add(ceiling)
	for {
		got := r.lb.Upstreams(followService)
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: the LB lists %q after %s, want exactly %q; requests:\n%v", what, got, ceiling, want, r.lb.Requests(followService))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitADD waits until alloc's ADD of fence succeeded, and asserts that it
// removed previous.
func (r *followRig) waitADD(alloc string, fence uint64, previous string) {
	r.t.Helper()
	id := alloc + "-ADD-" + strconv.FormatUint(fence, 10)
	deadline := time.Now().Add(ceiling)
	rec, ok := r.lb.Request(id)
	for ; !ok || rec.State != "SUCCESS"; rec, ok = r.lb.Request(id) {
		if time.Now().After(deadline) {
			r.t.Fatalf("no successful %s within %s: %+v; requests:\n%v", id, ceiling, rec, r.lb.Requests(followService))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if previous != "" && !slices.Contains(rec.RemoveUpstreams, previous) {
		r.t.Errorf("%s removed %q, want the previous holder's %s", id, rec.RemoveUpstreams, previous)
	}
}

// TestLBFollowerFollowsEachTenure: two allocations' followers as the lock
// goes a → b (graceful) → a (b killed, a wins it back): after each move
// the LB lists exactly the holder; a killed holder leaves the LB on its
// failed health check, before anyone else holds the lock; every tenure's
// ADD swaps out the upstream before it; stopped followers remove
// themselves.
func TestLBFollowerFollowsEachTenure(t *testing.T) {
	r := newFollowRig(t)
	a, b := "alloc-a", "alloc-b"

	f1 := r.acquire(a, "", 1)
	r.waitADD(a, f1, "")
	r.waitListed("a's first tenure", r.addr[a])

	// Graceful: a's workload stops, a releases, b takes the lock.
	r.kill(a)
	r.lock.Free()
	f2 := r.acquire(b, r.addr[a], 2)
	r.waitADD(b, f2, r.addr[a])
	r.waitListed("b's tenure after a's graceful stop", r.addr[b])

	// a comes back as a standby; b is killed outright: it holds the lock
	// until the server expires it, but its failed health check takes it
	// out of the LB first.
	r.serve(a)
	r.kill(b)
	r.waitListed("b killed, its lock not yet expired")
	if !r.lock.Held() {
		t.Fatal("the test expects b's lock still held")
	}
	r.lock.Expire()
	f3 := r.acquire(a, r.addr[b], 3)
	r.waitADD(a, f3, r.addr[b])
	r.waitListed("a won the lock back", r.addr[a])

	// a's task restarts and wins the lock straight back.
	r.kill(a)
	r.lock.Free()
	r.serve(a)
	f4 := r.acquire(a, r.addr[a], 4)
	r.waitADD(a, f4, "")
	r.waitListed("a's tenure after its restart", r.addr[a])

	if err := r.stop(b); err != nil {
		t.Errorf("b's follower: %v", err)
	}
	r.waitListed("b's follower stopped", r.addr[a])
	if err := r.stop(a); err != nil {
		t.Errorf("a's follower: %v", err)
	}
	r.waitListed("a's follower stopped: it removes its upstream")
}

// TestLBFollowerStopsWithTheLBGone: a follower whose REMOVEs cannot reach
// the LB API (its health check failed, then its kill signal came) still
// returns within its REMOVE's deadline, with an error that says so.
func TestLBFollowerStopsWithTheLBGone(t *testing.T) {
	r := newFollowRig(t)
	a := "alloc-a"
	f := r.acquire(a, "", 1)
	r.waitADD(a, f, "")
	r.ts.CloseClientConnections()
	r.ts.Close()
	r.kill(a) // the health check fails: a REMOVE that cannot get through
	time.Sleep(300 * time.Millisecond)
	began := time.Now()
	err := r.stop(a)
	if err == nil || !strings.Contains(err.Error(), "lb remove of "+r.addr[a]) {
		t.Errorf("Run = %v, want the REMOVE's failure", err)
	}
	if took := time.Since(began); took > 4*time.Second {
		t.Errorf("the follower took %s to stop with the LB gone, want within its remove deadline (2s) and a request timeout", took)
	}
}

const semFollowPrefix = "nomad/jobs/web/sem"

// acquireSlot writes alloc's holder record into slot as its lock -n would,
// at an index above every slot's so far (Nomad's indexes are the cluster's
// Raft indexes, never equal across variables), and returns the fence.
func (r *followRig) acquireSlot(slot int, alloc, previous string, n int) uint64 {
	srv := r.vars.Server(lockclient.SlotPath(semFollowPrefix, slot))
	for srv.Write(nil) < r.top { // another write of the slot: a release
	}
	r.top = srv.Write(map[string]string{"holder_alloc_id": alloc, "holder_pid": "1",
		"acquired_at":     time.Unix(int64(n), 0).UTC().Format(time.RFC3339Nano),
		"holder_upstream": r.addr[alloc], "previous_upstream": previous,
		"semaphore_holders": strconv.Itoa(r.holders), "semaphore_slot": strconv.Itoa(slot)})
	return r.top
}

// waitListedSet waits until the LB lists exactly want, in any order.
func (r *followRig) waitListedSet(what string, want ...string) {
	r.t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(ceiling)
	for {
		got := slices.Clone(r.lb.Upstreams(followService))
		slices.Sort(got)
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: the LB lists %q after %s, want exactly %q; requests:\n%v", what, got, ceiling, want, r.lb.Requests(followService))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLBFollowerFollowsEverySlot: followers of a semaphore of 2 slots (lock
// lb follow -n 2) beside three allocations. Each holder of a slot is listed
// while it holds it; a slot's next holder swaps out that slot's previous
// one; an allocation that moves from one slot to another is listed for
// its new tenure; the other slot's changes never touch a holder's listing.
func TestLBFollowerFollowsEverySlot(t *testing.T) {
	a, b, c := "alloc-a", "alloc-b", "alloc-c"
	r := newFollowRigWith(t, locktest.NewVars(), 2, a, b, c)

	fa := r.acquireSlot(0, a, "", 1)
	fb := r.acquireSlot(1, b, "", 2)
	r.waitADD(a, fa, "")
	r.waitADD(b, fb, "")
	r.waitListedSet("a on slot 0, b on slot 1", r.addr[a], r.addr[b])

	// a stops; c takes slot 0 and swaps a out; b stays listed.
	r.kill(a)
	fc := r.acquireSlot(0, c, r.addr[a], 3)
	r.waitADD(c, fc, r.addr[a])
	r.waitListedSet("c took slot 0 from a", r.addr[b], r.addr[c])

	// b is killed; a, back as a standby, takes slot 1: its new tenure, on
	// another slot than its first, is listed, and b swapped out.
	r.serve(a)
	r.kill(b)
	r.waitListedSet("b killed: its check fails", r.addr[c])
	fa2 := r.acquireSlot(1, a, r.addr[b], 4)
	r.waitADD(a, fa2, r.addr[b])
	r.waitListedSet("a took slot 1 from b", r.addr[a], r.addr[c])

	for _, alloc := range []string{a, b, c} {
		if err := r.stop(alloc); err != nil {
			t.Errorf("%s's follower: %v", alloc, err)
		}
	}
	r.waitListedSet("every follower stopped: each removes its upstream")
}
