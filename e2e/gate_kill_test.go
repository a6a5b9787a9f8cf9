package e2e

// The gate kills and proves dead its gated tasks itself when its
// supervisor cannot: the rows of the chaos matrix where the holder's gate
// supervisor is SIGKILLed or frozen (SIGSTOP past the TTL), for a docker app
// whose PID 1 ignores SIGTERM and for a raw_exec app, each run once.

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

func TestGateKill(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	d := harness.StartDocker(t)
	opts := drvAgentOptions(t, true)
	opts.Docker = d
	a := harness.StartAgent(t, opts)
	records := chaosGateRecords(t)
	var subs []subtest
	for _, f := range chaosGateFaults {
		if f.name != "supervisor" && f.name != "sigstop" {
			continue
		}
		for _, kind := range f.kinds {
			name := f.name + "_" + strings.ReplaceAll(kind, "_", "-")
			subs = append(subs, subtest{name, func(t *testing.T) {
				tr := &chaosTrial{Takeover: -1, Recovery: -1}
				chaosGateTrial(t, a, d, records, f, kind, 1, tr)
				harness.Measure(t, "gate_"+name+"_takeover", tr.Takeover)
				t.Logf("%s: overlaps=%d fences=%d takeover=%s %s", name, tr.Overlaps, tr.Fences, tr.Takeover, tr.Note)
				if tr.Overlaps > 0 || tr.Fences > 0 {
					t.Errorf("%s: %d overlapping app lifetimes, %d fence violations", name, tr.Overlaps, tr.Fences)
				}
			}})
		}
	}
	runConcurrently(t, subs)
}

// TestGateDockerEndpointUnreachable: the docker plugin runs on its own
// engine and the singleton plugin's docker_endpoint names a socket where
// no engine answers. At start the gate says that it leaves its docker app
// to Nomad, and names docker_endpoint, instead of claiming a kill it
// cannot do; a crash of its supervisor then keeps the lock for the server
// to expire, and the next app starts only once Nomad reports the old one
// dead. (Before: the start event said the gate kills the app itself, and
// every direct kill failed.)
func TestGateDockerEndpointUnreachable(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	d := harness.StartDocker(t)
	opts := drvAgentOptions(t, true)
	opts.Docker = d
	opts.Config[0] = strings.Replace(opts.Config[0], harness.DockerEndpointPlaceholder, "unix:///run/singleton-e2e-no-engine.sock", 1)
	a := harness.StartAgent(t, opts)
	j := newChaosGateJob(t, "docker", chaosGateRecords(t), "gde-d1", d)
	j.noService = true
	smp, first := chaosGateRun(t, a, j)
	holder := first.AllocID
	j.standby(t, a, holder)
	ev := leaseGateWaitEvent(t, a, holder, 30*time.Second, "Gate leaves to Nomad (", "app (docker: the plugin cannot reach the Docker engine at unix:///run/singleton-e2e-no-engine.sock",
		"set the plugin config's docker_endpoint")
	t.Logf("start event: %s", drvEventText(ev))
	if gateEventsSaying(t, a, holder, "Gate kills and proves dead itself") > 0 {
		t.Errorf("the gate claims it kills its docker app itself, with no engine to do it with")
	}
	app := j.appProc(t, holder)
	smp.WaitSeen(t, 30*time.Second, app.PID)
	at := harness.MonoNow()
	if err := syscall.Kill(drvSupervisor(t, holder).PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := drvWaitGone(t, app.PID, drvTTL+30*time.Second)
	next := j.start(t, holder, at, chaosTakeoverBound)
	harness.Measure(t, "gate_docker_endpoint_unreachable_crash_takeover", time.Duration(next.Mono-at))
	if next.Mono < gone {
		t.Errorf("the next app started %s before the old one was gone", time.Duration(gone-next.Mono))
	}
	leaseGateWaitEvent(t, a, holder, 30*time.Second, "Lock kept after the gate's crashed supervisor")
	tr := &chaosTrial{}
	chaosGateFinish(t, a, j, smp, tr, harness.KnownEnd{PID: first.PID, Mono: gone})
	t.Logf("crash takeover %s (the server's expiry), old app gone %s after the crash, overlaps=%d",
		harness.Millis(time.Duration(next.Mono-at)), harness.Millis(time.Duration(gone-at)), tr.Overlaps)
	if tr.Overlaps > 0 || tr.Fences > 0 {
		t.Errorf("%d overlapping app lifetimes, %d fence violations", tr.Overlaps, tr.Fences)
	}
}
