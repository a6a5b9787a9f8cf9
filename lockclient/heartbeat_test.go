package lockclient

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

const (
	testBeatPath   = testPath + "/lease"
	testEscrowPath = "singleton/escrow/" + testPath
)

// leaseRig is a lease-mode Locker on the fake clock whose fake API answers
// by itself: reads, acquire, renews and the escrow write succeed, and a
// heartbeat (check-and-set) succeeds while beats is true.
type leaseRig struct {
	*rig
	mu      sync.Mutex
	beats   bool
	index   uint64
	casSent []*api.Variable
	onCAS   func(*call) (reply, bool)
	escrow  map[string]string
}

func newLeaseRig(t *testing.T, ttl time.Duration, hb Heartbeat) *leaseRig {
	t.Helper()
	hb.Path, hb.EscrowPath = testBeatPath, testEscrowPath
	cfg, err := Config{Path: testPath, Timing: Timing{TTL: ttl, LockDelay: time.Second},
		Holder: Holder{AllocID: "alloc-self"}, Heartbeat: &hb}.prepared()
	if err != nil {
		t.Fatal(err)
	}
	c := newFakeClock()
	f := newFakeAPI(c)
	lr := &leaseRig{rig: &rig{clock: c, api: f, l: newLocker(cfg, nil, f, c)}, beats: true, index: 100}
	lr.l.cas = f
	f.auto = func(c *call) (reply, bool) {
		lr.mu.Lock()
		defer lr.mu.Unlock()
		switch c.op {
		case "wait":
			return reply{err: httpError{403, "Permission denied"}}, true
		case "read":
			if c.v.Path == testBeatPath {
				return reply{}, true
			}
			return reply{index: 5}, true
		case "acquire":
			return acquired(), true
		case "renew", "release":
			return reply{}, true
		case "update":
			lr.escrow = c.v.Items
			return reply{v: &api.Variable{}}, true
		case "cas":
			if lr.onCAS != nil {
				if r, ok := lr.onCAS(c); ok {
					return r, true
				}
			}
			lr.casSent = append(lr.casSent, c.v)
			if !lr.beats {
				return reply{err: httpError{500, "rpc error: no cluster leader"}}, true
			}
			lr.index++
			return reply{v: &api.Variable{ModifyIndex: lr.index}}, true
		}
		return reply{}, false
	}
	return lr
}

func (lr *leaseRig) acquire(t *testing.T) *Lease {
	t.Helper()
	ls, err := lr.l.Acquire(context.Background(), AcquireOptions{})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() { ls.stopOnce.Do(func() { close(ls.stop); ls.cancelReq() }) })
	return ls
}

// sealedByStandby makes a standby seal the heartbeat: the next heartbeat
// (at t0 + 1s, which it brings about) meets a check-and-set conflict and
// reads back a record sealed by alloc-standby.
func (lr *leaseRig) sealedByStandby(t *testing.T) {
	t.Helper()
	sealed := beatRecord{Seq: 9, Epoch: testFence, SealedBy: "alloc-standby"}
	lr.mu.Lock()
	lr.onCAS = func(c *call) (reply, bool) {
		return reply{err: api.ErrCASConflict{CheckIndex: 101, Conflict: &api.Variable{}}}, true
	}
	lr.mu.Unlock()
	auto := lr.api.auto
	lr.api.auto = func(c *call) (reply, bool) {
		if c.op == "read" && c.v.Path == testBeatPath {
			return reply{v: &api.Variable{Path: testBeatPath, ModifyIndex: 102, Items: sealed.items()}}, true
		}
		return auto(c)
	}
	lr.clock.waitTimerAt(t, t0.Add(time.Second))
	lr.clock.advanceTo(t, t0.Add(time.Second))
}

