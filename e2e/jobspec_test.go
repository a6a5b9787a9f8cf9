package e2e

import (
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestJobspecTemplates renders every e2e job builder (harness/jobs/*.tmpl)
// in its plain and its fullest configuration and checks that the result is
// HCL with one job block of the builder's ID. It needs no agent.
func TestJobspecTemplates(t *testing.T) {
	t.Parallel()
	records := t.TempDir()
	lb := &harness.LB{URI: "http://127.0.0.1:1"}
	full := func(j *drvJob) *drvJob {
		j.failFast, j.update, j.groupExtra, j.user = true, "    max_parallel = 1", "disconnect {\n      lost_after = \"1m\"\n    }", "nobody"
		j.meta, j.args, j.configExtra = map[string]string{"a": `q"uote`, "b": "2"}, []string{"-ignore-term"}, "share_nomad_token = true"
		j.lockBlock, j.killTimeout, j.killSignal, j.memoryMax = `path = "x/lock"`, "30s", "SIGINT", 128
		j.start, j.service = "on_lock", "svc"
		return j
	}
	fullLB := newLBJob(t, lb, "full", 2)
	fullLB.restart, fullLB.noReschedule, fullLB.authkey = "      attempts = 0", true, "k"
	fullLB.lbExtra, fullLB.groups = `          health_check_path = "/x"`, []string{"a", "b"}
	fullGate := newGateJobID(t, "gate-full", "docker", records)
	fullGate.image, fullGate.update, fullGate.gateMarker, fullGate.noService = "img", "      max_parallel = 1", "gm", true
	fullGate.lb, fullGate.appExtra = gateLB(lb, "svc", lbGroup), "\n      shutdown_delay = \"2s\""
	vols := []volume{{name: "v", dest: "/v", writable: true}}
	// id is the job ID each builder gives.
	cases := []struct{ id, hcl string }{
		{"drv-plain", newDrvJob(t, "plain", 1).hcl(t)},
		{"drv-full", full(newDrvJob(t, "full", 3)).hcl(t)},
		{"drv-raw", func() string {
			j := newDrvJob(t, "raw", 1)
			j.driver, j.noCommand, j.noIdentity = "raw_exec", true, true
			return j.hcl(t)
		}()},
		{"lb-plain", newLBJob(t, lb, "plain", 2).hcl(t)},
		{"lb-full", fullLB.hcl(t)},
		{"lock-plain", jobHCL("lock-plain", "service", group{command: "/bin/true"})},
		{"lock-full", jobHCL("lock-full", "batch",
			group{name: "a", count: 2, failFast: true, driver: "exec", command: "c", args: []string{"x"},
				env: map[string]string{"K": "V"}, identityFile: true, volumes: vols, extra: "disconnect {}"},
			group{name: "b", command: "d"})},
		{"trust-plain", trustJob("trust-plain", "", "", "", "echo hi")},
		{"trust-full", trustJob("trust-full", "root", "        share_nomad_token = true\n", "    network {\n      port \"http\" {}\n    }\n", `echo "$X"`)},
		{"gate-raw-exec", newGateJob(t, "raw_exec", records).hcl(t)},
		{"gate-full", fullGate.hcl(t)},
	}
	for _, c := range cases {
		body, id, err := harness.ParseJobspec(c.hcl)
		if err != nil {
			t.Errorf("%s: %v\n%s", c.id, err, c.hcl)
			continue
		}
		if id != c.id {
			t.Errorf("%s: job %q", c.id, id)
		}
		if len(body.Blocks) == 0 {
			t.Errorf("%s: job %q has no groups:\n%s", c.id, id, c.hcl)
		}
	}
}
