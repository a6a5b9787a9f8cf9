package e2e

// `lock lb follow` as a poststart sidecar beside a docker task whose
// entrypoint is lock (examples/lock-docker-lb-hooks.nomad.hcl), with the
// reference LB API over real HTTP. The lock changes hands by a graceful
// alloc stop, a restart of the holder's task, and `docker kill` of the
// holder again and again, so that it moves back and forth between two
// allocations and each wins it back: the case once-per-allocation
// lifecycle hooks never covered (a killed task's allocation survives, so its
// poststop never runs, and its poststart never runs again). After each
// move the LB lists exactly the new holder's upstream, and, sampled all
// along, it never lists an upstream where nothing listens for longer than
// the health check's interval plus slack.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

const (
	// dockerLBHealthInterval is the example's health_check.interval.
	dockerLBHealthInterval = time.Second
	// dockerLBDeadSlack is what a dead upstream may stay listed beyond the
	// check interval: the confirming check, the REMOVE through the LB and
	// a busy machine. A removal that waited for the lock's expiry would
	// take 2×TTL + delay, about 21 s.
	dockerLBDeadSlack = 5 * time.Second
	// dockerLBKills is how many times the holder is killed: the lock moves
	// between the two allocations at every kill, so it goes back and forth
	// twice.
	dockerLBKills = 4
)

// Slow on purpose (about 2 minutes): each of the dockerLBKills kills leaves
// the lock to the server's expiry (2×TTL + delay, 21 s) before the other
// allocation can take it.
func TestDockerLockLBHooks(t *testing.T) {
	t.Parallel()
	d := harness.StartDocker(t)
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, Docker: d})
	testDockerLBFollow(t, a, d, dockerLBKills)
}

// TestDockerLockLBHooksUnderACLs: the same under ACLs, with the least
// privilege docs/lock-lb.md describes: the lock policy on the task that
// takes the lock alone, and the read-only policy on the sidecar alone. The
// sidecar's workload identity then reads the holder record and nothing else
// (not even the Lock field), and still follows every tenure.
func TestDockerLockLBHooksUnderACLs(t *testing.T) {
	t.Parallel()
	d := harness.StartDocker(t)
	a := harness.StartAgent(t, harness.AgentOptions{ACLs: true, Docker: d})
	applyTaskPolicy(t, a, "singleton-lock.policy.hcl", "api", "nomad/jobs/api/lock")
	applyTaskPolicy(t, a, "singleton-lock-read.policy.hcl", "lb", "nomad/jobs/api/lock")
	testDockerLBFollow(t, a, d, 2)
}