// The holder fences itself D after the send of its last acknowledged
// heartbeat, long before the lock's own fence, and its workload must be
// dead K later; every heartbeat carries what the standby needs.
func TestHeartbeatFencesTheHolder(t *testing.T) {
	hb := Heartbeat{Interval: time.Second, Fence: 6 * time.Second, KillGrace: 2 * time.Second}
	lr := newLeaseRig(t, 20*time.Second, hb)
	ls := lr.acquire(t)
	if lr.escrow["lock_id"] != testID || lr.escrow["fence"] != strconv.Itoa(testFence) {
		t.Fatalf("escrow written at acquire = %v, want the lock ID and fence", lr.escrow)
	}
	if got := ls.FenceDeadline(); !got.Equal(t0.Add(hb.Fence)) {
		t.Fatalf("fence deadline after acquire = t0+%s, want t0+%s (the first heartbeat's send + D)", got.Sub(t0), hb.Fence)
	}
	for i := 1; i <= 3; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		lr.clock.waitTimerAt(t, at)
		lr.clock.advanceTo(t, at)
		select {
		case <-ls.Renewed():
		case <-time.After(realWait):
			t.Fatalf("heartbeat %d did not republish the deadlines", i)
		}
		if got := ls.FenceDeadline(); !got.Equal(at.Add(hb.Fence)) {
			t.Fatalf("fence deadline after heartbeat %d = t0+%s, want t0+%s", i, got.Sub(t0), at.Add(hb.Fence).Sub(t0))
		}
	}
	lr.mu.Lock()
	last := lr.casSent[len(lr.casSent)-1]
	lr.beats = false
	lr.mu.Unlock()
	rec, ok := parseBeat(last.Items)
	if !ok || rec.Epoch != testFence || rec.Seq != 4 || rec.Fence != hb.Fence || rec.KillGrace != hb.KillGrace ||
		rec.Interval != hb.Interval || rec.RenewAge != 3*time.Second || rec.TTL != 20*time.Second || last.ModifyIndex != 103 {
		t.Fatalf("heartbeat 4 = %+v at cas index %d, want seq 4, epoch %d, D/K/R, renew age 3s (since the acquire), TTL 20s, cas on 103",
			rec, last.ModifyIndex, testFence)
	}

	lr.clock.advanceTo(t, t0.Add(9*time.Second))
	if !closedWithin(ls.Lost()) {
		t.Fatal("the lease was not lost at its heartbeat fence (last heartbeat + D)")
	}
	if err := ls.Err(); err == nil || !strings.Contains(err.Error(), "heartbeat") {
		t.Fatalf("Err() = %v, want a loss that names the heartbeat", err)
	}
	if got, want := ls.StopDeadline(), t0.Add(3*time.Second+hb.Fence+hb.KillGrace); !got.Equal(want) {
		t.Fatalf("stop deadline = t0+%s, want t0+%s (last heartbeat + D + K)", got.Sub(t0), want.Sub(t0))
	}
}

// A heartbeat that a standby sealed ends the lease at once, as a loss the
// server confirmed: the workload must be gone by the fence deadline.
func TestSealedHeartbeatEndsTheLease(t *testing.T) {
	lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
	ls := lr.acquire(t)
	lr.sealedByStandby(t)
	if !closedWithin(ls.Lost()) {
		t.Fatal("a sealed heartbeat did not end the lease")
	}
	if !errors.Is(ls.Err(), ErrLost) || !strings.Contains(ls.Err().Error(), "sealed") {
		t.Fatalf("Err() = %v, want a loss that says the heartbeat was sealed", ls.Err())
	}
	if !ls.StopDeadline().Equal(ls.FenceDeadline()) {
		t.Fatal("after a takeover the stop deadline must be the fence deadline")
	}
}

func TestHeartbeatValidate(t *testing.T) {
	base := Heartbeat{Path: testBeatPath, EscrowPath: testEscrowPath, Interval: time.Second, Fence: 6 * time.Second, KillGrace: 2 * time.Second}
	timing := Timing{TTL: 15 * time.Second, LockDelay: time.Second}
	tests := []struct {
		name  string
		edit  func(*Heartbeat)
		field string // "" for valid
	}{
		{"default", func(*Heartbeat) {}, ""},
		{"aggressive", func(h *Heartbeat) {
			h.Interval, h.Fence, h.KillGrace = AggressiveHeartbeat.Interval, AggressiveHeartbeat.Fence, AggressiveHeartbeat.KillGrace
		}, ""},
		{"interval too short", func(h *Heartbeat) { h.Interval = 100 * time.Millisecond }, "lease_interval"},
		{"fence below two intervals", func(h *Heartbeat) { h.Fence = 1500 * time.Millisecond }, "lease_fence"},
		{"fence past the lock's fence", func(h *Heartbeat) { h.Fence = 14 * time.Second }, "lease_fence"},
		{"kill grace negative", func(h *Heartbeat) { h.KillGrace = -time.Second }, "lease_kill_grace"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := base
			tc.edit(&h)
			err := h.Validate(timing)
			if (err == nil) != (tc.field == "") || (err != nil && !strings.Contains(err.Error(), tc.field)) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.field)
			}
		})
	}
}

