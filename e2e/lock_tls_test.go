package e2e

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestLockMutualTLS: against an agent that serves its HTTP API over HTTPS
// alone and asks every client for a certificate its CA signed (tls { http
// = true, verify_https_client = true }; the certificates are made here),
// one lock holds the lock, given Nomad's TLS flags and no NOMAD_* variable;
// a second, given the NOMAD_* variables and no flag, waits, and takes the
// lock the moment the first stops: no overlap, a larger fence. lock status
// reads it the same two ways; without a client certificate the agent turns
// lock away.
func TestLockMutualTLS(t *testing.T) {
	t.Parallel()
	certs := harness.NewTLS(t)
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, TLS: certs})
	if !strings.HasPrefix(a.Addr(), "https://") {
		t.Fatalf("the agent serves %s, want https", a.Addr())
	}
	s := newScenario(t, "mtls")
	tlsFlags := []string{"-address", a.Addr(), "-ca-cert", certs.CA.Cert, "-client-cert", certs.Client.Cert,
		"-client-key", certs.Client.Key, "-tls-server-name", harness.TLSServerName}
	noNomadEnv := harness.WithoutNomadEnv(os.Environ())
	lockWith := func(env []string, args ...string) *harness.Process {
		cmd := exec.Command(harness.LockBin(t), args...)
		cmd.Env = env
		return harness.StartProcess(t, cmd)
	}

	byFlags := lockWith(noNomadEnv, append(lockArgs(s.path, tlsFlags...), s.workloadArgv(t)...)...)
	first := waitMainStart(t, s.record, 60*time.Second, nil)
	byVars := lockWith(append(noNomadEnv, a.Env()...), append(lockArgs(s.path), s.workloadArgv(t)...)...)
	byVars.WaitOutput("lock is held, waiting", 30*time.Second)

	heldRE := regexp.MustCompile(`(?m)^Held\s+= true$`)
	status := func(env []string, args ...string) (int, string) {
		p := lockWith(env, append(append([]string{"status"}, args...), s.path)...)
		return p.Wait(30 * time.Second), p.Stdout() + p.Stderr()
	}
	if code, out := status(noNomadEnv, tlsFlags...); code != 0 || !heldRE.MatchString(out) {
		t.Errorf("lock status with the TLS flags: exit %d\n%s", code, out)
	}
	if code, out := status(append(noNomadEnv, a.Env()...)); code != 0 || !heldRE.MatchString(out) {
		t.Errorf("lock status with the NOMAD_* variables: exit %d\n%s", code, out)
	}
	// Mutual TLS is enforced: the CA alone does not get lock in.
	if code, out := status(noNomadEnv, "-address", a.Addr(), "-ca-cert", certs.CA.Cert); code == 0 {
		t.Errorf("lock status without a client certificate got in (exit 0):\n%s", out)
	} else {
		t.Logf("without a client certificate: exit %d: %s", code, strings.TrimSpace(out))
	}

	sampler := harness.StartSampler(t, harness.SamplerOptions{Marker: s.marker, Filter: harness.Proc.IsMainWorkload})
	if err := byFlags.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := byFlags.Wait(30 * time.Second); code != 0 {
		t.Errorf("the first lock exited %d on SIGTERM, want its workload's 0; stderr:\n%s", code, byFlags.Stderr())
	}
	next := waitMainStart(t, s.record, 30*time.Second, func(r harness.Record) bool { return r.Instance != first.Instance })
	sum := sampler.Stop()
	harness.CheckNoOverlap(t, readRecords(t, s.record), sum)
	if f1, f2 := fence(t, first), fence(t, next); f2 <= f1 {
		t.Errorf("fence did not grow over HTTPS: %d, then %d", f1, f2)
	}
	if err := byVars.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := byVars.Wait(30 * time.Second); code != 0 {
		t.Errorf("the second lock exited %d, want 0; stderr:\n%s", code, byVars.Stderr())
	}
}
