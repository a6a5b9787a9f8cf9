package e2e

// `lock lb add` / `lock lb remove` as lifecycle tasks beside a docker task
// whose entrypoint is lock (examples/lock-docker-lb-hooks.nomad.hcl), with
// the reference LB API over real HTTP: after a graceful failover and after
// a `docker kill` failover, the LB lists exactly one upstream, the live
// holder's. The kill is the case a poststop REMOVE never covers (the
// allocation survives, only its task restarts): the next holder's ADD must
// swap the dead upstream out, from the holder record in the lock.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

func TestDockerLockLBHooks(t *testing.T) {
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
	d := harness.StartDocker(t)
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, Docker: d})

	s := newDockerScenario(t, "lb")
	s.job = "api" // the example's lock path is nomad/jobs/api/lock
	const service, lockPath = "api", "nomad/jobs/api/lock"
	src := readExample(t, "lock-docker-lb-hooks.nomad.hcl")
	src = substitute(t, src, `"http://baragon.service.consul:8080/baragon/v2/request"`, `"`+lb.URI+`"`)
	src = substitute(t, src, `"/etc/singleton/lb-authkey"`, `"`+keyFile+`"`)
	src = substitute(t, src, `image      = "registry.example.com/api-with-lock:1.0"`,
		`image        = "`+d.Image+`"`+"\n        network_mode = \"host\"\n        volumes      = [\""+s.recDir+":/rec\"]")
	args := append([]string{lockPath}, s.workloadArgv("-http", "${NOMAD_HOST_ADDR_http}")...)
	src = substitute(t, src, `args       = ["nomad/jobs/api/lock", "/app/server", "--port", "8080"]`,
		"args         = "+harness.HCLList(args...))
	// The hook tasks run bin/lock from the host (raw_exec).
	if n := strings.Count(src, `command = "/usr/local/bin/lock"`); n != 2 {
		t.Fatalf("example: want 2 hook tasks running /usr/local/bin/lock, found %d", n)
	}
	src = strings.ReplaceAll(src, `command = "/usr/local/bin/lock"`, `command = "`+harness.LockBin(t)+`"`)
	// A killed task comes back only after 60s (Nomad's default is 15s), so
	// that the standby allocation, not the killed one, is the next holder
	// (the server frees the lock about 2×TTL after the kill): the case in
	// which the dead upstream must be swapped out by someone else.
	src = substitute(t, src, "    count = 2\n", "    count = 2\n    restart {\n      attempts = 2\n      interval = \"30m\"\n      delay    = \"60s\"\n      mode     = \"fail\"\n    }\n")

	smp, first := startDockerScenario(t, a, s, src, false)
	upA := lbUpstreamOf(t, a, first.AllocID)
	lbWaitUpstreams(t, lb, service, 2*time.Minute, upA)
	checkHolderUpstream(t, a, lockPath, upA)

	// Graceful failover: the holder's lock releases at once, its poststop
	// REMOVE runs, and the standby's ADD swaps it out in the same request.
	a.Nomad(t, "alloc", "stop", "-detach", first.AllocID)
	second := waitStartNotIn(t, s.record, 2*time.Minute, first.AllocID)
	upB := lbUpstreamOf(t, a, second.AllocID)
	lbWaitUpstreams(t, lb, service, 2*time.Minute, upB)
	checkLBOverHTTP(t, lb, service, upB)
	checkHolderUpstream(t, a, lockPath, upB)
	checkAddRemoved(t, lb, service, second.AllocID, upA)

	// docker kill of the holder's container: its allocation survives (only
	// the task restarts), so no poststop REMOVE ever runs for it. The next
	// holder takes over after the server expires the lock, and its ADD
	// removes the dead upstream.
	cs := d.TaskContainers(t, second.AllocID, "api")
	if len(cs) == 0 || cs[0].State != "running" {
		t.Fatalf("no running container for the holder %s: %+v", second.AllocID, cs)
	}
	d.CLI(t, "kill", cs[0].ID)
	killed := harness.MonoNow()
	third := waitStartNotIn(t, s.record, 3*time.Minute, first.AllocID, second.AllocID)
	harness.Measure(t, "docker_lb_kill_takeover", time.Duration(third.Mono-killed))
	upC := lbUpstreamOf(t, a, third.AllocID)
	lbWaitUpstreams(t, lb, service, 2*time.Minute, upC)
	checkAddRemoved(t, lb, service, third.AllocID, upB)
	checkHolderUpstream(t, a, lockPath, upC)

	// Settled: the killed allocation's task is back (a standby now), and
	// the LB still lists only the live holder.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		al, _, err := a.API().Allocations().Info(second.AllocID, nil)
		if err == nil {
			if ts := al.TaskStates["api"]; ts != nil && ts.Restarts >= 1 && ts.State == "running" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed holder's task did not restart within 3m")
		}
		time.Sleep(200 * time.Millisecond)
	}
	checkLBOverHTTP(t, lb, service, upC)
	harness.Measure(t, "docker_lb_upstreams_settled", len(lb.Upstreams(service)))
	checkDockerNoOverlap(t, a, s, smp, false)
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

// checkAddRemoved asserts that allocID's successful ADD also removed prev.
func checkAddRemoved(t *testing.T, lb *harness.LB, service, allocID, prev string) {
	t.Helper()
	for _, r := range lbRequestsWithPrefix(lb, service, allocID+"-ADD-") {
		if r.State == "SUCCESS" {
			if !slices.Contains(r.RemoveUpstreams, prev) {
				t.Errorf("ADD %s removed %q, want the previous holder's %s", r.ID, r.RemoveUpstreams, prev)
			}
			return
		}
	}
	t.Errorf("no successful ADD of alloc %s; requests:\n%s", allocID, lbFormatRequests(lb.Requests(service)))
}
