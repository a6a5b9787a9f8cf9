package bench

import (
	"cmp"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// lockSample is one read of the lock variable.
type lockSample struct {
	mono   int64
	id     string // lock ID; "" when free
	holder string // holder_alloc_id item ((b) and (c) write it)
}

// timelines runs one handover-then-crash per variant, concurrently, for the
// picture.
func (b *bench) timelines(t *testing.T) {
	var names []string
	var fns []func(*testing.T)
	for _, v := range lockVariants {
		names = append(names, slug(v))
		fns = append(fns, func(t *testing.T) { b.timelineRun(t, v) })
	}
	runConcurrently(t, names, fns)
}

// timelineRun: a job of three allocations. Two seconds in, the holder's
// allocation is stopped (handover); three seconds after the next workload
// starts, that holder's supervisor gets SIGKILL (crash); three seconds after
// the third workload starts, the timeline ends. The lock variable is read
// every 50 ms and the workloads are sampled every 20 ms throughout.
func (b *bench) timelineRun(t *testing.T, v string) {
	// The holder runs alone in its job, two standbys in another job on the
	// same lock: stopping the holder's job leaves no replacement to compete.
	// No restarts or rescheduling: the killed allocation stays dead.
	hj := b.newJob("timeline", v, 1)
	hj.failFast = true
	sj := b.sibling(hj, "timeline-standby", 2)
	b.register(t, hj)
	first := waitStart(t, hj.record, 0, 90*time.Second)
	b.register(t, sj)
	b.waitStandbys(t, sj, "", 2, 1500*time.Millisecond, 90*time.Second)
	j := hj

	origin := harness.MonoNow()
	stopPoll, pollDone := make(chan struct{}), make(chan struct{})
	var samples []lockSample
	go func() {
		defer close(pollDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			vr, _, err := b.a.API().Variables().Peek(j.path, nil)
			if err == nil {
				s := lockSample{mono: harness.MonoNow()}
				if vr != nil && vr.Lock != nil {
					s.id, s.holder = vr.Lock.ID, vr.Items["holder_alloc_id"]
				}
				samples = append(samples, s)
			}
			select {
			case <-stopPoll:
				return
			case <-tick.C:
			}
		}
	}()
	sampler := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	defer func() {
		select {
		case <-pollDone:
		default:
			close(stopPoll)
			<-pollDone
		}
	}()

	// Pauses that let the picture show each state; shorter in quick mode.
	pause := func(d time.Duration) {
		if b.cfg.Quick {
			d /= 2
		}
		time.Sleep(d)
	}
	pause(2 * time.Second)
	exited := b.watchWorkloadExit(t, j, first)
	stopAt := harness.MonoNow()
	if _, _, err := b.a.API().Jobs().Deregister(hj.id, false, nil); err != nil {
		t.Fatalf("stop job %s: %v", hj.id, err)
	}
	second := waitStart(t, j.record, stopAt, 60*time.Second)
	firstEnd := waitExit(t, exited, first, 30*time.Second)
	pause(3 * time.Second)
	sup := b.supervisorPID(t, j, second.AllocID)
	killAt := harness.MonoNow()
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL supervisor %d: %v", sup, err)
	}
	third := waitStart(t, j.record, killAt, 90*time.Second)
	pause(3 * time.Second)
	endAt := harness.MonoNow()
	close(stopPoll)
	<-pollDone
	sum := sampler.Stop()

	allocs, err := b.a.Allocs(hj.id)
	if err != nil {
		t.Fatal(err)
	}
	more, err := b.a.Allocs(sj.id)
	if err != nil {
		t.Fatal(err)
	}
	allocs = append(allocs, more...)
	recs, err := harness.ReadRecords(j.record)
	if err != nil {
		t.Fatal(err)
	}
	ivs := harness.Intervals(recs, sum.GoneByPID())
	tl := buildTimeline(v, origin, endAt, allocs, ivs, samples, second.AllocID, killAt, []Mark{
		{At: secondsOf(stopAt - origin), Label: "stop the job of " + short(first.AllocID)},
		{At: secondsOf(killAt - origin), Label: "SIGKILL supervisor of " + short(second.AllocID)},
	})
	tl.Caption = fmt.Sprintf("handover: old exit → new start %s;  crash: SIGKILL → new start %s",
		fmtS(second.Mono-firstEnd), fmtS(third.Mono-killAt))
	if o := harness.Overlaps(ivs); len(o) > 0 {
		tl.Caption += fmt.Sprintf(";  %d OVERLAP(S)", len(o))
	}
	b.rep.AddTimeline(tl)
	b.progress("timeline %s: %s", v, tl.Caption)
	b.stopJob(t, hj, 0)
	if left := b.stopJob(t, sj, 30*time.Second); left > 0 {
		b.rep.Note("%s, timeline run: %d process(es) of the job were still alive 30 s after the job was purged; the bench SIGKILLed them.", v, left)
	}
}

