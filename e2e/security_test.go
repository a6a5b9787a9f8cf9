package e2e

// Security checks on a real agent: secrets stay out of argv, logs and task
// events; the lock ID never reaches the workload; the driver's state dir is
// root-only; denied host UIDs are refused before anything starts.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// secDeniedUID is denied by the plugin config of TestSecurity's agent.
const secDeniedUID = 65534 // nobody

func TestSecurity(t *testing.T) {
	t.Parallel()
	harness.BuildTestWorkload(t)
	opts := drvAgentOptions(t, true)
	std := harness.SingletonPluginConfig(drvTTLHCL, drvDelayHCL)
	for i, c := range opts.Config {
		if c == std {
			opts.Config[i] = harness.SingletonPluginConfigSafe(drvTTLHCL, drvDelayHCL,
				"allow_root = true", `default_user = "root"`, fmt.Sprintf("denied_host_uids = \"%d\"", secDeniedUID))
		}
	}
	a := harness.StartAgent(t, opts)
	runConcurrently(t, []subtest{
		{"secrets_not_exposed", func(t *testing.T) { testSecSecrets(t, a) }},
		{"denied_host_uid", func(t *testing.T) { testSecDeniedUID(t, a) }},
	})
}

// testSecSecrets: a singleton job with an LB that requires an auth key. The
// workload identity token and the auth key appear in no process's argv
// (/proc/*/cmdline), in no agent or task log and in no task event; the lock
// ID is not in the workload's environment; the state dir is 0700 root and
// a non-root user cannot read its files.
func testSecSecrets(t *testing.T, a *harness.Agent) {
	key := fmt.Sprintf("authkey-%d-secret", time.Now().UnixNano())
	lb := harness.StartLB(t, lbapi.Options{Groups: []lbapi.Group{{Name: lbGroup}}, WorkerInterval: lbWorkerInterval, AuthKeys: []string{key}})
	j := newLBJob(t, lb, "sec", 2)
	j.authkey = key
	j.run(t, a)
	first := j.lbHolder(t, a)
	lbWaitSuccess(t, lb, lbAddID(first.AllocID, drvFence(t, first)), 60*time.Second)

	env, err := harness.ReadEnviron(first.PID)
	if err != nil {
		t.Fatal(err)
	}
	supEnv, err := harness.ReadEnviron(drvSupervisor(t, first.AllocID).PID)
	if err != nil {
		t.Fatal(err)
	}
	token := harness.Getenv(supEnv, "NOMAD_TOKEN")
	if len(token) < 16 {
		t.Fatalf("the supervisor has no usable NOMAD_TOKEN (%q): the check would prove nothing", token)
	}
	// The workload holds neither the token (it can write the lock path)
	// nor the LB auth key.
	for _, name := range []string{"NOMAD_TOKEN", "SINGLETON_LB_AUTHKEY"} {
		if v := harness.Getenv(env, name); v != "" {
			t.Errorf("the workload's environment has %s", name)
		}
	}
	v := drvLock(t, a, j.lockPath())
	if v.Lock == nil || v.Lock.ID == "" {
		t.Fatalf("lock not held: %+v", v)
	}
	lockID := v.Lock.ID
	secrets := map[string]string{"workload identity token": token, "LB auth key": key, "lock ID": lockID}

	// argv of every process on the machine.
	entries, _ := os.ReadDir("/proc")
	scanned := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		argv, err := harness.ReadCmdline(pid)
		if err != nil {
			continue
		}
		scanned++
		joined := strings.Join(argv, " ")
		for what, s := range secrets {
			if strings.Contains(joined, s) {
				t.Errorf("the %s is in the argv of pid %d: %q", what, pid, argv)
			}
		}
	}
	t.Logf("scanned the argv of %d processes", scanned)

	// The lock ID never reaches the workload.
	for _, kv := range env {
		if strings.Contains(kv, lockID) {
			t.Errorf("the lock ID is in the workload's environment: %s", strings.SplitN(kv, "=", 2)[0])
		}
	}
	// Logs (agent log, task stdout/stderr) and task events of every alloc.
	texts := map[string]string{}
	if b, err := os.ReadFile(a.Client().LogPath()); err == nil {
		texts["agent log"] = string(b)
	}
	for _, id := range drvRunning(t, a, j.id) {
		texts["stdout of "+drvShort(id)] = a.AllocLogs(t, id, drvTask, "stdout")
		texts["stderr of "+drvShort(id)] = a.AllocLogs(t, id, drvTask, "stderr")
		var evs strings.Builder
		for _, ev := range drvEvents(t, a, id) {
			evs.WriteString(drvEventText(ev) + "\n")
		}
		texts["task events of "+drvShort(id)] = evs.String()
	}
	for where, text := range texts {
		for what, s := range secrets {
			if what != "lock ID" && strings.Contains(text, s) {
				t.Errorf("the %s appears in the %s", what, where)
			}
		}
	}

	// The state dir: outside the task dir, root-only, unreadable for another user.
	dir := drvStateDir(t, first.AllocID)
	if taskDir := a.TaskDir(first.AllocID, drvTask); strings.HasPrefix(dir, taskDir) {
		t.Errorf("state dir %s is inside the task dir %s, which the task user can write", dir, taskDir)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o700 || st.Uid != 0 {
		t.Errorf("state dir %s: mode %v uid %d, want 0700 root", dir, fi.Mode().Perm(), st.Uid)
	}
	files, _ := os.ReadDir(dir)
	if len(files) == 0 {
		t.Fatalf("state dir %s is empty", dir)
	}
	for _, f := range files {
		cmd := exec.Command("/bin/cat", filepath.Join(dir, f.Name()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: secDeniedUID, Gid: secDeniedUID}}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Permission denied") {
			t.Errorf("uid %d could read %s (err %v): %.80q", secDeniedUID, f.Name(), err, out)
		}
	}
}

// testSecDeniedUID: a task whose user is a denied host UID fails with an
// event naming the plugin option, and nothing is started or left behind.
func testSecDeniedUID(t *testing.T, a *harness.Agent) {
	j := newDrvJob(t, "denied-uid", 1)
	j.user = "nobody"
	j.failFast = true
	j.run(t, a)
	allocs := a.WaitAllocs(t, j.id, 1, api.AllocClientStatusFailed, 60*time.Second)
	drvWaitEvent(t, a, allocs[0].ID, 10*time.Second, `task user "nobody" is not allowed on this client`, "denied_host_uids")
	if recs := j.records(t); len(recs) != 0 {
		t.Errorf("the workload ran as a denied user: %+v", recs)
	}
	if procs, err := harness.SupervisorProcs(allocs[0].ID); err != nil || len(procs) != 0 {
		t.Errorf("supervisor processes left behind: %v %v", procs, err)
	}
	if v, _, err := a.API().Variables().Peek(j.lockPath(), nil); err != nil || v != nil {
		t.Errorf("lock variable %s: %+v, %v; want it never created", j.lockPath(), v, err)
	}
}
