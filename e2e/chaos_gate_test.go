package e2e

// Row 8 of the fault matrix: the gate. A count = 2 group whose singleton
// task is a gate (config { gate = true }) holding the lock for a gated app of
// another driver: docker, as real images often are (its PID 1 ignores
// SIGTERM, so every stop of it takes the whole kill_timeout, 3s, and ends in
// SIGKILL), and raw_exec where the fault is about the gate, not the app.
// Every trial checks that the gated apps of two allocations never ran at
// once (their records, with the end of a PID-namespaced app from the
// sampler's view of its allocation or its host PID, and the sampler's
// scans), that the standby (and any replacement) never started the app, and
// measures the takeover, or the recovery where the row expects none.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// chaosGateFault is one way a gate's holder is disturbed.
type chaosGateFault struct {
	name, abbrev, fault, proves string
	// kinds of gated app the row runs with.
	kinds []string
	// failover: the next holder's app must start; otherwise the holder's
	// app must start again in place, the lock kept, the standby waiting.
	failover bool
	// none: nobody may start the app after the fault (job stop).
	none bool
}

var chaosGateFaults = []chaosGateFault{
	{name: "alloc-stop", abbrev: "as", kinds: []string{"docker", "raw_exec"}, failover: true,
		fault:  "graceful stop of the holder's allocation (`nomad alloc stop`)",
		proves: "Nomad stops the gated app first, then the gate, which marks its release clean once Nomad reports the app dead; the standby's app starts only then, at once (no wait for the previous holder)"},
	{name: "job-stop", abbrev: "js", kinds: []string{"docker"}, none: true,
		fault:  "`nomad job stop` (both allocations stopped at once; the lock comes free while the standby is being stopped)",
		proves: "the standby's gate, stopped while it waits, never starts its app, though the lock comes free; every process gone"},
	{name: "supervisor", abbrev: "sk", kinds: []string{"docker", "raw_exec"}, failover: true,
		fault:  "SIGKILL of the gate's supervisor",
		proves: "the plugin kills the gated app itself (docker: paused, then SIGKILLed; raw_exec: its cgroup frozen and killed), proves it dead, marks the release clean and releases: the standby's app starts within seconds (asserted < 10s), not at the server's expiry; a decoy container labelled with the holder's allocation ID is left alone"},
	{name: "sigstop", abbrev: "ss", kinds: []string{"docker", "raw_exec"}, failover: true,
		fault:  "SIGSTOP of the gate's supervisor, past the TTL",
		proves: "the plugin's watchdog sees the gate past its fence deadline, kills the gated app and the frozen supervisor; the gate fails and the standby takes over, never beside the old app"},
	{name: "app-kill", abbrev: "ak", kinds: []string{"docker"},
		fault:  "`docker kill` of the gated app's container",
		proves: "Nomad restarts the app in place; the gate keeps the lock (same lock ID), the standby keeps waiting and never starts its app"},
	{name: "lock-lost", abbrev: "ll", kinds: []string{"docker", "raw_exec"}, failover: true,
		fault:  "the lock released behind the holder's back (by hand, with its lock ID)",
		proves: "the holder's gate sees the loss, kills its app itself (docker: paused, then SIGKILLed; raw_exec: its cgroup killed), proves it dead and fails; the next gate holds the lock but starts its app only once Nomad reports the old gate or app dead (the release was by hand, not an expiry)"},
	{name: "group-delay-lock-lost", abbrev: "gd", kinds: []string{"raw_exec"}, failover: true,
		fault: "the lock released behind the holder's back, in a group with `shutdown_delay = \"40s\"`, the app's " +
			"`restart { attempts = 0 }` and the gate's lock ttl 45s (a failed kill falls back to Nomad's, which the lock must outlast)",
		proves: "Nomad sleeps the group's shutdown_delay before it kills any task, also after the gate failed; the gate kills its app " +
			"itself at once instead, so the next gate's app never runs beside it (before: 31.9 s of two apps)"},
	{name: "app-restart", abbrev: "ar", kinds: []string{"docker"},
		fault:  "restart of the gated task (`nomad alloc restart <alloc> app`)",
		proves: "the app stops (kill_timeout, SIGKILL) and starts again in place; the gate keeps the lock (same lock ID), the standby never starts its app"},
	{name: "alloc-restart", abbrev: "rs", kinds: []string{"docker"},
		fault:  "restart of the holder's whole allocation, gate included (`nomad alloc restart <alloc>`)",
		proves: "the restarted gate takes over the lease its previous run left held (same lock ID) and the app starts again in place; the standby never starts its app"},
}