// applyTaskPolicy applies examples/acl/<example> for the lock at path to
// task alone, of job api, group api (the example's).
func applyTaskPolicy(t *testing.T, a *harness.Agent, example, task, path string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", "acl", example))
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.ReplaceAll(string(b), `"nomad/jobs/web/lock"`, fmt.Sprintf("%q", path))
	if policy == string(b) {
		t.Fatalf("examples/acl/%s no longer has path \"nomad/jobs/web/lock\"", example)
	}
	f := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(f, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Nomad(t, "acl", "policy", "apply", "-namespace", "default", "-job", "api", "-group", "api", "-task", task,
		strings.TrimSuffix(example, ".policy.hcl")+"-"+task, f)
}

// testDockerLBFollow runs the example on a and moves the lock by a graceful
// stop, a restart of the holder's task and `kills` docker kills of the
// holder; see the file's comment for what it checks.
func testDockerLBFollow(t *testing.T, a *harness.Agent, d *harness.Docker, kills int) {
	const key = "e2e-docker-lb-key"
	lb := harness.StartLB(t, lbapi.Options{
		Groups:         []lbapi.Group{{Name: "prod-lb"}},
		AuthKeys:       []string{key},
		WorkerInterval: lbWorkerInterval,
	})
	keyFile := filepath.Join(t.TempDir(), "lb-authkey")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newDockerScenario(t, "lb")
	s.job = "api" // the example's lock path is nomad/jobs/api/lock
	const service, lockPath = "api", "nomad/jobs/api/lock"
	smp, first := startDockerScenario(t, a, s, renderLBHooksExample(t, s, d, lb.URI, keyFile), false)
	live := lbWatchLive(t, lb, service)

	// settle waits until the LB lists exactly holder's upstream, and
	// measures how long after the start of its tenure it did.
	settle := func(scenario string, holder harness.Record) {
		t.Helper()
		up := lbUpstreamOf(t, a, holder.AllocID)
		lbWaitUpstreams(t, lb, service, 2*time.Minute, up)
		harness.Measure(t, "docker_lb_listed_after_tenure_start_"+scenario, time.Duration(live.waitExactly(t, up, holder.Mono)-holder.Mono))
		checkLBOverHTTP(t, lb, service, up)
		checkHolderUpstream(t, a, lockPath, up)
	}
	settle("first", first)

	// Graceful: the holder's lock releases at once, and the standby's
	// sidecar ADDs it, swapping out the old holder.
	a.Nomad(t, "alloc", "stop", "-detach", first.AllocID)
	holder := waitStartNotIn(t, s.record, 2*time.Minute, first.AllocID)
	settle("graceful_stop", holder)
	checkAddRemoved(t, lb, service, holder.AllocID, lbUpstreamOf(t, a, first.AllocID))

	// A restart of the holder's task: its lock stops the app and releases;
	// whichever allocation takes the lock next is added.
	waitAPITasksRunning(t, a, s.job, nil)
	before, since := harness.MonoNow(), map[string]time.Time{holder.AllocID: time.Now()}
	a.Nomad(t, "alloc", "restart", holder.AllocID, "api")
	holder = waitMainStart(t, s.record, 2*time.Minute, func(r harness.Record) bool { return r.Mono > before })
	settle("task_restart", holder)

	// docker kill of the holder, again and again: its allocation survives,
	// only its task comes back (after the restart delay, as a standby), and
	// the other allocation takes the lock once the server expires it. The
	// killed holder's sidecar takes its upstream out on the failed check;
	// the next holder's sidecar adds it when it wins the lock (back).
	moves := 0
	for i := 1; i <= kills; i++ {
		waitAPITasksRunning(t, a, s.job, since)
		cs := d.TaskContainers(t, holder.AllocID, "api")
		if len(cs) == 0 || cs[0].State != "running" {
			t.Fatalf("kill %d: no running container for the holder %s: %+v", i, drvShort(holder.AllocID), cs)
		}
		up := lbUpstreamOf(t, a, holder.AllocID)
		since = map[string]time.Time{holder.AllocID: time.Now()}
		killing := harness.MonoNow()
		d.CLI(t, "kill", cs[0].ID)
		killed := harness.MonoNow()
		next := waitMainStart(t, s.record, 3*time.Minute, func(r harness.Record) bool { return r.Mono > killed })
		if next.AllocID != holder.AllocID {
			moves++
		}
		scenario := fmt.Sprintf("kill_%d", i)
		harness.Measure(t, "docker_lb_takeover_"+scenario, time.Duration(next.Mono-killed))
		// From before the kill: the sidecar may see the container dead
		// before `docker kill` returns.
		if gone := live.firstWithout(up, killing); gone > 0 {
			harness.Measure(t, "docker_lb_dead_upstream_listed_"+scenario, time.Duration(gone-killing))
		}
		settle(scenario, next)
		checkAddRemoved(t, lb, service, next.AllocID, up)
		holder = next
	}
	if moves < kills {
		t.Errorf("the lock moved between the allocations %d times in %d kills, want every time (the restart delay should keep the killed allocation out)",
			moves, kills)
	}
	harness.Measure(t, "docker_lb_moves_between_allocs", moves)

	checkDockerNoOverlap(t, a, s, smp, false)
	// The job is stopped: every sidecar removed its upstream on its way out.
	lbWaitUpstreams(t, lb, service, time.Minute)
	live.check(t, dockerLBHealthInterval+dockerLBDeadSlack)
}

// renderLBHooksExample renders examples/lock-docker-lb-hooks.nomad.hcl with
// the test's LB, auth key file, image (host networking, the record dir at
// /rec), the testworkload serving HTTP as the app, bin/lock for the
// sidecar, and a restart delay longer than the lock's expiry, so that the
// standby allocation, not the killed one, is always the next holder.
func renderLBHooksExample(t *testing.T, s dockerScenario, d *harness.Docker, uri, keyFile string) string {
	t.Helper()
	src := readExample(t, "lock-docker-lb-hooks.nomad.hcl")
	src = substitute(t, src, `"http://baragon.service.consul:8080/baragon/v2/request"`, `"`+uri+`"`)
	src = substitute(t, src, `"/etc/singleton/lb-authkey"`, `"`+keyFile+`"`)
	src = substitute(t, src, `image      = "registry.example.com/api-with-lock:1.0"`,
		`image        = "`+d.Image+`"`+"\n        network_mode = \"host\"\n        volumes      = [\""+s.recDir+":/rec\"]")
	args := append([]string{"nomad/jobs/api/lock"}, s.workloadArgv("-http", "${NOMAD_HOST_ADDR_http}")...)
	src = substitute(t, src, `args       = ["nomad/jobs/api/lock", "/app/server", "--port", "8080"]`,
		"args         = "+harness.HCLList(args...))
	if !strings.Contains(src, "sidecar = true") || !strings.Contains(src, `"lb", "follow"`) {
		t.Fatal("example: want the lock lb follow sidecar; update the test's rendering")
	}
	// The sidecar runs bin/lock from the host (raw_exec).
	src = substitute(t, src, `command = "/usr/local/bin/lock"`, `command = "`+harness.LockBin(t)+`"`)
	return substitute(t, src, "    count = 2\n", "    count = 2\n    restart {\n      attempts = 10\n      interval = \"30m\"\n"+
		"      delay    = \"30s\"\n      mode     = \"fail\"\n    }\n")
}

// waitAPITasksRunning waits until the job has two allocations running
// their "api" task, the task of each allocation in since started after the
// time given (a killed or restarted task is back).
func waitAPITasksRunning(t *testing.T, a *harness.Agent, job string, since map[string]time.Time) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var running []string
		allocs, err := a.Allocs(job)
		for _, al := range allocs {
			if al.DesiredStatus != "run" {
				continue
			}
			full, _, ierr := a.API().Allocations().Info(al.ID, nil)
			if ierr != nil {
				err = ierr
				continue
			}
			if ts := full.TaskStates["api"]; ts != nil && ts.State == "running" && ts.StartedAt.After(since[al.ID]) {
				running = append(running, al.ID)
			}
		}
		if len(running) == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: allocations %v run their api task (started after %v) after 3m, want 2 (%v)", job, running, since, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lbLiveSampler polls a service's upstreams every few milliseconds, keeps
// every change of the list (CLOCK_MONOTONIC), and dials every listed
// upstream: a refused connection means nothing listens there. It remembers
// the longest time an upstream stayed listed with nothing listening.
type lbLiveSampler struct {
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	samples  int
	changes  []lbChange
	deadFrom map[string]int64 // listed upstream -> first refused dial in a row
	worst    time.Duration
	worstUp  string
}

type lbChange struct {
	mono int64
	ups  []string
}

func lbWatchLive(t *testing.T, lb *harness.LB, service string) *lbLiveSampler {
	s := &lbLiveSampler{stop: make(chan struct{}), done: make(chan struct{}), deadFrom: map[string]int64{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			s.sample(lb.Upstreams(service))
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

func (s *lbLiveSampler) sample(ups []string) {
	now := harness.MonoNow()
	refused := map[string]bool{}
	for _, u := range ups {
		c, err := net.DialTimeout("tcp", u, 300*time.Millisecond)
		if err == nil {
			c.Close()
		}
		refused[u] = errors.Is(err, syscall.ECONNREFUSED)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	if n := len(s.changes); n == 0 || !slices.Equal(s.changes[n-1].ups, ups) {
		s.changes = append(s.changes, lbChange{mono: now, ups: ups})
	}
	for u, from := range s.deadFrom {
		if !refused[u] {
			delete(s.deadFrom, u)
			continue
		}
		if d := time.Duration(now - from); d > s.worst {
			s.worst, s.worstUp = d, u
		}
	}
	for u, r := range refused {
		if _, ok := s.deadFrom[u]; r && !ok {
			s.deadFrom[u] = now
		}
	}
}

// firstExactly is the first moment at or after from that the LB listed
// exactly up (0: not yet).
func (s *lbLiveSampler) firstExactly(up string, from int64) int64 {
	return s.first(from, func(ups []string) bool { return slices.Equal(ups, []string{up}) })
}

// waitExactly waits (a few of its samples) until the sampler has seen the
// LB list exactly up at or after from, and returns that moment.
func (s *lbLiveSampler) waitExactly(t *testing.T, up string, from int64) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if at := s.firstExactly(up, from); at > 0 {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("the LB live sampler did not see exactly [%s] within 10s", up)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// firstWithout is the first moment at or after from that the LB did not
// list up (0: not yet).
func (s *lbLiveSampler) firstWithout(up string, from int64) int64 {
	return s.first(from, func(ups []string) bool { return !slices.Contains(ups, up) })
}

func (s *lbLiveSampler) first(from int64, match func([]string) bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.changes {
		end := int64(1<<63 - 1)
		if i+1 < len(s.changes) {
			end = s.changes[i+1].mono
		}
		if end > from && match(c.ups) {
			return max(c.mono, from)
		}
	}
	return 0
}

func (s *lbLiveSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// check stops the sampler and fails the test if an upstream stayed listed
// with nothing listening for longer than bound.
func (s *lbLiveSampler) check(t *testing.T, bound time.Duration) {
	t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	harness.Measure(t, "docker_lb_longest_dead_upstream_listed", s.worst)
	var b strings.Builder
	for _, c := range s.changes {
		fmt.Fprintf(&b, "  %d %q\n", c.mono, c.ups)
	}
	t.Logf("LB live sampler: %d samples, %d changes:\n%s", s.samples, len(s.changes), b.String())
	if s.samples < 100 {
		t.Errorf("LB live sampler: only %d samples", s.samples)
	}
	if s.worst > bound {
		t.Errorf("the LB listed %s for %s with nothing listening there, want at most %s (health check interval plus slack)",
			s.worstUp, s.worst, bound)
	}
}

// checkLBOverHTTP asserts over the LB's HTTP state API that the service
// lists exactly want.
func checkLBOverHTTP(t *testing.T, lb *harness.LB, service, want string) {
	t.Helper()
	_, _, names := lbHTTPState(t, lb, service)
	if !slices.Equal(names, []string{want}) {
		t.Errorf("GET state/%s lists upstreams %q, want exactly [%s]; requests:\n%s",
			service, names, want, lbFormatRequests(lb.Requests(service)))
	}
}

// checkHolderUpstream asserts that the lock's holder record names the
// holder's upstream (what the next holder's ADD swaps out).
func checkHolderUpstream(t *testing.T, a *harness.Agent, path, want string) {
	t.Helper()
	v := readLock(t, a, path)
	if got := v.Items["holder_upstream"]; got != want {
		t.Errorf("lock %s holder_upstream = %q, want %q (items %v)", path, got, want, v.Items)
	}
}

// checkAddRemoved asserts that allocID's last successful ADD also removed
// prev (the previous holder's upstream, as its holder record named it).
func checkAddRemoved(t *testing.T, lb *harness.LB, service, allocID, prev string) {
	t.Helper()
	var last *lbapi.RequestRecord
	for _, r := range lbRequestsWithPrefix(lb, service, allocID+"-ADD-") {
		if r.State == "SUCCESS" {
			last = &r
		}
	}
	if last == nil {
		t.Errorf("no successful ADD of alloc %s; requests:\n%s", allocID, lbFormatRequests(lb.Requests(service)))
		return
	}
	if !slices.Contains(last.RemoveUpstreams, prev) {
		t.Errorf("ADD %s removed %q, want the previous holder's %s", last.ID, last.RemoveUpstreams, prev)
	}
}
