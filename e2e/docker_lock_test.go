package e2e

// `lock` as a docker container's entrypoint (examples/lock-docker-
// entrypoint.nomad.hcl), on the harness's private Docker engine: count = 2,
// and never two app lifetimes at once across a graceful alloc stop, a
// `docker kill` of the holder's container, a workload that ignores the kill
// signal, and a workload that leaves a setsid daemon behind.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// dockerTTL is the lock TTL in the examples' entrypoints: the server
// expires a dead holder's lock 2×TTL after its last renew, plus the delay.
const dockerTTL = 10 * time.Second

// Slow on purpose (about a minute): a docker kill leaves the lock to the
// server's expiry (2×dockerTTL + delay), an app that ignores SIGTERM holds
// its lock through the example's 25 s -kill-timeout, and the daemon
// scenario hands the lock over many times.
func TestDockerLockEntrypoint(t *testing.T) {
	t.Parallel()
	d := harness.StartDocker(t)
	image := exampleEntrypointImage(t, d, "lock-docker-entrypoint.nomad.hcl")
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, Docker: d})
	runConcurrently(t, []subtest{
		{"graceful_alloc_stop", func(t *testing.T) { testDockerGracefulStop(t, a, image) }},
		{"docker_kill_holder", func(t *testing.T) { testDockerKill(t, a, d, image) }},
		{"child_ignores_sigterm", func(t *testing.T) { testDockerIgnoreTerm(t, a, image) }},
		{"setsid_daemon", func(t *testing.T) { testDockerDaemon(t, a, image) }},
	})
}

// readExample returns examples/<name>.
func readExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// exampleEntrypointImage builds the image the example's comment describes
// (FROM the app image, lock copied in, ENTRYPOINT lock with flags) on top of
// the test image, which already holds lock: the ENTRYPOINT line is taken
// from the example verbatim.
func exampleEntrypointImage(t *testing.T, d *harness.Docker, example string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^#\s+(ENTRYPOINT \[.*\])$`).FindStringSubmatch(readExample(t, example))
	if m == nil {
		t.Fatalf("examples/%s has no `#   ENTRYPOINT [...]` line to build the image from", example)
	}
	dockerfile := fmt.Sprintf("FROM %s\n%s\n", d.Image, m[1])
	sum := sha256.Sum256([]byte(dockerfile))
	tag := "singleton-e2e-entrypoint:" + hex.EncodeToString(sum[:])[:16]
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	d.CLI(t, "build", "-q", "-t", tag, dir)
	t.Logf("built %s:\n%s", tag, dockerfile)
	return tag
}

// dockerScenario is one job rendered from an example, with its records.
type dockerScenario struct {
	job, marker, record, recDir string
}

func newDockerScenario(t *testing.T, name string) dockerScenario {
	dir := t.TempDir()
	return dockerScenario{
		job:    "dl-" + name,
		marker: fmt.Sprintf("dl-%s-%d", name, time.Now().UnixNano()),
		recDir: dir, record: filepath.Join(dir, "records.jsonl"),
	}
}

// workloadArgv is the testworkload inside the container, writing to the
// bind-mounted record dir.
func (s dockerScenario) workloadArgv(extra ...string) []string {
	return append([]string{harness.ImageWorkloadPath, "-record", "/rec/records.jsonl", "-marker", s.marker}, extra...)
}

// substitute replaces old by new in src, failing the test unless old occurs
// exactly once (so that a changed example is noticed, not silently run
// unchanged).
func substitute(t *testing.T, src, old, new string) string {
	t.Helper()
	if n := strings.Count(src, old); n != 1 {
		t.Fatalf("example: %q occurs %d times, want exactly 1; update the test's rendering", old, n)
	}
	return strings.Replace(src, old, new, 1)
}

// renderEntrypointExample renders examples/lock-docker-entrypoint.nomad.hcl
// with our image, host networking, the record dir bind-mounted at /rec, the
// testworkload (with extra flags) as the app, and groupExtra added to the
// group.
func (s dockerScenario) renderEntrypointExample(t *testing.T, image, groupExtra string, workloadFlags ...string) string {
	t.Helper()
	src := readExample(t, "lock-docker-entrypoint.nomad.hcl")
	src = substitute(t, src, `job "primary-db" {`, fmt.Sprintf("job %q {", s.job))
	src = substitute(t, src, `image = "registry.example.com/postgres-with-lock:17"`,
		fmt.Sprintf("image        = %q\n        network_mode = \"host\"\n        volumes      = [\"%s:/rec\"]", image, s.recDir))
	args := append([]string{"nomad/jobs/${NOMAD_JOB_ID}/primary"}, s.workloadArgv(workloadFlags...)...)
	src = substitute(t, src, `args  = ["nomad/jobs/${NOMAD_JOB_ID}/primary", "docker-entrypoint.sh", "postgres"]`,
		"args         = "+harness.HCLList(args...))
	src = substitute(t, src, "    count = 2\n", "    count = 2\n"+groupExtra+"\n")
	return src
}

