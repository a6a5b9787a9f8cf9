package bench

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// semaphoreVariants are those of the semaphore scenario: the single lock's
// (b) and (c), each beside the same supervisor holding one slot of a
// semaphore of SlotHolders.
var semaphoreVariants = []string{VariantLock, VariantLockSlot, VariantDriver, VariantDriverSlot}

// baseVariant is the single-lock variant whose supervisor a slot variant
// runs.
func baseVariant(v string) string {
	switch v {
	case VariantLockSlot:
		return VariantLock
	case VariantDriverSlot:
		return VariantDriver
	}
	return v
}

// semaphore measures a slot's graceful handover and crash takeover beside
// the single lock's, in the same run (section TitleSemaphore): the
// handovers one variant after another, the crashes of a run concurrently,
// as in sections 1 and 2.
func (b *bench) semaphore(t *testing.T) {
	gap, call, over := map[string]*Row{}, map[string]*Row{}, map[string]*Row{}
	take, gone, crashOver := map[string]*Row{}, map[string]*Row{}, map[string]*Row{}
	for _, v := range semaphoreVariants {
		gap[v] = b.row(TitleSemaphore, "holder stopped: old workload exit → standby's workload start (on the freed slot)", v, Seconds, AggStats, handoverGoal())
	}
	for _, v := range semaphoreVariants {
		call[v] = b.row(TitleSemaphore, "holder stopped: stop call → standby's workload start", v, Seconds, AggStats, nil)
	}
	for _, v := range semaphoreVariants {
		over[v] = b.row(TitleSemaphore, "holder stopped: runs where old and new workload overlapped", v, Count, AggSum, nil)
	}
	for _, v := range semaphoreVariants {
		take[v] = b.row(TitleSemaphore, "SIGKILL to supervisor → new workload start (on the freed slot)", v, Seconds, AggStats, crashGoal(baseVariant(v)))
	}
	for _, v := range semaphoreVariants {
		gone[v] = b.row(TitleSemaphore, "SIGKILL to supervisor → old workload gone", v, Seconds, AggStats, nil)
		gone[v].NoRatio, gone[v].Note = true, "pidfd"
	}
	for _, v := range semaphoreVariants {
		crashOver[v] = b.row(TitleSemaphore, "crash: runs where the old workload was alive at the new start", v, Count, AggSum, overlapGoal(v))
	}
	// One variant at a time: these are sub-second gaps on 2 cores.
	for _, v := range semaphoreVariants {
		t.Run("handover/"+slug(v), func(t *testing.T) {
			rows := handoverRows{gap[v], call[v], over[v]}
			if isSlot(v) {
				b.slotHandover(t, v, rows)
			} else {
				b.handoverStandby(t, v, rows)
			}
		})
	}
	for run := 1; run <= b.cfg.Runs; run++ {
		var names []string
		var fns []func(*testing.T)
		for _, v := range semaphoreVariants {
			names = append(names, fmt.Sprintf("crash/run%d/%s", run, slug(v)))
			fns = append(fns, func(t *testing.T) {
				if isSlot(v) {
					b.slotCrashRun(t, v, run, take[v], gone[v], crashOver[v])
				} else {
					b.crashRun(t, v, run, take[v], gone[v], crashOver[v])
				}
			})
		}
		runConcurrently(t, names, fns)
	}
}

// slotPath is slot i of the semaphore at j.path.
func slotPath(j *job, i int) string { return j.path + "/slot-" + strconv.Itoa(i) }

