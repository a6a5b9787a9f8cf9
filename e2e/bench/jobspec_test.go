package bench

import (
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestBenchJobspecs renders the bench's job of every variant (with and
// without a load balancer, and the HAProxy scenario's) and checks that each
// is HCL with one job block of the job's ID. It needs no agent.
func TestBenchJobspecs(t *testing.T) {
	b := &bench{workload: "/bin/testworkload", lockBin: "/bin/lock", nomadBin: "/bin/nomad", records: t.TempDir(),
		docker: &harness.Docker{Image: "singleton-e2e:test"}}
	check := func(name, id, hcl string) {
		t.Helper()
		if _, got, err := harness.ParseJobspec(hcl); err != nil || got != id {
			t.Errorf("%s: job %q, %v\n%s", name, got, err, hcl)
		}
	}
	for _, v := range []string{VariantAnchor, VariantLock, VariantDriver, VariantRawExec, VariantGate, VariantGateRaw, VariantLockSlot, VariantDriverSlot} {
		j := b.newJob("jobspec", v, 2)
		j.failFast = true
		check(v, j.id, b.hcl(j))
		if v == VariantLock || v == VariantDriver {
			j.lbURI, j.lbService = "http://127.0.0.1:1", "svc"
			check(v+" with LB", j.id, b.hcl(j))
			check(v+" HAProxy", j.id, b.haproxyHCL(j))
		}
	}
}