func TestTakeoverTimes(t *testing.T) {
	if got := DefaultHeartbeat.Takeover(); got != 9*time.Second {
		t.Fatalf("default profile L = %s, want 9s", got)
	}
	if got := AggressiveHeartbeat.Takeover(); got != 4*time.Second {
		t.Fatalf("aggressive profile L = %s, want 4s", got)
	}
}

// obs is a read of the heartbeat at index, sent at ms and answered 10 ms
// later, of a record with renew age 2s and the default D and K.
func obs(ms int, index uint64) beatObservation {
	at := t0.Add(time.Duration(ms) * time.Millisecond)
	rec := beatRecord{Seq: index, Epoch: testFence, Interval: time.Second, Fence: 6 * time.Second,
		KillGrace: 2 * time.Second, RenewAge: 2 * time.Second, TTL: 10 * time.Second}
	return beatObservation{sent: at, received: at.Add(10 * time.Millisecond), index: index, rec: rec, ok: true}
}

func failed(ms int) beatObservation {
	at := t0.Add(time.Duration(ms) * time.Millisecond)
	return beatObservation{sent: at, received: at.Add(10 * time.Millisecond), err: errors.New("500 no cluster leader")}
}

// The standby's decision: only a heartbeat unchanged for L over continuous
// successful reads, with two changes seen before it (the lower bound on
// the holder's last renew), allows a takeover.
func TestTakeoverDecision(t *testing.T) {
	// The holder's heartbeats 1, 2 and 3 at 0 s, 1 s and 2 s, seen by reads
	// every 250 ms; then the holder dies.
	healthy := []beatObservation{obs(100, 1), obs(350, 1), obs(600, 1), obs(850, 1), obs(1100, 2), obs(1350, 2),
		obs(1600, 2), obs(1850, 2), obs(2100, 3)}
	// reads of 3 until and including ms
	stale := func(until int) []beatObservation {
		var out []beatObservation
		for ms := 2350; ms <= until; ms += 250 {
			out = append(out, obs(ms, 3))
		}
		return out
	}
	join := func(parts ...[]beatObservation) []beatObservation {
		var out []beatObservation
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name  string
		reads []beatObservation
		now   int // ms
		ready bool
		why   string
		// renewAfter: the last read of 1 was sent at 850 ms, less the
		// renew age of 2 s.
		renewAfter time.Duration
	}{
		{"stale for L", join(healthy, stale(11200)), 11200, true, "", 850*time.Millisecond - 2*time.Second},
		{"not yet L", join(healthy, stale(11000)), 11000, false, "unchanged for", 0},
		{"a read error restarts the count", join(healthy, stale(5000), []beatObservation{failed(5250)}, stale(11200)),
			11200, false, "unchanged for", 0},
		{"counted again from the first good read after the error",
			join(healthy, stale(5000), []beatObservation{failed(5250)}, []beatObservation{obs(5500, 3)}),
			5510 + 9000, true, "", 850*time.Millisecond - 2*time.Second},
		{"an error as the last read", join(healthy, stale(11000), []beatObservation{failed(11250)}), 11300, false, "since the last error", 0},
		{"too few changes seen", join([]beatObservation{obs(1850, 2), obs(2100, 3)}, stale(11200)), 11200, false, "too few", 0},
		{"a holder that asks for a longer L", func() []beatObservation {
			r := join(healthy, stale(11200))
			for i := range r {
				r[i].rec.Fence = 8 * time.Second
			}
			return r
		}(), 11200, false, "of 11s", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &takeoverCount{own: DefaultHeartbeat.Takeover()}
			for _, o := range tc.reads {
				c.observe(o)
			}
			v := c.decide(t0.Add(time.Duration(tc.now) * time.Millisecond))
			if v.ready != tc.ready || !strings.Contains(v.why, tc.why) {
				t.Fatalf("decide = ready %v (%q), want ready %v (%q)", v.ready, v.why, tc.ready, tc.why)
			}
			if tc.ready && (!v.renewAfter.Equal(t0.Add(tc.renewAfter)) || v.index != 3) {
				t.Fatalf("renew lower bound t0%+v, index %d; want t0%+v, index 3", v.renewAfter.Sub(t0), v.index, tc.renewAfter)
			}
		})
	}
	t.Run("sealed", func(t *testing.T) {
		c := &takeoverCount{own: DefaultHeartbeat.Takeover()}
		for _, o := range join(healthy, stale(11200)) {
			o.rec.SealedBy = "alloc-other"
			c.observe(o)
		}
		if v := c.decide(t0.Add(12 * time.Second)); v.ready {
			t.Fatal("a sealed heartbeat allowed a takeover")
		}
	})
}

