package lockclient_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/testkey"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

const semPrefix = "nomad/jobs/web/sem"

func semConfig(n, prefer int, alloc string) lockclient.Config {
	return lockclient.Config{Path: semPrefix, Timing: locktest.Timing(), Holders: n, PreferSlot: prefer,
		Holder: lockclient.Holder{AllocID: alloc}}
}

func acquireWithin(t *testing.T, l *lockclient.Locker, opts lockclient.AcquireOptions) *lockclient.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, opts)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return lease
}

func release(t *testing.T, lease *lockclient.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release slot %d: %v", lease.Slot, err)
	}
}

// occupancy counts the holders per slot, as the contenders report them.
type occupancy struct {
	mu        sync.Mutex
	slots     map[int]int
	total     int
	maxTotal  int
	violation string
}

func (o *occupancy) enter(slot, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.slots[slot]++
	o.total++
	o.maxTotal = max(o.maxTotal, o.total)
	switch {
	case slot < 0 || slot >= n:
		o.violation = "a lease of slot out of range"
	case o.slots[slot] > 1:
		o.violation = "two holders of one slot"
	case o.total > n:
		o.violation = "more than N holders"
	}
}

func (o *occupancy) leave(slot int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.slots[slot]--
	o.total--
}

func TestSemaphoreNeverMoreThanNHoldersNorTwoOnOneSlot(t *testing.T) {
	const n, contenders, rounds = 2, 5, 6
	vars := locktest.NewVars()
	occ := &occupancy{slots: map[int]int{}}
	var wg sync.WaitGroup
	for c := range contenders {
		l := vars.Locker(t, semConfig(n, c, "alloc-"+string(rune('a'+c))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				lease, err := l.Acquire(ctx, lockclient.AcquireOptions{})
				cancel()
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if want := lockclient.SlotPath(semPrefix, lease.Slot); lease.Path() != want {
					t.Errorf("lease of slot %d holds %s, want %s", lease.Slot, lease.Path(), want)
				}
				occ.enter(lease.Slot, n)
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				occ.leave(lease.Slot)
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := lease.Release(rctx); err != nil {
					t.Errorf("release: %v", err)
				}
				rcancel()
			}
		}()
	}
	wg.Wait()
	if occ.violation != "" {
		t.Fatal(occ.violation)
	}
	if occ.maxTotal != n {
		t.Errorf("at most %d holders at once, want %d: the contenders did not fill the semaphore", occ.maxTotal, n)
	}
}

func TestSemaphorePrefersTheSlotOfItsAllocationIndex(t *testing.T) {
	vars := locktest.NewVars()
	// Index 4 of N = 3: slot 1.
	lease := acquireWithin(t, vars.Locker(t, semConfig(3, 4, "alloc-4")), lockclient.AcquireOptions{})
	if lease.Slot != 1 || lease.Holders != 3 {
		t.Fatalf("took slot %d of %d, want slot 1 of 3", lease.Slot, lease.Holders)
	}
	// Index 1 finds its slot taken and takes the next free one.
	other := acquireWithin(t, vars.Locker(t, semConfig(3, 1, "alloc-1")), lockclient.AcquireOptions{})
	if other.Slot != 2 {
		t.Errorf("with its slot 1 held, took slot %d, want 2 (the next free)", other.Slot)
	}
	items := vars.Server(lockclient.SlotPath(semPrefix, 2)).Items()
	if items["semaphore_holders"] != "3" || items["semaphore_slot"] != "2" || items["holder_alloc_id"] != "alloc-1" {
		t.Errorf("slot 2's record = %v, want N 3, slot 2, alloc-1", items)
	}
	release(t, lease)
	// A replacement of index 4 re-takes its own slot once it is free.
	again := acquireWithin(t, vars.Locker(t, semConfig(3, 4, "alloc-4b")), lockclient.AcquireOptions{})
	if again.Slot != 1 {
		t.Errorf("the replacement took slot %d, want its own slot 1", again.Slot)
	}
}