// buildTimeline turns what a timeline run observed into lanes and spans,
// in seconds from origin. killed is the allocation whose supervisor got
// SIGKILL at killAt: the lock it still holds afterwards is drawn as held
// for a dead holder.
func buildTimeline(title string, origin, end int64, allocs []*api.AllocationListStub, ivs []harness.Interval,
	samples []lockSample, killed string, killAt int64, marks []Mark) Timeline {
	sec := func(mono int64) float64 { return secondsOf(max(mono, origin) - origin) }
	wallToMono := harness.MonoNow() - time.Now().UnixNano()

	// Lanes: allocations whose workload ran, in the order they first ran,
	// then the others in the order their tasks started.
	firstRun := map[string]int64{}
	for _, iv := range ivs {
		if f, ok := firstRun[iv.AllocID]; !ok || iv.Start < f {
			firstRun[iv.AllocID] = iv.Start
		}
	}
	allocs = slices.Clone(allocs)
	key := func(al *api.AllocationListStub) (int, int64) {
		if f, ok := firstRun[al.ID]; ok {
			return 0, f
		}
		if ts := al.TaskStates[taskName]; ts != nil && !ts.StartedAt.IsZero() {
			return 1, ts.StartedAt.UnixNano()
		}
		return 2, int64(al.CreateIndex)
	}
	slices.SortStableFunc(allocs, func(a, b *api.AllocationListStub) int {
		ga, ka := key(a)
		gb, kb := key(b)
		if ga != gb {
			return ga - gb
		}
		return cmp.Compare(ka, kb)
	})
	tl := Timeline{Title: title, Lanes: []string{"lock"}, Marks: marks, End: secondsOf(end - origin)}
	lane := map[string]int{}
	for i, al := range allocs {
		lane[al.ID] = i + 1
		tl.Lanes = append(tl.Lanes, "alloc "+short(al.ID))
	}
	// Waiting: the task runs (its supervisor waits) until its workload starts.
	for _, al := range allocs {
		ts := al.TaskStates[taskName]
		if ts == nil || ts.StartedAt.IsZero() {
			continue
		}
		from, to := ts.StartedAt.UnixNano()+wallToMono, end
		if !ts.FinishedAt.IsZero() {
			to = ts.FinishedAt.UnixNano() + wallToMono
		}
		for _, iv := range ivs {
			if iv.AllocID == al.ID {
				to = min(to, iv.Start)
			}
		}
		if to > origin {
			tl.Spans = append(tl.Spans, Span{Lane: lane[al.ID], From: sec(from), To: sec(to), Kind: Waiting, Color: lane[al.ID] - 1})
		}
	}
	for _, iv := range ivs {
		l, ok := lane[iv.AllocID]
		if !ok {
			continue
		}
		to := end
		if iv.Ended {
			to = iv.End
		}
		if to > origin {
			tl.Spans = append(tl.Spans, Span{Lane: l, From: sec(iv.Start), To: sec(to), Kind: Running, Color: l - 1})
		}
	}
	// The lock lane: runs of equal lock IDs.
	type seg struct {
		from, to   int64
		id, holder string
	}
	var segs []seg
	for _, s := range samples {
		if n := len(segs); n > 0 && segs[n-1].id == s.id {
			segs[n-1].to = s.mono
			continue
		}
		if n := len(segs); n > 0 {
			segs[n-1].to = s.mono
		}
		segs = append(segs, seg{from: s.mono, to: s.mono, id: s.id, holder: s.holder})
	}
	if n := len(segs); n > 0 {
		segs[n-1].to = end
	}
	for _, s := range segs {
		if s.id == "" {
			continue
		}
		holder := s.holder
		if holder == "" {
			// (a) writes no holder: the first workload starting while this
			// lock ID was seen is its holder's.
			best := int64(-1)
			for _, iv := range ivs {
				if iv.Start >= s.from-int64(200*time.Millisecond) && iv.Start <= s.to && (best < 0 || iv.Start < best) {
					best, holder = iv.Start, iv.AllocID
				}
			}
			if best < 0 {
				// Held since before the timeline began: the workload that
				// ran at its start.
				for _, iv := range ivs {
					if iv.Start <= s.from && (!iv.Ended || iv.End >= s.from) {
						holder = iv.AllocID
					}
				}
			}
		}
		color := -1
		if l, ok := lane[holder]; ok {
			color = l - 1
		}
		if holder == killed && killAt > s.from && killAt < s.to {
			tl.Spans = append(tl.Spans,
				Span{Lane: 0, From: sec(s.from), To: sec(killAt), Kind: Held, Color: color},
				Span{Lane: 0, From: sec(killAt), To: sec(s.to), Kind: HeldDead, Color: color})
			continue
		}
		tl.Spans = append(tl.Spans, Span{Lane: 0, From: sec(s.from), To: sec(s.to), Kind: Held, Color: color})
	}
	return tl
}