// takeOver checks the lock's epoch and the release cutoff before it
// touches anything, seals the heartbeat on the index it counted, and only
// then releases with the escrowed lock ID.
func TestTakeOver(t *testing.T) {
	hb := DefaultHeartbeat
	hb.Path, hb.EscrowPath = testBeatPath, testEscrowPath
	verdict := takeoverVerdict{ready: true, index: 103, rec: beatRecord{Seq: 3, Epoch: testFence, TTL: 10 * time.Second}, renewAfter: t0}
	lockVar := func(index uint64) *api.Variable {
		return &api.Variable{Path: testPath, ModifyIndex: index, Lock: &api.VariableLock{ID: "", TTL: "10s", LockDelay: "1s"}}
	}
	escrow := &api.Variable{Path: testEscrowPath, Items: map[string]string{"lock_id": testID, "fence": strconv.Itoa(testFence)}}
	tests := []struct {
		name    string
		lock    *api.Variable
		now     time.Duration
		sealErr error
		ops     []string // the requests made, in order
		err     string   // "" for a release
	}{
		{"released", lockVar(testFence), 9 * time.Second, nil, []string{"read", "read", "cas", "release"}, ""},
		{"epoch changed", lockVar(testFence + 5), 9 * time.Second, nil, []string{"read"}, "no longer in the heartbeat's epoch"},
		{"lock state hidden (not a management token): the index and the heartbeat's TTL decide",
			&api.Variable{Path: testPath, ModifyIndex: testFence}, 9 * time.Second, nil, []string{"read", "read", "cas", "release"}, ""},
		{"lock state hidden, past the cutoff by the heartbeat's TTL", &api.Variable{Path: testPath, ModifyIndex: testFence},
			16500 * time.Millisecond, nil, []string{"read"}, "left to the server's expiry"},
		{"lock freed and taken again", lockVar(testFence + 9), 9 * time.Second, nil, []string{"read"}, "epoch"},
		// cutoff: t0 + 2×10s − 1s − 2.5s = t0 + 16.5s
		{"past the release cutoff", lockVar(testFence), 16500 * time.Millisecond, nil, []string{"read"}, "left to the server's expiry"},
		{"the heartbeat moved before the seal", lockVar(testFence), 9 * time.Second,
			api.ErrCASConflict{CheckIndex: 103, Conflict: &api.Variable{}}, []string{"read", "read", "cas"}, "changed before it could be sealed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			c.now = t0.Add(tc.now)
			f := newFakeAPI(c)
			var ops []string
			var released, sealed *api.Variable
			f.auto = func(cl *call) (reply, bool) {
				ops = append(ops, cl.op)
				switch {
				case cl.op == "read" && cl.v.Path == testPath:
					return reply{v: tc.lock}, true
				case cl.op == "read" && cl.v.Path == testEscrowPath:
					return reply{v: escrow}, true
				case cl.op == "cas":
					sealed = cl.v
					return reply{v: &api.Variable{}, err: tc.sealErr}, true
				case cl.op == "release":
					released = cl.v
					return reply{}, true
				}
				return reply{err: errors.New("unexpected")}, true
			}
			cfg, err := Config{Path: testPath, Timing: Timing{TTL: 10 * time.Second, LockDelay: time.Second}}.prepared()
			if err != nil {
				t.Fatal(err)
			}
			l := newLocker(cfg, nil, f, c)
			l.cas = f
			err = l.takeOver(context.Background(), TakeoverOptions{Heartbeat: hb, SealedBy: "alloc-standby"}, verdict)
			if strings.Join(ops, ",") != strings.Join(tc.ops, ",") {
				t.Fatalf("requests %v, want %v", ops, tc.ops)
			}
			if tc.err == "" {
				if err != nil || released == nil || released.Lock.ID != testID {
					t.Fatalf("takeOver = %v, released %+v; want a release with the escrowed ID", err, released)
				}
				if rec, _ := parseBeat(sealed.Items); sealed.ModifyIndex != 103 || rec.SealedBy != "alloc-standby" {
					t.Fatalf("seal sent %+v on index %d, want sealed_by alloc-standby on 103", sealed.Items, sealed.ModifyIndex)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || released != nil {
				t.Fatalf("takeOver = %v (released %v), want no release and an error with %q", err, released != nil, tc.err)
			}
		})
	}
}

// Once the server ended the lease (a renew answered 404), heartbeats stop
// and none moves its deadlines: the workload must be gone by the fence
// deadline the loss found.
func TestHeartbeatsStopWhenTheLeaseIsLost(t *testing.T) {
	lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
	auto := lr.api.auto
	lr.api.auto = func(c *call) (reply, bool) {
		if c.op == "renew" {
			return reply{err: httpError{404, "variable not found"}}, true
		}
		return auto(c)
	}
	ls := lr.acquire(t)
	for i := 1; i <= 10; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		lr.clock.waitTimer(t, "for the next heartbeat or renew", func(w time.Time) bool { return w.Equal(at) })
		lr.clock.advanceTo(t, at)
		if i < 10 {
			select {
			case <-ls.Renewed():
			case <-time.After(realWait):
				t.Fatalf("heartbeat %d did not republish the deadlines", i)
			}
		}
	}
	if !closedWithin(ls.Lost()) {
		t.Fatal("a renew answered 404 did not end the lease")
	}
	fence, stop := ls.FenceDeadline(), ls.StopDeadline()
	lr.mu.Lock()
	sent := len(lr.casSent)
	lr.mu.Unlock()
	lr.clock.advance(5 * time.Second)
	lr.api.quiet(t)
	lr.mu.Lock()
	after := len(lr.casSent)
	lr.mu.Unlock()
	if after > sent+1 { // one may have been on its way at the loss
		t.Fatalf("%d heartbeats sent after the loss", after-sent)
	}
	if !ls.FenceDeadline().Equal(fence) || !ls.StopDeadline().Equal(stop) || !stop.Equal(fence) {
		t.Fatalf("after the loss: fence t0+%s stop t0+%s, then fence t0+%s stop t0+%s; want both unchanged and equal",
			fence.Sub(t0), stop.Sub(t0), ls.FenceDeadline().Sub(t0), ls.StopDeadline().Sub(t0))
	}
}

