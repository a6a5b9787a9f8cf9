package e2e

// The gate kills and proves dead its gated tasks itself when its
// supervisor cannot: the rows of the chaos matrix where the holder's gate
// supervisor is SIGKILLed or frozen (SIGSTOP past the TTL), for a docker app
// whose PID 1 ignores SIGTERM and for a raw_exec app, each run once.

import (
	"strings"
	"testing"

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
