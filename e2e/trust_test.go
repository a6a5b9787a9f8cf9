package e2e

// The trust boundary on a real agent, with the plugin's default config for
// who tasks run as: a job submitter and a task user never get root's powers.
// Each subtest replays an attack that worked before the state moved out of
// the task dir, and asserts that nothing was written, read, run or killed
// outside the task.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

const nobodyUID = 65534

func TestTrustBoundary(t *testing.T) {
	t.Parallel()
	opts := drvAgentOptions(t, true)
	std := harness.SingletonPluginConfig(drvTTLHCL, drvDelayHCL)
	for i, c := range opts.Config {
		if c == std {
			opts.Config[i] = harness.SingletonPluginConfigSafe(drvTTLHCL, drvDelayHCL)
		}
	}
	a := harness.StartAgent(t, opts)
	runConcurrently(t, []subtest{
		{"no_user_runs_as_nobody_without_token", func(t *testing.T) { testTrustDefaultUser(t, a) }},
		{"root_refused_by_default", func(t *testing.T) { testTrustRootRefused(t, a) }},
		{"share_nomad_token_opt_in", func(t *testing.T) { testTrustShareToken(t, a) }},
		{"state_dir_swap_fails", func(t *testing.T) { testTrustStateSwap(t, a) }},
		{"job_named_files_outside_secrets", func(t *testing.T) { testTrustJobFiles(t, a) }},
	})
}

// trustJob renders a one-task batch job (no restarts) running sh -c script
// (no "${" in it: Nomad interpolates driver config twice), with
// harness/jobs/trust.nomad.hcl.tmpl. configExtra and groupExtra are HCL
// lines added to the config and group blocks as they are.
func trustJob(id, user, configExtra, groupExtra, script string) string {
	return harness.Jobspec("trust", struct {
		ID, Group, Task, Driver, User, TTL, Delay, ConfigExtra, GroupExtra string
		Args                                                               []string
	}{
		ID: id, Group: drvGroup, Task: drvTask, Driver: harness.PluginDriverName, User: user, TTL: drvTTLHCL, Delay: drvDelayHCL,
		ConfigExtra: strings.TrimSuffix(configExtra, "\n"), GroupExtra: strings.TrimSuffix(groupExtra, "\n"),
		Args: []string{"-c", script},
	})
}

func trustRun(t *testing.T, a *harness.Agent, id, hcl string) {
	t.Helper()
	a.RunJobHCL(t, hcl)
	t.Cleanup(func() { _ = a.Purge(id) })
}

// A task without `user` runs as nobody, and its workload holds no
// NOMAD_TOKEN, though the supervisor took the lock with it.
func testTrustDefaultUser(t *testing.T, a *harness.Agent) {
	id := "trust-default-user"
	trustRun(t, a, id, trustJob(id, "", "", "", `echo "uid=$(id -u) token=[$NOMAD_TOKEN] fence=$NOMAD_LOCK_FENCE"; ls -a`))
	allocs := a.WaitAllocs(t, id, 1, api.AllocClientStatusComplete, 60*time.Second)
	out := a.WaitAllocLog(t, allocs[0].ID, drvTask, "stdout", 10*time.Second, "uid=")
	if !strings.Contains(out, fmt.Sprintf("uid=%d ", nobodyUID)) {
		t.Errorf("a task without user must run as nobody (uid %d):\n%s", nobodyUID, out)
	}
	if !strings.Contains(out, "token=[]") {
		t.Errorf("the workload has NOMAD_TOKEN:\n%s", out)
	}
	if strings.Contains(out, "fence=\n") || !strings.Contains(out, "fence=") {
		t.Errorf("the workload ran without the lock (no NOMAD_LOCK_FENCE):\n%s", out)
	}
	if strings.Contains(out, ".singleton") {
		t.Errorf("driver state in the task dir:\n%s", out)
	}
}

// user = "root" is refused under the default plugin config, with an error
// that names the option, and nothing runs.
func testTrustRootRefused(t *testing.T, a *harness.Agent) {
	id := "trust-root"
	marker := filepath.Join(t.TempDir(), "ran")
	trustRun(t, a, id, trustJob(id, "root", "", "", "touch "+marker))
	allocs := a.WaitAllocs(t, id, 1, api.AllocClientStatusFailed, 60*time.Second)
	drvWaitEvent(t, a, allocs[0].ID, 10*time.Second, "would run as root", "allow_root = true", "`user`")
	if _, err := os.Stat(marker); err == nil {
		t.Error("the workload ran as root")
	}
}

// share_nomad_token = true hands the token on, for workloads that use the
// Task API themselves.
func testTrustShareToken(t *testing.T, a *harness.Agent) {
	id := "trust-share-token"
	trustRun(t, a, id, trustJob(id, "", "        share_nomad_token = true\n", "", `echo "token-length=$(printf %s "$NOMAD_TOKEN" | wc -c)"`))
	allocs := a.WaitAllocs(t, id, 1, api.AllocClientStatusComplete, 60*time.Second)
	out := a.WaitAllocLog(t, allocs[0].ID, drvTask, "stdout", 10*time.Second, "token-length=")
	if strings.Contains(out, "token-length=0") {
		t.Errorf("share_nomad_token = true, but the workload has no NOMAD_TOKEN:\n%s", out)
	}
}

