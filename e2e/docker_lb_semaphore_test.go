package e2e

// `lock lb follow -n 2` beside docker tasks whose entrypoint is `lock -n 2`
// (examples/lock-docker-lb-hooks.nomad.hcl with a semaphore of two slots
// and count = 3), with the reference LB API over real HTTP. Each holder of
// a slot is listed while it holds it; after a `docker kill` of a holder and
// a graceful stop of another, the LB lists exactly the current holders,
// and, sampled all along, never more than two upstreams.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

func TestDockerLockLBFollowSemaphore(t *testing.T) {
	t.Parallel()
	d := harness.StartDocker(t)
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, Docker: d})
	const key, n = "e2e-docker-lb-key", 2
	lb := harness.StartLB(t, lbapi.Options{
		Groups:         []lbapi.Group{{Name: "prod-lb"}},
		AuthKeys:       []string{key},
		WorkerInterval: lbWorkerInterval,
	})
	keyFile := filepath.Join(t.TempDir(), "lb-authkey")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newDockerScenario(t, "lbsem")
	s.job = "api" // the example's lock path is nomad/jobs/api/lock
	const service, prefix = "api", "nomad/jobs/api/lock"
	src := renderLBHooksExample(t, s, d, lb.URI, keyFile)
	src = substitute(t, src, "    count = 2\n    restart", "    count = 3\n    restart")
	src = substitute(t, src, `"-upstream-port", "http"]`, `"-upstream-port", "http", "-n", "`+strconv.Itoa(n)+`"]`)
	src = substitute(t, src, `"${NOMAD_TASK_DIR}/lb.hcl", "nomad/jobs/api/lock"]`,
		`"${NOMAD_TASK_DIR}/lb.hcl", "-n", "`+strconv.Itoa(n)+`", "nomad/jobs/api/lock"]`)
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	live := lbWatchLive(t, lb, service)
	a.RunJobHCL(t, src)
	t.Cleanup(func() { _ = a.Purge(s.job) })

	// holders maps each slot to its current holder's latest start record.
	holders := map[int]harness.Record{}
	harness.WaitRecord(t, s.record, 3*time.Minute, func(r harness.Record) bool {
		if isMainStart(r) {
			holders[slotOf(t, prefix, r)] = r
		}
		return len(holders) == n
	})
	// listed waits until the LB lists exactly the holders' upstreams and
	// measures how long after the latest tenure's start it did.
	listed := func(scenario string, from int64) {
		t.Helper()
		var want []string
		for _, r := range holders {
			want = append(want, lbUpstreamOf(t, a, r.AllocID))
		}
		slices.Sort(want)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got := slices.Clone(lb.Upstreams(service))
			slices.Sort(got)
			if slices.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: LB service %s lists %q after 2m, want exactly the holders' %q; requests:\n%s",
					scenario, service, got, want, lbFormatRequests(lb.Requests(service)))
			}
			time.Sleep(20 * time.Millisecond)
		}
		harness.Measure(t, "docker_lb_semaphore_holders_listed_"+scenario, time.Duration(harness.MonoNow()-from))
	}
	listed("first", max(holders[0].Mono, holders[1].Mono))

	// docker kill of slot 0's holder: its sidecar takes it out on the
	// failed check; the standby takes slot 0 once the server expires it,
	// and its sidecar's ADD swaps out slot 0's previous holder.
	killed := holders[0]
	cs := d.TaskContainers(t, killed.AllocID, "api")
	if len(cs) == 0 || cs[0].State != "running" {
		t.Fatalf("no running container for slot 0's holder %s: %+v", drvShort(killed.AllocID), cs)
	}
	up := lbUpstreamOf(t, a, killed.AllocID)
	killing := harness.MonoNow()
	d.CLI(t, "kill", cs[0].ID)
	next := waitMainStart(t, s.record, 3*time.Minute, func(r harness.Record) bool {
		return r.Mono > killing && r.LockPath == killed.LockPath
	})
	if next.AllocID == killed.AllocID {
		t.Fatalf("the killed allocation %s took slot 0 back: want the standby (the restart delay keeps it out)", drvShort(killed.AllocID))
	}
	holders[0] = next
	if gone := live.firstWithout(up, killing); gone > 0 {
		harness.Measure(t, "docker_lb_semaphore_dead_upstream_listed", time.Duration(gone-killing))
	}
	listed("docker_kill", next.Mono)
	checkAddRemoved(t, lb, service, next.AllocID, up)

	// A graceful stop of slot 1's holder: its lock releases at once, a
	// standby (the stopped allocation's replacement, or the killed one once its
	// task is back) takes slot 1.
	stopped := holders[1]
	a.Nomad(t, "alloc", "stop", "-detach", stopped.AllocID)
	next = waitMainStart(t, s.record, 3*time.Minute, func(r harness.Record) bool {
		return r.AllocID != stopped.AllocID && r.LockPath == stopped.LockPath && r.Mono > stopped.Mono
	})
	holders[1] = next
	listed("graceful_stop", next.Mono)

	live.halt()
	most := 0
	live.mu.Lock()
	for _, c := range live.changes {
		most = max(most, len(c.ups))
	}
	changes := fmt.Sprint(live.changes)
	live.mu.Unlock()
	harness.Measure(t, "docker_lb_semaphore_most_listed", most)
	if most > n {
		t.Errorf("the LB listed %d upstreams at once, want at most %d: %s", most, n, changes)
	}
	if err := a.Purge(s.job); err != nil {
		t.Fatal(err)
	}
	lbWaitUpstreams(t, lb, service, time.Minute)
	checkDockerSlots(t, s, smp, prefix, n)
}

// checkDockerSlots stops the sampler once no process of the scenario is
// left, and checks the workloads' records: at most n at once, never two on
// one slot's fences going back. (A docker-killed workload writes no stop
// record, and its PID in the records is its container's, so its end is not
// in the records: the sampler's count of allocations bounds them all.)
func checkDockerSlots(t *testing.T, s dockerScenario, smp *harness.Sampler, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for procs, _ := harness.FindProcs(s.marker); len(procs) > 0; procs, _ = harness.FindProcs(s.marker) {
		if time.Now().After(deadline) {
			t.Fatalf("processes of the job still alive 60s after its purge: %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	if over := sum.Over(n); len(over) > 0 {
		t.Errorf("the sampler saw more than %d allocations' workloads at once in %d samples: %s", n, len(over), sum)
	}
	bySlot := map[int][]harness.Record{}
	for _, r := range readRecords(t, s.record) {
		if isMainStart(r) {
			bySlot[slotOf(t, prefix, r)] = append(bySlot[slotOf(t, prefix, r)], r)
		}
	}
	for slot, starts := range bySlot {
		if slot < 0 || slot >= n {
			t.Errorf("a workload held slot %d of a semaphore of %d", slot, n)
		}
		for i := 1; i < len(starts); i++ {
			a, errA := strconv.ParseUint(starts[i-1].Fence, 10, 64)
			b, errB := strconv.ParseUint(starts[i].Fence, 10, 64)
			if errA != nil || errB != nil || b <= a {
				t.Errorf("slot %d: fence %q after fence %q, want a higher one", slot, starts[i].Fence, starts[i-1].Fence)
			}
		}
	}
	t.Logf("sampler: %s", sum)
}
