package driver

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// gateSpecFile is a gate's spec.json as this plugin writes it, for tests
// that need one on disk.
func gateSpecFile(g shim.GateSpec) supervisorSpec {
	return supervisorSpec{Run: shim.Spec{Version: shim.SpecVersion, Gate: &g}}
}

// specThroughFile is the run the supervisor reads back from the spec.json
// the plugin wrote for spec.
func specThroughFile(t *testing.T, spec supervisorSpec) shim.Spec {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("spec.json: %v", err)
	}
	back, err := decodeSpec(b)
	if err != nil {
		t.Fatalf("read spec.json back: %v", err)
	}
	return back.Run
}

// legacyGateSpec is a gate's spec.json as the plugins before the recorded
// version wrote it (main at aa8bd1d), with a load balancer, in lease mode.
const legacyGateSpec = `{"TaskID":"a1/gate/1","Gate":{"AllocID":"a1","Task":"gate","Namespace":"prod",` +
	`"Adopt":{"LockID":"l-1","Fence":7,"FenceBoot":123},"DockerEndpoint":"unix:///var/run/docker.sock"},` +
	`"Path":"nomad/jobs/web/g/gate/lock","Namespace":"prod","Holders":2,"AllocIndex":1,"Command":null,` +
	`"TTL":15000000000,"LockDelay":5000000000,"Renew":0,"Wait":0,"UpdateGrace":-1,"KillSignal":2,"KillSigSet":true,` +
	`"KillTimeout":4000000000,"Mode":"lease","LeaseProfile":"aggressive","LeaseKillGrace":3000000000,` +
	`"LB":{"URI":"http://lb/baragon/v2/request","ServiceID":"web","Port":"http","RemoveDeadline":"7s","RequestTimeout":"3s"},` +
	`"Health":{"Type":"tcp"},"CgroupProcs":["/sys/fs/cgroup/x/cgroup.procs"],"CgroupMode":2,"CgroupPath":"/sys/fs/cgroup/x",` +
	`"WorkDir":"/alloc/gate","UID":65534,"GID":65534,"Groups":null,` +
	`"Holder":{"AllocID":"a1","JobID":"web","Group":"g","Task":"gate","Node":"n1"},"SecretsDir":"/alloc/gate/secrets",` +
	`"ShareNomadToken":false,"DeniedEnvvars":["AWS_*"],"OOMScoreAdj":10,"OOMKillsAtStart":3}`

// A plugin upgrade keeps the tasks the older plugin started (their
// supervisors, of the older build, run on): this plugin reads their
// spec.json, whose lock settings are fields of its own, as it reads its
// own, and what it acts on comes out the same.
func TestLegacySpecIsRead(t *testing.T) {
	spec, err := decodeSpec([]byte(legacyGateSpec))
	if err != nil {
		t.Fatal(err)
	}
	run := spec.Run
	g := run.Gate
	if g == nil || g.AllocID != "a1" || g.Task != "gate" || g.Namespace != "prod" || g.Adopt == nil || g.Adopt.Fence != 7 ||
		g.Adopt.FenceBoot != 123 || spec.DockerEndpoint != "unix:///var/run/docker.sock" {
		t.Errorf("gate %+v, docker endpoint %q", g, spec.DockerEndpoint)
	}
	if run.Path != "nomad/jobs/web/g/gate/lock" || run.Namespace != "prod" || run.Holders != 2 || run.AllocIndex != 1 ||
		run.TTL != 15*time.Second || run.LockDelay != 5*time.Second || run.UpdateGrace != shim.DurationOff ||
		run.KillSignal != syscall.SIGINT || !run.KillSignalSet || run.KillTimeout != 4*time.Second ||
		run.Mode != shim.ModeLease || run.LeaseProfile != shim.ProfileAggressive || run.LeaseKillGrace != 3*time.Second ||
		run.RootSecretsDir != "/alloc/gate/secrets" {
		t.Errorf("lock settings %+v", run.Config)
	}
	if hb := run.Heartbeat(); hb == nil || hb.KillGrace != 3*time.Second {
		t.Errorf("lease mode's heartbeat %+v, want lease_kill_grace 3s", hb)
	}
	if spec.legacyLBReserve != 10*time.Second {
		t.Errorf("the LB's REMOVE reserve %s, want remove_deadline 7s + request_timeout 3s", spec.legacyLBReserve)
	}
	if run.Holder.AllocID != "a1" || run.Holder.Node != "n1" || spec.TaskID != "a1/gate/1" {
		t.Errorf("holder %+v, task %s", run.Holder, spec.TaskID)
	}
	if spec.CgroupPath != "/sys/fs/cgroup/x" || spec.CgroupMode != 2 || spec.UID == nil || *spec.UID != 65534 ||
		spec.OOMKillsAtStart == nil || *spec.OOMKillsAtStart != 3 || spec.OOMScoreAdj != 10 || spec.WorkDir != "/alloc/gate" {
		t.Errorf("task process %+v", spec.taskProcess)
	}

	onLock := strings.Replace(legacyGateSpec, `"Gate":{"AllocID":"a1","Task":"gate","Namespace":"prod",`+
		`"Adopt":{"LockID":"l-1","Fence":7,"FenceBoot":123},"DockerEndpoint":"unix:///var/run/docker.sock"},`, `"StartOnLock":true,`, 1)
	spec, err = decodeSpec([]byte(onLock))
	if err != nil {
		t.Fatal(err)
	}
	if w := spec.Run.WatchAlloc; spec.Run.Gate != nil || w == nil || w.AllocID != "a1" || w.Namespace != "prod" || w.Who != onLockWho {
		t.Errorf("a start = \"on_lock\" task: gate %v, watch %+v", spec.Run.Gate, w)
	}
}

// A task whose state a later plugin wrote is refused, with the way out,
// never read as something it is not.
func TestSpecOfALaterVersionIsRefused(t *testing.T) {
	_, err := decodeSpec([]byte(`{"Run":{"Version":99,"Path":"p"}}`))
	if err == nil || !strings.Contains(err.Error(), "version 99") || !strings.Contains(err.Error(), "install that plugin version") {
		t.Fatalf("error %v, want one naming the version and the way out", err)
	}
	if err := checkSpecVersion(0); err == nil {
		t.Error("version 0 read as a known one")
	}
	for _, v := range []int{legacySpecVersion, shim.SpecVersion} {
		if err := checkSpecVersion(v); err != nil {
			t.Errorf("version %d: %v", v, err)
		}
	}
}

// LockConfig is a task's config.lock block in tests.
type LockConfig = shim.LockValues

// taskWithLock is a task config that runs command with lock as its
// config.lock block.
func taskWithLock(command string, lock LockConfig) TaskConfig {
	tc := TaskConfig{Command: command}
	tc.Lock = lock
	return tc
}