// Release overwrites the escrowed lock ID first, while the lock is still
// ours: once released, a late overwrite could clobber the next holder's.
func TestReleaseClearsTheEscrowFirst(t *testing.T) {
	lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
	ls := lr.acquire(t)
	var order []string
	auto := lr.api.auto
	lr.api.auto = func(c *call) (reply, bool) {
		if c.op == "update" || c.op == "release" {
			order = append(order, c.op)
		}
		return auto(c)
	}
	if err := ls.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Join(order, ",") != "update,release" || lr.escrow["lock_id"] != "" || lr.escrow["released"] != "true" {
		t.Fatalf("requests %v, escrow %v; want the escrow overwritten (no lock ID), then the release", order, lr.escrow)
	}
}

// A restarted gate adopts its previous run's lease in lease mode: the
// heartbeat goes on from the previous run's by check-and-set; one a
// standby sealed (or another holder's) is not ours to take over.
func TestAdoptInLeaseMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  beatRecord
		lost bool
	}{
		{"ours", beatRecord{Seq: 7, Epoch: testFence}, false},
		{"sealed", beatRecord{Seq: 7, Epoch: testFence, SealedBy: "alloc-standby"}, true},
		{"another holder's", beatRecord{Seq: 2, Epoch: testFence + 50}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
			auto := lr.api.auto
			lr.api.auto = func(c *call) (reply, bool) {
				switch {
				case c.op == "read" && c.v.Path == testBeatPath:
					return reply{v: &api.Variable{Path: testBeatPath, ModifyIndex: 90, Items: tc.rec.items()}}, true
				case c.op == "read" && c.v.Path == testPath:
					return reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence}}, true
				}
				return auto(c)
			}
			ls, err := lr.l.Adopt(context.Background(), testID, testFence)
			if tc.lost {
				if err == nil || !errors.Is(err, ErrLost) {
					t.Fatalf("Adopt = %v, want a loss", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			t.Cleanup(func() { ls.stopOnce.Do(func() { close(ls.stop); ls.cancelReq() }) })
			lr.mu.Lock()
			defer lr.mu.Unlock()
			if len(lr.casSent) != 1 || lr.casSent[0].ModifyIndex != 90 {
				t.Fatalf("heartbeats sent %d, want one by check-and-set on the previous run's (index 90)", len(lr.casSent))
			}
			if rec, _ := parseBeat(lr.casSent[0].Items); rec.Seq != 8 || rec.Epoch != testFence {
				t.Fatalf("adopted heartbeat = %+v, want seq 8 in epoch %d", rec, testFence)
			}
			if lr.escrow["lock_id"] != testID {
				t.Fatalf("escrow = %v, want the lock ID", lr.escrow)
			}
		})
	}
}