// chaosGateCrashTakeover bounds, loosely, the takeover after a SIGKILL of
// the holder's gate supervisor: the plugin kills the gated app and
// releases in about a second (at a load of 20, with the app's kill_timeout
// of 3 s and a slow engine, 11 s were seen); the server's expiry could
// free the lock no sooner than 2×TTL + delay after the last renew, which
// came at most TTL/2 before the fault, so a takeover under this bound was
// the plugin's release.
const chaosGateCrashTakeover = 2*drvTTL + drvDelay - drvTTL/2 - time.Second

// chaosGateDecoy starts a container that carries the holder's allocation
// ID label (as a job's own labels could) but is not one of its tasks', and
// returns its ID: no gate may touch it.
func chaosGateDecoy(t *testing.T, d *harness.Docker, allocID string) string {
	t.Helper()
	id := strings.TrimSpace(d.CLI(t, "run", "-d", "--network", "host", "--label", "com.hashicorp.nomad.alloc_id="+allocID,
		"--name", "decoy-"+allocID, d.Image, "sleep", "3600"))
	t.Cleanup(func() { _, _ = d.TryCLI("rm", "-f", id) })
	return id
}

// chaosGateEventSays checks that the holder's gate has a task event
// containing each of says.
func chaosGateEventSays(t *testing.T, a *harness.Agent, holder string, says ...string) {
	t.Helper()
	evs := chaosGateEventsSaying(t, a, holder, says)
	for _, want := range says {
		if !chaosEventsSay(evs, want) {
			t.Errorf("alloc %s: no gate task event says %q:\n%s", drvShort(holder), want, drvFormatEvents(evs))
		}
	}
}

// chaosGateWatchdogFired checks that the holder's gate was ended by the
// plugin's watchdog, which killed its gated tasks.
func chaosGateWatchdogFired(t *testing.T, a *harness.Agent, holder string) {
	t.Helper()
	const says = "watchdog killed the gate and its gated tasks"
	if evs := chaosGateEventsSaying(t, a, holder, []string{says}); !chaosEventsSay(evs, says) {
		t.Errorf("alloc %s: no task event says that the watchdog killed the frozen gate and its gated tasks:\n%s", drvShort(holder), drvFormatEvents(evs))
	}
}

// chaosGateEventsSaying reads the holder's gate task events until they say
// every one of says, or for at most 30 s: the plugin's event reaches the
// servers with the client's next sync of the allocation, which may come
// after the next app has started.
func chaosGateEventsSaying(t *testing.T, a *harness.Agent, holder string, says []string) []*api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := a.TaskEvents(holder, "gate")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(says, func(want string) bool { return !chaosEventsSay(evs, want) }) || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func chaosEventsSay(evs []*api.TaskEvent, want string) bool {
	return slices.ContainsFunc(evs, func(ev *api.TaskEvent) bool {
		return strings.Contains(ev.DisplayMessage, want) || strings.Contains(ev.Message, want)
	})
}

// chaosGateKindName is the variant column of a gate row.
func chaosGateKindName(kind string) string {
	if kind == "docker" {
		return "gate + docker app (PID 1 ignores SIGTERM, kill_timeout 3s)"
	}
	return "gate + " + kind + " app"
}