// The attacks on the plugin's state, from the task user (nobody) and from
// another local user: find the state dir in the supervisor's argv, list it,
// rename it, plant a symlink in it; plant a forged .singleton/ in the task
// dir with a foreign victim's process group, a symlink to a root-only file
// and a FIFO. Nothing may be read, written or killed: the victim process
// lives, the root-only file is unchanged, the state dir stays root's.
func testTrustStateSwap(t *testing.T, a *harness.Agent) {
	victimFile := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(victimFile, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	victim := exec.Command("/bin/sleep", "3600")
	victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	exited := make(chan struct{})
	go func() { _ = victim.Wait(); close(exited) }()

	attack := `d=""
for p in /proc/[0-9]*; do
  a=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
  case "$a" in *__singleton-supervise*"$ALLOC"*) d=$(echo "$a" | cut -d' ' -f3);; esac
done
echo "statedir=$d"
[ -n "$d" ] || exit 3
ls "$d" >/dev/null 2>&1 && echo ATTACK-LISTED || echo list-denied
cat "$d/spec.json" >/dev/null 2>&1 && echo ATTACK-READ || echo read-denied
mv "$d" "$d.x" 2>/dev/null && echo ATTACK-MOVED || echo move-denied
ln -s VICTIMFILE "$d/status.json.tmp" 2>/dev/null && echo ATTACK-LINKED || echo link-denied
mkdir "$d.y" 2>/dev/null && echo ATTACK-MKDIR || echo mkdir-denied
`
	attack = strings.ReplaceAll(attack, "VICTIMFILE", victimFile)
	plant := fmt.Sprintf(`mkdir -p .singleton
printf '{"State":"holding","FenceDeadlineBoot":1,"WorkloadPGID":%d,"WorkloadPID":1}' > .singleton/status.json
ln -s %s .singleton/status.json.tmp
mkfifo .singleton/spec.json.tmp
echo planted
exec sleep 3600
`, victim.Process.Pid, victimFile)

	id := "trust-swap"
	hcl := strings.Replace(trustJob(id, "", "", "", "ALLOC=$NOMAD_ALLOC_ID\n"+attack+plant), `type = "batch"`, `type = "service"`, 1)
	trustRun(t, a, id, hcl)
	allocs := a.WaitAllocs(t, id, 1, api.AllocClientStatusRunning, 60*time.Second)
	alloc := allocs[0].ID
	out := a.WaitAllocLog(t, alloc, drvTask, "stdout", 30*time.Second, "planted")
	t.Logf("the task user's attack:\n%s", out)
	for _, want := range []string{"list-denied", "read-denied", "move-denied", "link-denied", "mkdir-denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("task user attack: want %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ATTACK-") || !strings.Contains(out, "statedir=/") {
		t.Errorf("task user attack got through:\n%s", out)
	}

	// Another local user tries the same against the running task.
	local := exec.Command("/bin/sh", "-c", "ALLOC="+alloc+"\n"+attack)
	local.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyUID}}
	local.Dir = "/"
	lout, _ := local.CombinedOutput()
	if strings.Contains(string(lout), "ATTACK-") || !strings.Contains(string(lout), "move-denied") {
		t.Errorf("local user attack got through:\n%s", lout)
	}

	// Let the supervisor publish its status twice more (two renews): each
	// write would have followed the planted symlink, and the watchdog reads
	// the status every 100ms.
	drvWaitRenew(t, a, alloc, 30*time.Second)
	drvWaitRenew(t, a, alloc, 30*time.Second)
	select {
	case <-exited:
		t.Error("the victim process group, named in the forged status, was killed")
	default:
	}
	if b, _ := os.ReadFile(victimFile); string(b) != "untouched" {
		t.Errorf("the root-only file was written: %q", b)
	}
	dir := drvStateDir(t, alloc)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("state dir %s: %v %v, want a 0700 root directory", dir, fi.Mode(), err)
	}
	if st := drvReadStatus(t, a, alloc); !strings.HasPrefix(st.State, "holding") && st.State != "healthy" && st.State != "registered" {
		t.Errorf("the task does not hold its lock any more: %+v", st)
	}
	if evs := drvMatching(drvEvents(t, a, alloc), "watchdog"); len(evs) > 0 {
		t.Errorf("the watchdog acted on the forged status: %s", drvFormatEvents(evs))
	}
}

// load_balancer.authkey_file and ca_file that name files outside the task's
// secrets dir (a root-only secret, a FIFO) are refused at start with the
// fix in the message; the LB URI the job chose receives nothing, and a FIFO
// no longer hangs the plugin.
func testTrustJobFiles(t *testing.T, a *harness.Agent) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		t.Logf("LB listener got %s %s", r.Method, r.URL.Redacted())
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	secret := filepath.Join(dir, "root-secret")
	if err := os.WriteFile(secret, []byte("root-only-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, field, path string }{
		{"secret", "authkey_file", secret},
		{"fifo", "authkey_file", fifo},
		{"escape", "authkey_file", "secrets/../../../../../../../.." + secret},
		{"ca", "ca_file", "/etc/shadow"},
	}
	for _, c := range cases {
		id := "trust-files-" + c.name
		lb := fmt.Sprintf("        load_balancer {\n          uri = %q\n          service_id = %q\n          base_path = \"/x\"\n"+
			"          groups = [\"g\"]\n          port = \"http\"\n          %s = %q\n        }\n", srv.URL+"/baragon/v2/request", id, c.field, c.path)
		trustRun(t, a, id, trustJob(id, "", lb, "    network {\n      port \"http\" {}\n    }\n", "sleep 60"))
		allocs := a.WaitAllocs(t, id, 1, api.AllocClientStatusFailed, 60*time.Second)
		drvWaitEvent(t, a, allocs[0].ID, 10*time.Second, "config.load_balancer."+c.field, "secrets")
		if evs := drvMatching(drvEvents(t, a, allocs[0].ID), "root-only-key"); len(evs) > 0 {
			t.Errorf("%s: the secret's content is in a task event", c.name)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the LB URI named by the jobs got %d requests", n)
	}
}