// PreviousTakenOver holds only for a sealed heartbeat of the previous
// holder found when the heartbeat started.
func TestPreviousTakenOver(t *testing.T) {
	for _, tc := range []struct {
		name, prev string
		rec        beatRecord
		want       bool
	}{
		{"sealed, the previous holder's", "alloc-prev", beatRecord{Seq: 3, Epoch: 40, Alloc: "alloc-prev", SealedBy: "alloc-standby"}, true},
		{"not sealed", "alloc-prev", beatRecord{Seq: 3, Epoch: 40, Alloc: "alloc-prev"}, false},
		{"sealed, another holder's", "alloc-prev", beatRecord{Seq: 3, Epoch: 40, Alloc: "alloc-older", SealedBy: "alloc-standby"}, false},
		{"no previous holder", "", beatRecord{Seq: 3, Epoch: 40, SealedBy: "alloc-standby"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
			auto := lr.api.auto
			lr.api.auto = func(c *call) (reply, bool) {
				if c.op == "read" && c.v.Path == testBeatPath {
					return reply{v: &api.Variable{Path: testBeatPath, ModifyIndex: 90, Items: tc.rec.items()}}, true
				}
				return auto(c)
			}
			ls := lr.acquire(t)
			ls.Previous.AllocID = tc.prev
			if got := ls.PreviousTakenOver(); got != tc.want {
				t.Fatalf("PreviousTakenOver = %v, want %v", got, tc.want)
			}
		})
	}
}

// The record is in milliseconds: what the standby reads back is rounded
// the safe way, so that its wait is never below the holder's D + K +
// TakeoverMargin, and its cutoff never later than the holder's TTL allows.
func TestBeatRecordRoundsTowardSafety(t *testing.T) {
	sub := 500 * time.Microsecond
	rec := beatRecord{Seq: 1, Epoch: 9, Interval: time.Second + sub, Fence: 6*time.Second + sub,
		KillGrace: 2*time.Second + sub, RenewAge: 300*time.Millisecond + sub, TTL: 10*time.Second + sub}
	got, ok := parseBeat(rec.items())
	if !ok {
		t.Fatal("the record does not parse back")
	}
	if got.Fence < rec.Fence || got.KillGrace < rec.KillGrace || got.RenewAge < rec.RenewAge {
		t.Errorf("read back D %s, K %s, renew age %s; want at least %s, %s, %s",
			got.Fence, got.KillGrace, got.RenewAge, rec.Fence, rec.KillGrace, rec.RenewAge)
	}
	if got.TTL > rec.TTL || got.Interval > rec.Interval {
		t.Errorf("read back TTL %s, interval %s; want at most %s, %s", got.TTL, got.Interval, rec.TTL, rec.Interval)
	}
}