// chaosGateRecords is a directory for the gated apps' records that a docker
// container (root) and the host both write.
func chaosGateRecords(t *testing.T) string {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newChaosGateJob is a gate job named name (unique per row and trial).
func newChaosGateJob(t *testing.T, kind, records, name string, d *harness.Docker) *gateJob {
	j := newGateJobID(t, name, kind, records)
	j.image = d.Image
	return j
}

// chaosGateRun starts the job with a sampler of its gated apps and returns
// the first holder's start record and the standby's allocation ID.
func chaosGateRun(t *testing.T, a *harness.Agent, j *gateJob) (*harness.Sampler, harness.Record) {
	t.Helper()
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
	// Registered after the purge, so it runs first: what Nomad said about
	// each allocation's tasks, for a failed trial.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		allocs, _ := a.Allocs(j.id)
		for _, al := range allocs {
			for _, task := range []string{"gate", "app"} {
				evs, _ := a.TaskEvents(al.ID, task)
				t.Logf("alloc %s (%s/%s) task %s events:\n%s", drvShort(al.ID), al.DesiredStatus, al.ClientStatus, task, drvFormatEvents(evs))
			}
		}
	})
	first := j.start(t, "", 0, 90*time.Second)
	chaosGateWaitRunning(t, a, first.AllocID)
	return smp, first
}