// slotHandover is handoverStandby for a slot: two holder jobs of one
// allocation each hold the two slots; each run adds a standby job (which
// finds both slots held and waits on both), stops one holder's job (the
// slots in turn), and measures until the standby's workload starts on the
// freed slot; the standby's job is that slot's holder in later runs.
func (b *bench) slotHandover(t *testing.T, v string, rows handoverRows) {
	type holder struct {
		j *job
		r harness.Record
	}
	first := b.newJob("slot-handover", v, 1)
	first.failFast = true
	jobs := []*job{first}
	defer func() {
		for _, j := range jobs {
			b.stopJob(t, j, 0)
		}
	}()
	b.register(t, first)
	r0 := waitStart(t, first.record, 0, 90*time.Second)
	second := b.sibling(first, "slot-handover", 1)
	jobs = append(jobs, second)
	b.register(t, second)
	r1 := harness.WaitRecord(t, first.record, 90*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Instance != r0.Instance
	})
	if r0.LockPath == r1.LockPath {
		t.Fatalf("both holders run on %s", r0.LockPath)
	}
	holders := []holder{{first, r0}, {second, r1}}
	for run := 1; run <= b.cfg.Runs; run++ {
		standbyJob := b.sibling(first, "slot-handover-standby", 1)
		jobs = append(jobs, standbyJob)
		b.register(t, standbyJob)
		b.waitStandbys(t, standbyJob, "", 1, 1500*time.Millisecond, 90*time.Second)
		i := (run - 1) % len(holders)
		h := holders[i]
		next, g, call := b.handoverOnce(t, h.j, h.r, b.stopCall(t, h.j.id))
		rows.add(g, call)
		b.progress("semaphore handover %s run %d/%d: %s's holder's job stopped: old exit → standby's start %s (stop call → start %s)",
			v, run, b.cfg.Runs, h.r.LockPath, fmtS(g), fmtS(call))
		if next.LockPath != h.r.LockPath {
			t.Errorf("the standby started on %s, want the freed slot %s", next.LockPath, h.r.LockPath)
		}
		if allocs, err := b.a.Allocs(standbyJob.id); err != nil || len(allocs) != 1 || allocs[0].ID != next.AllocID {
			t.Errorf("the new holder is alloc %s, want the standby job's allocation", next.AllocID)
		}
		holders[i] = holder{standbyJob, next}
	}
}

// slotCrashRun is crashRun for a slot: a job of SlotHolders + 1
// allocations (no restarts, no rescheduling) holds both slots and has one
// standby; the supervisor of one slot's holder (the slots in turn) gets
// SIGKILL, and the takeover ends at the standby's workload start on that
// slot.
func (b *bench) slotCrashRun(t *testing.T, v string, run int, take, gone, over *Row) {
	j := b.newJob("slot-crash", v, SlotHolders+1)
	j.failFast = true // the killed allocation must not come back and compete
	b.register(t, j)
	held := map[string]harness.Record{}
	harness.WaitRecord(t, j.record, 90*time.Second, func(r harness.Record) bool {
		if r.Event == harness.EventStart && r.Role == harness.RoleMain {
			held[r.LockPath] = r
		}
		return len(held) == SlotHolders
	})
	first, ok := held[slotPath(j, run%SlotHolders)]
	if !ok {
		t.Fatalf("no holder of %s among %v", slotPath(j, run%SlotHolders), held)
	}
	// The other holder and the standby.
	b.waitStandbys(t, j, first.AllocID, SlotHolders, 1500*time.Millisecond, 90*time.Second)
	sup := b.supervisorPID(t, j, first.AllocID)
	time.Sleep(randomPhase(TTL / 2))

	next, state, overlap := b.killSupervisor(t, j, first, sup, take, gone, over)
	if next.LockPath != first.LockPath {
		t.Errorf("the standby started on %s, want the freed slot %s", next.LockPath, first.LockPath)
	}
	b.progress("semaphore crash %s run %d/%d: %s taken over %s after the kill, old workload %s, overlap %t",
		v, run, b.cfg.Runs, first.LockPath, fmtS(next.Mono-next.killAt), state, overlap)
	if left := b.stopJob(t, j, 30*time.Second); left > 0 {
		b.rep.Note("%s, semaphore crash run %d: %d process(es) of the job were still alive 30 s after the job was purged; the bench SIGKILLed them.", v, run, left)
	}
	if overlap {
		b.rep.Note("%s, semaphore crash run %d: the old workload (pid %d) was still running when the new holder's workload started on %s (%s after the kill; old workload %s).",
			v, run, first.PID, first.LockPath, fmtS(next.Mono-next.killAt), state)
	}
}