func TestSemaphoreRefusesAContenderAskingAnotherN(t *testing.T) {
	for _, asked := range []int{1, 3} {
		vars := locktest.NewVars()
		acquireWithin(t, vars.Locker(t, semConfig(2, 0, "first")), lockclient.AcquireOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Index 2 prefers slot 2 of 3, which the semaphore of 2 never wrote.
		_, err := vars.Locker(t, semConfig(asked, 2, "other")).Acquire(ctx, lockclient.AcquireOptions{})
		cancel()
		var ce *lockclient.ConfigError
		if !errors.Is(err, lockclient.ErrHoldersMismatch) || !errors.As(err, &ce) {
			t.Fatalf("N %d against a semaphore of 2: err = %v, want a ConfigError wrapping ErrHoldersMismatch", asked, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "has 2 holders") || !strings.Contains(msg, "asks for "+string(rune('0'+asked))) {
			t.Errorf("the refusal does not name both values: %s", msg)
		}
		if n := vars.Calls(locktest.OpAcquire); n != 1 {
			t.Errorf("%d acquires, want only the first holder's: the refused contender must take nothing", n)
		}
	}
}

func TestSemaphoreWaiterTakesOnlyTheSlotThatWasFreed(t *testing.T) {
	vars := locktest.NewVars()
	a := acquireWithin(t, vars.Locker(t, semConfig(2, 0, "a")), lockclient.AcquireOptions{})
	b := acquireWithin(t, vars.Locker(t, semConfig(2, 1, "b")), lockclient.AcquireOptions{})

	got := make(chan *lockclient.Lease, 1)
	waiter := vars.Locker(t, semConfig(2, 0, "c"))
	go func() {
		lease, err := waiter.Acquire(context.Background(), lockclient.AcquireOptions{})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- lease
	}()
	// The waiter tries both slots once, then parks: while nothing is
	// released it sends no acquire, however many blocking waits pass.
	waitFor(t, "the waiter's tries of both slots", func() bool { return vars.Calls(locktest.OpRefused) == 2 })
	reads := vars.Calls(locktest.OpRead)
	waitFor(t, "blocking waits to pass", func() bool { return vars.Calls(locktest.OpRead) >= reads+6 })
	if n := vars.Calls(locktest.OpAcquire); n != 4 {
		t.Fatalf("%d acquires while both slots stayed held, want 4 (2 grants, 2 refusals)", n)
	}
	release(t, b)
	var lease *lockclient.Lease
	select {
	case lease = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the freed slot")
	}
	if lease.Slot != 1 {
		t.Errorf("the waiter took slot %d, want the freed slot 1", lease.Slot)
	}
	if n := vars.Server(lockclient.SlotPath(semPrefix, 0)).Calls(locktest.OpAcquire); n != 2 {
		t.Errorf("%d acquires of the held slot 0, want 2: the waiter tried a slot that did not change", n)
	}
	_ = a
}

func TestSemaphoreWaiterHonoursTheLockDelayOfAnExpiredSlot(t *testing.T) {
	vars := locktest.NewVars()
	acquireWithin(t, vars.Locker(t, semConfig(1, 0, "a")), lockclient.AcquireOptions{})
	slot := vars.Server(lockclient.SlotPath(semPrefix, 0))
	got := make(chan time.Time, 1)
	go func() {
		if _, err := vars.Locker(t, semConfig(1, 0, "b")).Acquire(context.Background(), lockclient.AcquireOptions{}); err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- time.Now()
	}()
	waitFor(t, "the waiter's first try", func() bool { return slot.Calls(locktest.OpRefused) == 1 })
	expired := time.Now()
	slot.Expire() // lock delay 100ms (locktest.Timing)
	select {
	case at := <-got:
		if at.Sub(expired) < 100*time.Millisecond {
			t.Errorf("acquired %s after the expiry, within the lock delay", at.Sub(expired))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the expired slot")
	}
}

func TestSemaphoreTryOnceWhenAllSlotsAreHeld(t *testing.T) {
	vars := locktest.NewVars()
	acquireWithin(t, vars.Locker(t, semConfig(1, 0, "a")), lockclient.AcquireOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := vars.Locker(t, semConfig(1, 0, "b")).Acquire(ctx, lockclient.AcquireOptions{TryOnce: true})
	if !errors.Is(err, lockclient.ErrNotAcquired) {
		t.Fatalf("err = %v, want ErrNotAcquired", err)
	}
}

func TestSemaphoreHoldersOutOfRange(t *testing.T) {
	for _, n := range []int{-1, lockclient.MaxHolders + 1} {
		_, err := lockclient.NewWithLockAPI(testkey.Get(), semConfig(n, 0, "a"), locktest.NewVars())
		if err == nil {
			t.Errorf("holders = %d accepted", n)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSemaphorePermissionErrorGrantsEverySlot(t *testing.T) {
	vars := locktest.NewVars()
	vars.Server(lockclient.SlotPath(semPrefix, 0)).FailAcquire(locktest.Error(403, "Permission denied"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := vars.Locker(t, semConfig(2, 0, "a")).Acquire(ctx, lockclient.AcquireOptions{})
	var pe *lockclient.PermissionError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `path "`+semPrefix+`/*"`) {
		t.Fatalf("err = %v, want a PermissionError whose policy grants %s/*", err, semPrefix)
	}
}

// A restarted gate takes over the slot its previous run holds, by that
// slot's path; a path that is no slot of the semaphore, or a slot no
// longer held under the lock ID, is not taken over.
func TestSemaphoreAdoptPathTakesOverTheSlotHeld(t *testing.T) {
	vars := locktest.NewVars()
	held := acquireWithin(t, vars.Locker(t, semConfig(3, 2, "alloc-2")), lockclient.AcquireOptions{})
	restarted := vars.Locker(t, semConfig(3, 2, "alloc-2"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := restarted.AdoptPath(ctx, held.Path(), held.LockID(), held.Fence)
	if err != nil {
		t.Fatalf("adopt slot %s: %v", held.Path(), err)
	}
	if lease.Slot != held.Slot || lease.Holders != 3 || lease.Path() != held.Path() || lease.Fence != held.Fence {
		t.Errorf("adopted slot %d of %d at %s fence %d, want slot %d of 3 at %s fence %d",
			lease.Slot, lease.Holders, lease.Path(), lease.Fence, held.Slot, held.Path(), held.Fence)
	}
	for _, path := range []string{semPrefix, lockclient.SlotPath(semPrefix, 3), ""} {
		if _, err := restarted.AdoptPath(ctx, path, held.LockID(), held.Fence); !errors.Is(err, lockclient.ErrLost) {
			t.Errorf("adopt %q: %v, want ErrLost (no slot of the semaphore)", path, err)
		}
	}
	other := lockclient.SlotPath(semPrefix, (held.Slot+1)%3)
	if _, err := restarted.AdoptPath(ctx, other, held.LockID(), held.Fence); !errors.Is(err, lockclient.ErrLost) {
		t.Errorf("adopt the free slot %s under another slot's lock ID: %v, want ErrLost", other, err)
	}
}

// A semaphore contender gives way as a single lock's does (a rolling
// update's Defer): a free slot is taken only once the grace is up, and
// never while Defer says hold.
func TestSemaphoreDeferGivesWayBeforeTakingAFreeSlot(t *testing.T) {
	vars := locktest.NewVars()
	const grace = 600 * time.Millisecond
	var asked atomic.Bool
	start := time.Now()
	lease := acquireWithin(t, vars.Locker(t, semConfig(2, 0, "alloc-0")), lockclient.AcquireOptions{
		Defer: func(context.Context, lockclient.Holder) (time.Duration, bool) { asked.Store(true); return grace, false }})
	if !asked.Load() {
		t.Error("took a free slot without asking Defer")
	}
	if took := time.Since(start); took < grace {
		t.Errorf("took slot %d after %s, before the grace of %s", lease.Slot, took, grace)
	}

	var mu sync.Mutex
	hold := true
	got := make(chan *lockclient.Lease, 1)
	go func() {
		got <- acquireWithin(t, vars.Locker(t, semConfig(2, 1, "alloc-1")), lockclient.AcquireOptions{
			Defer: func(context.Context, lockclient.Holder) (time.Duration, bool) {
				mu.Lock()
				defer mu.Unlock()
				return 0, hold
			}})
	}()
	select {
	case l := <-got:
		t.Fatalf("took slot %d while Defer said hold", l.Slot)
	case <-time.After(time.Second):
	}
	mu.Lock()
	hold = false
	mu.Unlock()
	select {
	case l := <-got:
		if l.Slot == lease.Slot {
			t.Errorf("took slot %d, which is held", l.Slot)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the free slot was not taken within 5s once Defer let go")
	}
}

// Two contenders start at once on a prefix nobody ever wrote, asking
// different N: without the semaphore's record both would find every slot
// free and get in. The record is created by check-and-set, so exactly one
// gets in and the other is refused, having taken nothing.
func TestSemaphoreFirstContendersAskingDifferentNOneIsRefused(t *testing.T) {
	for round := range 30 {
		vars := locktest.NewVars()
		start := make(chan struct{})
		type result struct {
			n     int
			lease *lockclient.Lease
			err   error
		}
		results := make(chan result, 2)
		for i, n := range []int{2, 3} {
			l := vars.Locker(t, semConfig(n, i, "alloc-"+string(rune('a'+i))))
			go func() {
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				lease, err := l.Acquire(ctx, lockclient.AcquireOptions{})
				results <- result{n, lease, err}
			}()
		}
		close(start)
		var in, refused []result
		for range 2 {
			r := <-results
			switch {
			case r.err == nil:
				in = append(in, r)
			case errors.Is(r.err, lockclient.ErrHoldersMismatch):
				refused = append(refused, r)
			default:
				t.Fatalf("round %d: N %d: %v", round, r.n, r.err)
			}
		}
		if len(in) != 1 || len(refused) != 1 {
			t.Fatalf("round %d: %d contenders got in and %d were refused, want one each", round, len(in), len(refused))
		}
		recorded := vars.Server(lockclient.SemaphorePath(semPrefix)).Items()["semaphore_holders"]
		if recorded != strconv.Itoa(in[0].n) {
			t.Errorf("round %d: the record says %q holders, but the contender asking %d got in", round, recorded, in[0].n)
		}
		if msg := refused[0].err.Error(); !strings.Contains(msg, "has "+recorded+" holders") || !strings.Contains(msg, "asks for "+strconv.Itoa(refused[0].n)) {
			t.Errorf("round %d: the refusal does not name both values: %s", round, msg)
		}
		if n := vars.Calls(locktest.OpAcquire); n != 1 {
			t.Errorf("round %d: %d acquires, want only the one that got in", round, n)
		}
	}
}

// The record is written once, by the first contender; later contenders
// read it, and one asking another N is refused though no slot was ever
// written. A variable at the record's path that records no N is refused.
func TestSemaphoreRecord(t *testing.T) {
	vars := locktest.NewVars()
	rec := vars.Server(lockclient.SemaphorePath(semPrefix))
	first := vars.Locker(t, semConfig(3, 0, "a"))
	lease := acquireWithin(t, first, lockclient.AcquireOptions{})
	if got := rec.Items(); got["semaphore_holders"] != "3" || len(got) != 1 {
		t.Errorf("the record = %v, want semaphore_holders 3", got)
	}
	acquireWithin(t, vars.Locker(t, semConfig(3, 1, "b")), lockclient.AcquireOptions{})
	if n := rec.Calls(locktest.OpCreate); n != 1 {
		t.Errorf("%d creates of the record, want 1 (the first contender's)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := first.RecordedHolders(ctx); n != 3 || err != nil {
		t.Errorf("RecordedHolders = %d, %v; want 3", n, err)
	}
	release(t, lease)

	// A semaphore whose slots were never written, only its record.
	vars = locktest.NewVars()
	vars.Server(lockclient.SemaphorePath(semPrefix)).Write(map[string]string{"semaphore_holders": "4"})
	_, err := vars.Locker(t, semConfig(2, 0, "c")).Acquire(ctx, lockclient.AcquireOptions{})
	if !errors.Is(err, lockclient.ErrHoldersMismatch) || !strings.Contains(err.Error(), "has 4 holders (recorded in "+lockclient.SemaphorePath(semPrefix)+")") {
		t.Errorf("N 2 against a record of 4: err = %v, want a refusal naming the record", err)
	}

	vars = locktest.NewVars()
	vars.Server(lockclient.SemaphorePath(semPrefix)).Write(map[string]string{"owner": "someone else"})
	_, err = vars.Locker(t, semConfig(2, 0, "d")).Acquire(ctx, lockclient.AcquireOptions{})
	var ce *lockclient.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "records no semaphore_holders") {
		t.Errorf("a foreign variable at the record's path: err = %v, want a ConfigError naming it", err)
	}
	if n := vars.Calls(locktest.OpAcquire); n != 0 {
		t.Errorf("%d acquires after a refusal, want 0", n)
	}
}

// A token that may not write the record gets the policy of every slot.
func TestSemaphoreRecordPermissionErrorGrantsThePrefix(t *testing.T) {
	vars := locktest.NewVars()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := vars.Locker(t, semConfig(2, 0, "a"))
	vars.Server(lockclient.SemaphorePath(semPrefix)).FailCreate(locktest.Error(403, "Permission denied"))
	_, err := l.Acquire(ctx, lockclient.AcquireOptions{})
	var pe *lockclient.PermissionError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `path "`+semPrefix+`/*"`) {
		t.Fatalf("err = %v, want a PermissionError whose policy grants %s/*", err, semPrefix)
	}
}