func (s dockerScenario) lockPath() string { return "nomad/jobs/" + s.job + "/primary" }

// waitStartNotIn waits for a main-role start of an allocation not in
// excluded.
func waitStartNotIn(t *testing.T, record string, timeout time.Duration, excluded ...string) harness.Record {
	t.Helper()
	return waitMainStart(t, record, timeout, func(r harness.Record) bool {
		for _, id := range excluded {
			if r.AllocID == id {
				return false
			}
		}
		return true
	})
}

// checkDockerNoOverlap stops the sampler once no process of the scenario
// is left, and fails the test if two allocations' workloads (main and,
// with daemons, grandchildren alike) ever ran at once, by their records
// (a SIGKILLed process's end from the sampler, keyed by allocation: in a
// container the recorded PID is not the host PID) and by the sampler's
// scans; and if the fences did not grow from holder to holder.
func checkDockerNoOverlap(t *testing.T, a *harness.Agent, s dockerScenario, smp *harness.Sampler, withChildren bool) []harness.Interval {
	t.Helper()
	stopJobWait(t, a, s.job, 90*time.Second)
	gone := time.Now().Add(90 * time.Second)
	for procs, _ := harness.FindProcs(s.marker); len(procs) > 0; procs, _ = harness.FindProcs(s.marker) {
		if time.Now().After(gone) {
			t.Fatalf("processes of the job still alive 90s after its purge: %v", procs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := smp.Stop()
	recs := readRecords(t, s.record)
	mains := harness.Intervals(recs, sum.GoneByAlloc())
	harness.CheckFences(t, mains)
	if withChildren {
		for i := range recs {
			recs[i].Role = harness.RoleMain
		}
	}
	ivs := harness.Intervals(recs, sum.GoneByAlloc())
	for _, iv := range ivs {
		if !iv.Ended {
			t.Errorf("no end known for %+v", iv)
		}
	}
	overlaps := countAllocOverlaps(t, ivs, sum)
	harness.Measure(t, "overlaps", overlaps)
	t.Logf("%d lifetimes (%d main), sampler: %s", len(ivs), len(mains), sum)
	return mains
}

// startDockerScenario runs the rendered job with a sampler on the
// scenario's workloads (never on lock, which carries the marker in argv)
// and returns the first holder's start record.
func startDockerScenario(t *testing.T, a *harness.Agent, s dockerScenario, hcl string, children bool) (*harness.Sampler, harness.Record) {
	t.Helper()
	filter := harness.Proc.IsMainWorkload
	if children {
		filter = harness.Proc.IsTestWorkload
	}
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: filter})
	a.RunJobHCL(t, hcl)
	t.Cleanup(func() { _ = a.Purge(s.job) })
	first := waitMainStart(t, s.record, 3*time.Minute, nil)
	a.WaitAllocs(t, s.job, 2, "running", 2*time.Minute)
	return smp, first
}

// testDockerGracefulStop: `nomad alloc stop` of the holder. lock (PID 1)
// gets SIGINT, passes it on, the app stops, lock releases: the standby's
// app starts within moments, not after an expiry.
func testDockerGracefulStop(t *testing.T, a *harness.Agent, image string) {
	s := newDockerScenario(t, "graceful")
	smp, first := startDockerScenario(t, a, s, s.renderEntrypointExample(t, image, ""), false)
	a.Nomad(t, "alloc", "stop", "-detach", first.AllocID)
	stop := harness.WaitRecord(t, s.record, time.Minute, func(r harness.Record) bool {
		return r.Instance == first.Instance && r.Event == harness.EventStop
	})
	next := waitStartNotIn(t, s.record, 2*time.Minute, first.AllocID)
	handover := time.Duration(next.Mono - stop.Mono)
	harness.Measure(t, "docker_graceful_handover", handover)
	if handover >= dockerTTL {
		t.Errorf("handover after a graceful stop took %s: lock should release at once (not wait for expiry)", handover)
	}
	checkDockerNoOverlap(t, a, s, smp, false)
}

// testDockerKill: `docker kill` of the holder's container SIGKILLs lock
// (PID 1) and with it the app: nothing releases the lock, so the standby
// takes over only after the server expires it (about 2×TTL + delay).
func testDockerKill(t *testing.T, a *harness.Agent, d *harness.Docker, image string) {
	s := newDockerScenario(t, "kill")
	smp, first := startDockerScenario(t, a, s, s.renderEntrypointExample(t, image, ""), false)
	cs := d.TaskContainers(t, first.AllocID, "postgres")
	if len(cs) == 0 || cs[0].State != "running" {
		t.Fatalf("no running container for the holder %s: %+v", first.AllocID, cs)
	}
	d.CLI(t, "kill", cs[0].ID)
	killed := harness.MonoNow()
	// The next holder is whichever allocation wins once the server frees
	// the lock: the standby, or the killed allocation itself, whose task
	// Nomad restarts 15s after the kill (both happen about 20s in).
	next := waitMainStart(t, s.record, 3*time.Minute, func(r harness.Record) bool { return r.Mono > killed })
	harness.Measure(t, "docker_kill_next_holder_is_killed_alloc", next.AllocID == first.AllocID)
	takeover := time.Duration(next.Mono - killed)
	harness.Measure(t, "docker_kill_takeover", takeover)
	// Loose bounds: never before one TTL (the dead holder renewed at most
	// TTL/2 before the kill and the server waits 2×TTL), and well within
	// 2×TTL + delay plus a busy machine's slack.
	if takeover < dockerTTL || takeover > 2*time.Minute {
		t.Errorf("takeover %s after docker kill: want between %s and 2m", takeover, dockerTTL)
	}
	checkDockerNoOverlap(t, a, s, smp, false)
}

// testDockerIgnoreTerm: the app ignores SIGINT and SIGTERM. lock sends its
// -kill-signal, waits its -kill-timeout (25s in the example's entrypoint),
// SIGKILLs the app and only then releases.
func testDockerIgnoreTerm(t *testing.T, a *harness.Agent, image string) {
	s := newDockerScenario(t, "ignoreterm")
	smp, first := startDockerScenario(t, a, s, s.renderEntrypointExample(t, image, "", "-ignore-term"), false)
	a.Nomad(t, "alloc", "stop", "-detach", first.AllocID)
	sig := harness.WaitRecord(t, s.record, time.Minute, func(r harness.Record) bool {
		return r.Instance == first.Instance && r.Event == harness.EventSignal && r.Ignored
	})
	next := waitStartNotIn(t, s.record, 2*time.Minute, first.AllocID)
	harness.Measure(t, "docker_ignoreterm_handover_after_signal", time.Duration(next.Mono-sig.Mono))
	ivs := checkDockerNoOverlap(t, a, s, smp, false)
	for _, iv := range ivs {
		if iv.Instance == first.Instance && iv.EndedBy != "observed" {
			t.Errorf("the app that ignores SIGTERM ended by %q, want SIGKILL (observed)", iv.EndedBy)
		}
	}
}

// testDockerDaemon: each run's app starts a daemon in its own session that
// ignores SIGTERM, then exits 0 after 2s; lock, PID 1 of the container,
// must see the daemon dead before it releases, so the other allocation's
// app (and daemon) never runs beside it. Nomad restarts the task quickly,
// many times, so the lock changes hands repeatedly.
func testDockerDaemon(t *testing.T, a *harness.Agent, image string) {
	s := newDockerScenario(t, "daemon")
	smp, _ := startDockerScenario(t, a, s, s.renderEntrypointExample(t, image, "    "+daemonRestart, daemonArgs...), true)
	const runs = 3
	deadline := time.Now().Add(4 * time.Minute)
	for countStarts(readRecords(t, s.record), harness.RoleMain) < runs {
		if time.Now().After(deadline) {
			t.Fatalf("only %d app starts within 4m", countStarts(readRecords(t, s.record), harness.RoleMain))
		}
		time.Sleep(200 * time.Millisecond)
	}
	checkDockerNoOverlap(t, a, s, smp, true)
	recs := readRecords(t, s.record)
	allocs := map[string]bool{}
	for _, r := range recs {
		if isMainStart(r) {
			allocs[r.AllocID] = true
		}
	}
	if n := countStarts(recs, harness.RoleChild); n < runs-1 {
		t.Errorf("only %d daemons started: the test proves little", n)
	}
	harness.Measure(t, "docker_daemon_runs", countStarts(recs, harness.RoleMain))
	harness.Measure(t, "docker_daemon_allocs", len(allocs))
}