// A lease that is no longer ours (a standby sealed its heartbeat, or it
// fenced itself) leaves the escrow alone on release: by then the next
// holder may have escrowed its own lock ID there, and overwriting it would
// turn that holder's fast takeover off.
func TestReleaseOfALostLeaseLeavesTheEscrow(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(lr *leaseRig)
	}{
		{"sealed by a standby", func(lr *leaseRig) { lr.sealedByStandby(t) }},
		{"fenced: no heartbeat acknowledged for D", func(lr *leaseRig) {
			lr.mu.Lock()
			lr.beats = false
			lr.mu.Unlock()
			lr.clock.advanceTo(t, t0.Add(DefaultHeartbeat.Fence+time.Second))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLeaseRig(t, 20*time.Second, DefaultHeartbeat)
			ls := lr.acquire(t)
			tc.lose(lr)
			if !closedWithin(ls.Lost()) {
				t.Fatal("the lease was not lost")
			}
			var escrowWrites int
			auto := lr.api.auto
			lr.api.auto = func(c *call) (reply, bool) {
				if c.op == "update" {
					escrowWrites++
				}
				return auto(c)
			}
			_ = ls.Release(context.Background())
			if escrowWrites != 0 || lr.escrow["lock_id"] != testID {
				t.Fatalf("%d escrow writes on the release of a lost lease (escrow %v); want none", escrowWrites, lr.escrow)
			}
		})
	}
}

// The standby's release cutoff rests on the record's renew age and, where
// the lock's own TTL is hidden (not a management token), its TTL: both
// are the writer's word. A record that says renew_age 0 and ttl 24h (as a
// workload that got the holder's token could write) moves the cutoff no
// later than the standby's own interval and TTL allow.
func TestTakeoverDistrustsTheRecordsTimings(t *testing.T) {
	forged := func(ms int, index uint64) beatObservation {
		o := obs(ms, index)
		o.rec.RenewAge, o.rec.TTL = 0, 24*time.Hour
		return o
	}
	c := &takeoverCount{own: DefaultHeartbeat.Takeover(), minRenewAge: DefaultHeartbeat.Interval}
	for _, o := range []beatObservation{forged(100, 1), forged(850, 1), forged(1100, 2), forged(1850, 2), forged(2100, 3), forged(11200, 3)} {
		c.observe(o)
	}
	v := c.decide(t0.Add(11300 * time.Millisecond))
	if !v.ready {
		t.Fatalf("not ready: %s", v.why)
	}
	if want := t0.Add(850*time.Millisecond - DefaultHeartbeat.Interval); v.renewAfter.After(want) {
		t.Errorf("renew lower bound t0%+v, want no later than t0%+v (the standby's interval before the read)", v.renewAfter.Sub(t0), want.Sub(t0))
	}

	// The lock's state hidden: the cutoff by the standby's own TTL (10s):
	// t0 + 2×10s − 1s − 2.5s = t0 + 16.5s has passed.
	clk := newFakeClock()
	clk.now = t0.Add(17 * time.Second)
	f := newFakeAPI(clk)
	released := false
	f.auto = func(cl *call) (reply, bool) {
		switch {
		case cl.op == "read" && cl.v.Path == testPath:
			return reply{v: &api.Variable{Path: testPath, ModifyIndex: testFence}}, true
		case cl.op == "read":
			return reply{v: &api.Variable{Items: map[string]string{"lock_id": testID, "fence": strconv.Itoa(testFence)}}}, true
		case cl.op == "cas":
			return reply{v: &api.Variable{}}, true
		case cl.op == "release":
			released = true
			return reply{}, true
		}
		return reply{err: errors.New("unexpected")}, true
	}
	cfg, err := Config{Path: testPath, Timing: Timing{TTL: 10 * time.Second, LockDelay: time.Second}}.prepared()
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(cfg, nil, f, clk)
	l.cas = f
	hb := DefaultHeartbeat
	hb.Path, hb.EscrowPath = testBeatPath, testEscrowPath
	verdict := takeoverVerdict{ready: true, index: 103, rec: beatRecord{Seq: 3, Epoch: testFence, TTL: 24 * time.Hour}, renewAfter: t0}
	err = l.takeOver(context.Background(), TakeoverOptions{Heartbeat: hb, SealedBy: "alloc-standby"}, verdict)
	if err == nil || released || !strings.Contains(err.Error(), "left to the server's expiry") {
		t.Fatalf("takeOver = %v (released %v), want the lock left to the server's expiry", err, released)
	}
}