// chaosGateWaitRunning waits until Nomad reports the allocation's gate and
// app running (the app's start record comes first).
func chaosGateWaitRunning(t *testing.T, a *harness.Agent, allocID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		al, _, err := a.API().Allocations().Info(allocID, nil)
		if err == nil && al.TaskStates["gate"] != nil && al.TaskStates["gate"].State == "running" &&
			al.TaskStates["app"] != nil && al.TaskStates["app"].State == "running" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: gate and app not both reported running within 60s (err %v)", drvShort(allocID), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// chaosGateFinish purges the job, waits until its processes are gone, and
// checks the whole trial's records and samples (see checkAllocsApart).
func chaosGateFinish(t *testing.T, a *harness.Agent, j *gateJob, smp *harness.Sampler, tr *chaosTrial, known ...harness.KnownEnd) {
	t.Helper()
	if err := a.Purge(j.id); err != nil {
		t.Errorf("purge %s: %v", j.id, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for procs, _ := harness.FindProcs(j.marker); len(procs) > 0; procs, _ = harness.FindProcs(j.marker) {
		if time.Now().After(deadline) {
			t.Errorf("processes of %s still alive 60s after its purge: %v", j.id, procs)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	ivs, overlaps := checkAllocsApart(t, j.records(t), sum, known...)
	tr.Overlaps += overlaps
	for _, v := range harness.FenceViolations(ivs) {
		t.Errorf("fence violation: %s", v.Reason)
		tr.Fences++
	}
}

// chaosGateOnlyIn fails the test for an app start in an allocation not in
// allowed, or in allowed[i] (i > 0) before the moment from[i]: the standby
// (and any replacement) never starts the app while it does not hold.
func chaosGateOnlyIn(t *testing.T, recs []harness.Record, allowed []string, from []int64) {
	t.Helper()
	for _, r := range drvStarts(recs) {
		i := slices.Index(allowed, r.AllocID)
		switch {
		case i < 0:
			t.Errorf("the gated app started in alloc %s, which never held the lock: %+v", drvShort(r.AllocID), r)
		case r.Mono < from[i]:
			t.Errorf("the gated app started in alloc %s %s before it could hold the lock: %+v", drvShort(r.AllocID), time.Duration(from[i]-r.Mono), r)
		}
	}
}

// chaosGateNeverStarted fails the test if Nomad reports the app task of any
// allocation of the job other than allowed as ever started.
func chaosGateNeverStarted(t *testing.T, a *harness.Agent, jobID string, allowed ...string) {
	t.Helper()
	allocs, err := a.Allocs(jobID)
	if err != nil {
		t.Fatal(err)
	}
	for _, stub := range allocs {
		if slices.Contains(allowed, stub.ID) {
			continue
		}
		al, _, err := a.API().Allocations().Info(stub.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st := al.TaskStates["app"]; st != nil && !st.StartedAt.IsZero() {
			t.Errorf("alloc %s (%s) started its gated app at %s, though it never held the lock", drvShort(al.ID), al.ClientStatus, st.StartedAt)
		}
	}
}

// chaosGateTrial (row 8): one fault of a gate's holder, for a gated app of
// kind.
func chaosGateTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records string, f chaosGateFault, kind string, n int, tr *chaosTrial) {
	j := newChaosGateJob(t, kind, records, fmt.Sprintf("cg%s-%s%d", f.abbrev, kind[:1], n), d)
	if f.name == "group-delay-lock-lost" {
		j.groupExtra = "\n    shutdown_delay = \"40s\""
		j.appRestart = "attempts = 0\n        mode     = \"fail\""
		j.ttl = "45s"
	}
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	lockID := j.heldBy(t, a, holder).Lock.ID

	at := harness.MonoNow()
	var decoy string
	switch f.name {
	case "alloc-stop":
		if err := a.StopAlloc(holder); err != nil {
			t.Fatal(err)
		}
	case "job-stop":
		if _, _, err := a.API().Jobs().Deregister(j.id, false, nil); err != nil {
			t.Fatal(err)
		}
	case "supervisor":
		if kind == "docker" {
			decoy = chaosGateDecoy(t, d, holder)
			at = harness.MonoNow()
		}
		if err := syscall.Kill(drvSupervisor(t, holder).PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	case "sigstop":
		sup := drvSupervisor(t, holder)
		if err := syscall.Kill(sup.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(sup.PID, syscall.SIGCONT) })
	case "app-kill":
		j.killApp(t, d, holder, app)
	case "lock-lost", "group-delay-lock-lost":
		j.releaseBehindBack(t, a, lockID)
	case "app-restart", "alloc-restart":
		task := "app"
		if f.name == "alloc-restart" {
			task = ""
		}
		al, _, err := a.API().Allocations().Info(holder, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.API().Allocations().Restart(al, task, nil); err != nil {
			t.Fatalf("restart %s (task %q): %v", drvShort(holder), task, err)
		}
	default:
		t.Fatalf("no fault %q", f.name)
	}
	// The holder's app dies in every row; a SIGKILLed one writes no end
	// record, and in a PID namespace it records its PID there: its end is
	// when its host PID is gone.
	gone := drvWaitGone(t, app.PID, drvTTL+30*time.Second)
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	notes := []string{"old app gone " + harness.Millis(time.Duration(gone-at)) + " after the fault"}

	switch {
	case f.none:
		left := time.Now().Add(60 * time.Second)
		for procs, _ := harness.FindProcs(j.marker); len(procs) > 0; procs, _ = harness.FindProcs(j.marker) {
			if time.Now().After(left) {
				t.Fatalf("processes of %s still alive 60s after the job stop: %v", j.id, procs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		tr.Recovery = time.Duration(harness.MonoNow() - at)
		notes = append(notes, "every process gone "+harness.Millis(tr.Recovery)+" after the stop")
		chaosGateOnlyIn(t, j.records(t), []string{holder}, []int64{0})
		chaosGateNeverStarted(t, a, j.id, holder)
	case f.failover:
		next := j.start(t, holder, at, chaosTakeoverBound)
		tr.Takeover = time.Duration(next.Mono - at)
		if next.Mono < gone {
			t.Errorf("the next app (alloc %s) started %s before the old one was gone", drvShort(next.AllocID), time.Duration(gone-next.Mono))
		}
		who := "the standby"
		if next.AllocID != standby {
			who = "a replacement allocation" // alloc stop: Nomad's replacement competes for the free lock
		}
		notes = append(notes, who+" took over "+harness.Millis(time.Duration(next.Mono-gone))+" after the old app was gone")
		switch f.name {
		case "supervisor":
			// The plugin proves the app dead and releases at once.
			if tr.Takeover > chaosGateCrashTakeover {
				t.Errorf("after the gate's supervisor was SIGKILLed the next app started only %s later, want < %s (the plugin kills the gated app and releases)",
					tr.Takeover, chaosGateCrashTakeover)
			}
			chaosGateEventSays(t, a, holder, "Gate kills and proves dead itself", "whose gated tasks the plugin killed and proved dead")
			if decoy != "" {
				if st := strings.TrimSpace(d.CLI(t, "inspect", "--format", "{{.State.Status}}", decoy)); st != "running" {
					t.Errorf("the decoy container %s labelled with the holder's allocation ID is %s: the gate killed a container that is not its allocation's", decoy, st)
				}
			}
		case "sigstop":
			chaosGateWatchdogFired(t, a, holder)
		case "lock-lost", "group-delay-lock-lost":
			// The gate killed its app itself, not Nomad after the
			// group's shutdown_delay.
			chaosGateEventSays(t, a, holder, "itself (the lock was lost): proven dead")
		}
		if f.name == "alloc-stop" {
			// A clean stop is marked in the lock, so the next gate need
			// not ask Nomad whether the old app is dead; say if it was not.
			if log := a.AllocLogs(t, holder, "gate", "stderr"); strings.Contains(log, "cannot mark the release clean") {
				notes = append(notes, "release not marked clean, so the next gate waited for Nomad to report the old app dead")
				t.Errorf("the old holder's gate could not mark its release clean after a graceful stop:\n%s", log)
			}
		}
		if v := drvLock(t, a, j.lockPath()); v.Lock == nil || v.Items["holder_alloc_id"] != next.AllocID {
			t.Errorf("lock %s after the takeover: %+v %v, want held by %s", j.lockPath(), v.Lock, v.Items, drvShort(next.AllocID))
		}
		// A while for any other allocation to (wrongly) start its app.
		time.Sleep(2 * time.Second)
		chaosGateOnlyIn(t, j.records(t), []string{holder, next.AllocID}, []int64{0, at})
		chaosGateNeverStarted(t, a, j.id, holder, next.AllocID)
	default:
		again := j.start(t, "", at, 90*time.Second)
		tr.Recovery = time.Duration(again.Mono - at)
		if again.AllocID != holder {
			t.Fatalf("after the fault the app started in %s: want it again in the holder %s", drvShort(again.AllocID), drvShort(holder))
		}
		notes = append(notes, "app again in the holder "+harness.Millis(tr.Recovery)+" after the fault")
		if f.name == "alloc-restart" {
			if al, _, err := a.API().Allocations().Info(holder, nil); err != nil || al.TaskStates["gate"] == nil || al.TaskStates["gate"].Restarts < 1 {
				t.Errorf("alloc %s: the gate was not restarted by the alloc restart (err %v)", drvShort(holder), err)
			}
		}
		time.Sleep(2 * time.Second)
		v := drvLock(t, a, j.lockPath())
		if v.Lock == nil || v.Lock.ID != lockID || v.Items["holder_alloc_id"] != holder {
			t.Errorf("lock %s after the fault: %+v %v, want the same lock ID %s held by %s", j.lockPath(), v.Lock, v.Items, lockID, drvShort(holder))
		}
		j.standby(t, a, holder) // still waiting
		chaosGateOnlyIn(t, j.records(t), []string{holder}, []int64{0})
		chaosGateNeverStarted(t, a, j.id, holder)
	}
	tr.Note = strings.Join(notes, ", ")
	chaosGateFinish(t, a, j, smp, tr, known...)
}

// chaosGatePartitionTrial (row 8, partition): a count = 1 gate job with a
// docker app on the first client, cut off from the server. Its gate must
// self-fence (fail once its lock is lost) so that its client kills the app
// before the server can expire the lock; the replacement on the second
// client takes over then. After the heal the replacement stays the one
// holder. The containers run in the host's network namespace (network_mode
// host, the harness's dockerd has no bridge); the clients reach dockerd by
// its socket, which the cut leaves alone.
func chaosGatePartitionTrial(t *testing.T, a *harness.Agent, d *harness.Docker, records string, service bool, n int, tr *chaosTrial) {
	cut, other := chaosPartitionClients(t, a)
	prefix := "cgpl-d"
	if service {
		prefix = "cgps-d"
	}
	j := newChaosGateJob(t, "docker", records, fmt.Sprintf("%s%d", prefix, n), d)
	j.count = 1
	j.noService = !service
	smp, first := chaosGateRun(t, a, j)
	chaosSetEligible(t, a, other, true)
	if node := chaosAllocNode(t, a, first.AllocID); node != cut.NodeID() {
		t.Fatalf("holder %s runs on node %s, want %s (%s)", drvShort(first.AllocID), drvShort(node), drvShort(cut.NodeID()), cut.Name())
	}
	app := j.appProc(t, first.AllocID)
	smp.WaitSeen(t, 30*time.Second, app.PID)

	at := chaosCut(t, cut)
	// The gate fences by TTL - margin after its last renew and fails; its
	// client kills the app then (kill_timeout 3s, SIGTERM ignored). Not
	// fatal: if the app outlives the lock, the overlap is what the matrix
	// records.
	var gone int64
	for deadline := time.Now().Add(drvTTL + 60*time.Second); ; time.Sleep(10 * time.Millisecond) {
		if !drvAlive(app.PID) {
			gone = harness.MonoNow()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut-off holder's app (pid %d) still runs %s after the cut", app.PID, time.Duration(harness.MonoNow()-at))
		}
	}
	known := []harness.KnownEnd{{PID: first.PID, Mono: gone}}
	// With a Nomad service, Nomad deregisters it (an RPC the cut-off
	// client cannot make) before the kill: the app lives until that RPC
	// gives up, and the next gate waits up to a minute more for it.
	lim := drvTTL + 3*time.Second + 5*time.Second
	bound := chaosTakeoverBound + 3*chaosPartitionHeartbeat
	if service {
		lim += time.Minute
		bound += 2*drvTTL + time.Minute
	}
	if time.Duration(gone-at) > lim {
		t.Errorf("the cut-off holder's app was gone only %s after the cut, want within %s", time.Duration(gone-at), lim)
	}
	next := j.start(t, first.AllocID, at, bound)
	tr.Takeover = time.Duration(next.Mono - at)
	if next.Mono < gone {
		t.Errorf("the replacement's app started %s before the cut-off holder's app was gone: two at once", time.Duration(gone-next.Mono))
	}
	if node := chaosAllocNode(t, a, next.AllocID); node != other.NodeID() {
		t.Errorf("the new holder %s runs on node %s, want the second client %s", drvShort(next.AllocID), drvShort(node), drvShort(other.NodeID()))
	}

	healAt := harness.MonoNow()
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	chaosWaitNodeReady(t, a, cut, 90*time.Second)
	tr.Recovery = time.Duration(harness.MonoNow() - healAt)
	ended := []string{api.AllocClientStatusLost, api.AllocClientStatusComplete, api.AllocClientStatusFailed}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		al, _, err := a.API().Allocations().Info(first.AllocID, nil)
		if err == nil && slices.Contains(ended, al.ClientStatus) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("60s after the heal the cut-off holder's allocation is not lost, complete or failed (err %v)", err)
			break
		}
	}
	if v := readLock(t, a, j.lockPath()); v == nil || v.Lock == nil || v.Items["holder_alloc_id"] != next.AllocID {
		t.Errorf("after the heal the lock is %+v, want it held by the replacement %s", v, drvShort(next.AllocID))
	}
	for _, p := range mainWorkloads(t, j.marker) {
		if p.AllocID != next.AllocID {
			t.Errorf("after the heal an app of alloc %s runs (pid %d), want only the replacement %s", drvShort(p.AllocID), p.PID, drvShort(next.AllocID))
		}
	}
	chaosGateOnlyIn(t, j.records(t), []string{first.AllocID, next.AllocID}, []int64{0, at})
	tr.Note = fmt.Sprintf("old app gone %s after the cut (gate self-fenced and killed it), next app %s after that; node ready %s after the heal",
		harness.Millis(time.Duration(gone-at)), harness.Millis(time.Duration(next.Mono-gone)), harness.Millis(tr.Recovery))
	chaosGateFinish(t, a, j, smp, tr, known...)
}
