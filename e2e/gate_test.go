package e2e

// The gate: a singleton task (config { gate = true }, a prestart sidecar)
// holds the lock for the other tasks of its group, of any driver. Only the
// holder's allocation ever runs them, across every way a holder ends.

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// gateKinds are the drivers of the gated task that TestGate runs.
var gateKinds = []string{"docker", "raw_exec", "exec"}

func TestGate(t *testing.T) {
	t.Parallel()
	harness.Smoke(t, "docker_never_twice", "raw_exec_never_twice")
	workload := harness.BuildTestWorkload(t)
	records := t.TempDir()
	if err := os.Chmod(records, 0o777); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, true)
	opts.HostVolumes = map[string]string{"worker-bin": filepath.Dir(workload), "worker-data": records}
	opts.ChrootEnv = map[string]string{"/etc/hosts": "/etc/hosts"}
	opts.Docker = harness.StartDocker(t)
	opts.RequireDrivers = append(opts.RequireDrivers, "docker")
	a := harness.StartAgent(t, opts)
	var subtests []subtest
	for _, kind := range gateKinds {
		subtests = append(subtests, subtest{kind + "_never_twice", func(t *testing.T) {
			testGateNeverTwice(t, a, newGateJob(t, kind, records), opts.Docker)
		}})
	}
	subtests = append(subtests,
		subtest{"unsafe_jobs_are_refused", func(t *testing.T) { testGateRefusesUnsafeJobs(t, a, records) }},
		subtest{"docker_update_replaces_the_group_at_once", func(t *testing.T) { testGateUpdateAtOnce(t, a, records, opts.Docker) }},
		subtest{"rolling_deployment_with_count_1", func(t *testing.T) { testGateRollingDeployment(t, a, records) }},
		subtest{"gate_workload_killed", func(t *testing.T) { testGateWorkloadKilled(t, a, records) }},
		subtest{"docker_load_balancer", func(t *testing.T) { testGateLB(t, a, records, opts.Docker) }},
		subtest{"load_balancer_add_refused", func(t *testing.T) { testGateLBAddRefused(t, a, records) }},
	)
	runConcurrently(t, subtests)
}

// gateJob is a count = 2 job whose group has a gate and one gated task of
// kind (raw_exec, exec, docker) running the testworkload, with an HTTP port
// and a Nomad service. The docker and exec jobs are the examples
// (examples/gate-docker.nomad.hcl, examples/gate-exec.nomad.hcl) run with
// variables; raw_exec's is built here.
type gateJob struct {
	id, kind, marker string
	// group, app and svc are the group, the gated task and its service.
	group, app, svc string
	// example is the jobspec in examples/ ("" to build one).
	example    string
	record     string // on the host
	taskRecord string // as the gated task sees it
	// gateExtra is added to the gate task; appExtra to the gated task;
	// groupExtra to the group; appRestart, when set, is the body of the
	// gated task's restart block (built job only).
	gateExtra, appExtra, groupExtra, appRestart string
	// gateRestart and appKill override the gate's restart block and the
	// gated task's kill_timeout.
	gateRestart, appKill string
	// image is the docker kind's image (harness.Docker.Image).
	image string
	// count (default 2) and update (the group's update block body; "" for
	// none) of the built job; extraArgs are appended to the app's args.
	count     int
	update    string
	extraArgs []string
	// gateMarker, if set, gives the gate a command of its own: the
	// testworkload with this marker (and no record).
	gateMarker string
	// lb, if set, gives the gate's config load_balancer and health_check
	// blocks (built jobs).
	lb *lbSpec
	// noService leaves out the gated task's Nomad service (built jobs).
	noService bool
	// ttl and delay override the gate's lock ttl and delay (built jobs;
	// default drvTTLHCL and drvDelayHCL).
	ttl, delay string
	// holders, above 0, makes the gate's lock a semaphore of that many
	// slots (built jobs).
	holders int
	// lockExtra is HCL added to the gate's lock block (built jobs), each
	// line starting with a newline.
	lockExtra string
	// termOK lets the docker kind's app stop on SIGTERM (and record its
	// stop) instead of ignoring it.
	termOK bool
}

// newGateJobID is a built (not example) job of kind with the job ID id:
// group "g", gated task "app".
func newGateJobID(t *testing.T, id, kind, records string) *gateJob {
	j := newGateJob(t, "raw_exec", records)
	j.id, j.kind, j.svc = id, kind, id+"-app"
	j.marker = fmt.Sprintf("%s-%d", id, time.Now().UnixNano())
	j.record, j.taskRecord = filepath.Join(records, id+".jsonl"), filepath.Join(records, id+".jsonl")
	if kind == "docker" {
		j.taskRecord = "/records/" + id + ".jsonl"
	}
	return j
}

func newGateJob(t *testing.T, kind, records string) *gateJob {
	id := "gate-" + strings.ReplaceAll(kind, "_", "-")
	j := &gateJob{id: id, kind: kind, group: "g", app: "app", svc: id + "-app",
		gateRestart: "attempts = 0\n        mode     = \"fail\"", appKill: "3s"}
	switch kind {
	case "docker":
		j.id, j.group, j.app, j.svc, j.example = "web", "web", "api", "web", "gate-docker.nomad.hcl"
		j.taskRecord = "/records/" + j.id + ".jsonl"
	case "exec":
		j.id, j.group, j.app, j.svc, j.example = "worker", "worker", "worker", "worker", "gate-exec.nomad.hcl"
		j.taskRecord = "/data/" + j.id + ".jsonl"
	}
	j.marker = fmt.Sprintf("%s-%d", j.id, time.Now().UnixNano())
	j.record = filepath.Join(records, j.id+".jsonl")
	if j.taskRecord == "" {
		j.taskRecord = j.record
	}
	return j
}

func (j *gateJob) lockPath() string { return fmt.Sprintf("nomad/jobs/%s/%s/gate/lock", j.id, j.group) }
func (j *gateJob) service() string  { return j.svc }

// run registers the job (the example with its variables, or the built one).
func (j *gateJob) run(t *testing.T, a *harness.Agent) {
	t.Helper()
	if j.example == "" {
		a.RunJobHCL(t, j.hcl(t))
		return
	}
	src, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", j.example))
	if err != nil {
		t.Fatal(err)
	}
	// The app is the testworkload; as real images often are, its PID 1
	// ignores SIGTERM under docker, so every stop there takes the whole
	// kill_timeout and ends in SIGKILL.
	vars := ""
	switch j.kind {
	case "docker":
		vars = fmt.Sprintf("image = %q\ncommand = %q\nvolumes = [\"%s:/records\"]\n",
			j.image, harness.ImageWorkloadPath, filepath.Dir(j.record))
	case "exec":
		vars = fmt.Sprintf("command = %q\n", "/opt/worker/"+filepath.Base(harness.BuildTestWorkload(t)))
	}
	vars += "args = " + harness.HCLList(j.appArgs("$${NOMAD_PORT_http}")...) + "\n"
	a.RunJobHCLVars(t, string(src), vars)
}

// appArgs are the gated testworkload's arguments: its record, marker and
// HTTP port (portRef, as the jobspec or a variables file must spell it),
// then extraArgs. Under docker its PID 1 ignores SIGTERM, as real images
// often do, so every stop takes the whole kill_timeout and ends in SIGKILL.
func (j *gateJob) appArgs(portRef string) []string {
	args := []string{"-record", j.taskRecord, "-marker", j.marker, "-http", "127.0.0.1:" + portRef}
	if j.kind == "docker" && !j.termOK {
		args = append(args, "-ignore-term")
	}
	return append(args, j.extraArgs...)
}

// hcl renders the built job with harness/jobs/gate.nomad.hcl.tmpl.
func (j *gateJob) hcl(t *testing.T) string {
	var gateArgs, volumes []string
	command, service := harness.BuildTestWorkload(t), j.svc
	if j.gateMarker != "" {
		gateArgs = []string{"-marker", j.gateMarker}
	}
	if j.noService {
		service = ""
	}
	appCommand := command
	if j.kind == "docker" {
		appCommand, volumes = harness.ImageWorkloadPath, []string{filepath.Dir(j.record) + ":/records"}
	}
	return harness.Jobspec("gate", struct {
		ID, Group, Update, Driver, GateRestart, Command, TTL, Delay string
		GateExtra, App, Kind, Image, AppCommand, LockExtra          string
		AppKill, Service, AppExtra, GroupExtra, AppRestart          string
		Count, Holders                                              int
		GateArgs, Args, Volumes                                     []string
		LB                                                          *lbSpec
	}{
		ID: j.id, Group: j.group, Update: j.update, Driver: harness.PluginDriverName, GateRestart: j.gateRestart,
		Command: command, TTL: cmp.Or(j.ttl, drvTTLHCL), Delay: cmp.Or(j.delay, drvDelayHCL),
		LB: j.lb, GateExtra: j.gateExtra, LockExtra: j.lockExtra, App: j.app, Kind: j.kind, Image: j.image, AppCommand: appCommand,
		AppKill: j.appKill, Service: service, AppExtra: j.appExtra, GroupExtra: j.groupExtra, AppRestart: j.appRestart,
		Count: cmp.Or(j.count, 2), Holders: j.holders, GateArgs: gateArgs, Args: j.appArgs("${NOMAD_PORT_http}"), Volumes: volumes,
	})
}

// applyGatePolicy applies examples/acl/singleton-gate.policy.hcl to j's gate
// task, for j's lock path, without read-job unless readJob.
func applyGatePolicy(t *testing.T, a *harness.Agent, j *gateJob, readJob bool) {
	t.Helper()
	applyGatePolicyTo(t, a, j.id, j.group, "gate", j.lockPath(), readJob)
}

// applyGatePolicyTo applies examples/acl/singleton-gate.policy.hcl, with
// lockPath for its lock path (and without read-job unless readJob), to task
// of group of job alone.
func applyGatePolicyTo(t *testing.T, a *harness.Agent, job, group, task, lockPath string, readJob bool) {
	t.Helper()
	f := examplePolicyFile(t, "singleton-gate.policy.hcl", "nomad/jobs/web/web/gate/lock", lockPath)
	if !readJob {
		policy, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(strings.Replace(string(policy), `capabilities = ["read-job"]`, "", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a.Nomad(t, "acl", "policy", "apply", "-namespace", "default", "-job", job, "-group", group, "-task", task, "singleton-gate-"+job, f)
}

// start waits for a start of the gated app in an allocation other than
// not, after the moment after (CLOCK_MONOTONIC ns).
func (j *gateJob) start(t *testing.T, not string, after int64, timeout time.Duration) harness.Record {
	t.Helper()
	return harness.WaitRecord(t, j.record, timeout, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.AllocID != not && r.Mono > after
	})
}

// appProc returns the live gated app process of the allocation.
func (j *gateJob) appProc(t *testing.T, allocID string) harness.Proc {
	t.Helper()
	return mainProcOf(t, j.marker, allocID)
}

// mainProcOf waits for the live main-role workload carrying marker of
// allocation allocID, as the host sees it (a container's app too).
func mainProcOf(t *testing.T, marker, allocID string) harness.Proc {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, p := range mainWorkloads(t, marker) {
			if p.AllocID == allocID {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no main workload process of alloc %s: %v", drvShort(allocID), mainWorkloads(t, marker))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// standby waits for a pending allocation of the job other than holder whose
// gate says it waits for the lock, and returns its ID.
func (j *gateJob) standby(t *testing.T, a *harness.Agent, holder string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		allocs, _ := a.Allocs(j.id)
		for _, al := range allocs {
			if al.ID == holder || al.ClientStatus != api.AllocClientStatusPending || al.DesiredStatus != api.AllocDesiredStatusRun {
				continue
			}
			evs, _ := a.TaskEvents(al.ID, "gate")
			if len(drvMatching(evs, "Gate waiting for lock "+j.lockPath())) > 0 {
				return al.ID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby allocation waiting for the lock within 60s: %s", a.Nomad(t, "job", "status", j.id))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkServiceHolder waits until the gated task's Nomad service lists the
// holder alone (the standby's gated task never ran, so never registered).
func (j *gateJob) checkServiceHolder(t *testing.T, a *harness.Agent, holder string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got []string
	for {
		regs, _, err := a.API().Services().Get(j.service(), nil)
		got = got[:0]
		if err == nil {
			for _, r := range regs {
				got = append(got, r.AllocID)
			}
		}
		if slices.Equal(got, []string{holder}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s lists allocs %v, want the holder %s alone", j.service(), got, drvShort(holder))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testGateNeverTwice runs the job through every way a holder ends and checks
// that the gated app of two allocations never ran at once (by the app's own
// records, a SIGKILLed app's end by pidfd, and by sampling), that the
// standby never starts it, and that the service lists the holder alone.
func testGateNeverTwice(t *testing.T, a *harness.Agent, j *gateJob, d *harness.Docker) {
	j.image = d.Image
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	j.run(t, a)
	t.Cleanup(func() { _ = a.Purge(j.id) })

	first := j.start(t, "", 0, 90*time.Second)
	holder := first.AllocID
	standby := j.standby(t, a, holder)
	j.checkServiceHolder(t, a, holder)
	t.Logf("holder %s, standby %s waits for the lock", drvShort(holder), drvShort(standby))

	measure := func(what string, from int64, r harness.Record) {
		t.Logf("MEASURE gate_%s %s=%s (alloc %s -> %s)", j.kind, what, harness.Millis(time.Duration(r.Mono-from)), drvShort(holder), drvShort(r.AllocID))
		for _, al := range []string{holder, r.AllocID} {
			evs, _ := a.TaskEvents(al, "gate")
			t.Logf("gate events of %s:\n%s", drvShort(al), drvFormatEvents(evs))
			t.Logf("gate log of %s:\n%s", drvShort(al), a.AllocLogs(t, al, "gate", "stderr"))
		}
	}

	// The gated app dies (SIGKILL): Nomad restarts it in the same
	// allocation, which keeps the lock.
	app := j.appProc(t, holder)
	t0 := harness.MonoNow()
	j.killApp(t, d, holder, app)
	// A SIGKILLed app writes no end record; under exec and docker its
	// recorded PID is its PID in its own namespace (1), which the sampler
	// cannot map: give its end from the host PID.
	known := []harness.KnownEnd{{PID: j.lastStart(t, holder).PID, Mono: drvWaitGone(t, app.PID, 30*time.Second)}}
	again := harness.WaitRecord(t, j.record, 60*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > t0
	})
	if again.AllocID != holder {
		t.Fatalf("after the gated app of %s was killed, the app started in %s: want a restart in the holder", drvShort(holder), drvShort(again.AllocID))
	}
	measure("app_restart", t0, again)

	// `nomad alloc restart` restarts the gate and the app at once: the
	// restarted gate takes its own lease over (same fence), and the standby
	// never gets the lock.
	if j.kind == "raw_exec" {
		fence := drvLock(t, a, j.lockPath()).ModifyIndex
		t0 = harness.MonoNow()
		a.Nomad(t, "alloc", "restart", holder)
		again = harness.WaitRecord(t, j.record, 60*time.Second, func(r harness.Record) bool {
			return r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > t0
		})
		if again.AllocID != holder {
			t.Fatalf("after nomad alloc restart of %s the app started in %s", drvShort(holder), drvShort(again.AllocID))
		}
		gateWaitEvent(t, a, j.id, 30*time.Second, fmt.Sprintf("Took over lock (fence %d) from the gate's previous run", fence))
		if v := drvLock(t, a, j.lockPath()); v.Items["holder_alloc_id"] != holder {
			t.Fatalf("after the restart the lock is held by %q, want %s", v.Items["holder_alloc_id"], drvShort(holder))
		}
		measure("alloc_restart", t0, again)
	}

	// A graceful stop of the holder's allocation: Nomad stops the gated app
	// first, then the gate, which releases once Nomad reports the app dead.
	t0 = harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	next := j.start(t, holder, t0, 60*time.Second)
	measure("alloc_stop_handover", t0, next)
	// The release was marked clean: the next gate did not wait for the
	// servers to report the old app dead.
	if evs, _ := a.TaskEvents(next.AllocID, "gate"); len(drvMatching(evs, "still runs")) > 0 {
		t.Errorf("after a clean release the next gate still waited for the previous holder:\n%s", drvFormatEvents(evs))
	}
	holder = next.AllocID
	j.checkServiceHolder(t, a, holder)

	// The gate's supervisor is SIGKILLed: the gate fails, Nomad kills the
	// gated app, and the lock expires on the server.
	j.standby(t, a, holder)
	sup := drvSupervisor(t, holder)
	t0 = harness.MonoNow()
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next = j.start(t, holder, t0, 90*time.Second)
	measure("gate_supervisor_killed_takeover", t0, next)
	holder = next.AllocID

	// The lock is released behind the holder's back: its gate fails and
	// Nomad kills its app; the next gate waits until Nomad reports that app
	// dead before its own app may start.
	j.standby(t, a, holder)
	v := j.heldBy(t, a, holder)
	t0 = harness.MonoNow()
	j.releaseBehindBack(t, a, v.Lock.ID)
	next = j.start(t, holder, t0, 90*time.Second)
	measure("released_by_hand_takeover", t0, next)
	holder = next.AllocID

	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0, known...)
}

// heldBy reads j's lock and fails the test unless holder holds it.
func (j *gateJob) heldBy(t *testing.T, a *harness.Agent, holder string) *api.Variable {
	t.Helper()
	v := drvLock(t, a, j.lockPath())
	if v.Lock == nil || v.Items["holder_alloc_id"] != holder {
		t.Fatalf("lock %s: %+v, want held by %s", j.lockPath(), v.Lock, drvShort(holder))
	}
	return v
}

// releaseBehindBack releases j's lock, held under lock ID id, by hand.
func (j *gateJob) releaseBehindBack(t *testing.T, a *harness.Agent, id string) {
	t.Helper()
	if _, _, err := a.API().Variables().ReleaseLock(&api.Variable{Path: j.lockPath(), Lock: &api.VariableLock{ID: id}}, nil); err != nil {
		t.Fatalf("release %s behind the holder's back: %v", j.lockPath(), err)
	}
}

// killApp SIGKILLs the running app (process app) of the allocation, as a
// crash would: its container (docker kill) or its process.
func (j *gateJob) killApp(t *testing.T, d *harness.Docker, allocID string, app harness.Proc) {
	t.Helper()
	if j.kind != "docker" {
		if err := syscall.Kill(app.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return
	}
	cs := d.TaskContainers(t, allocID, j.app)
	if len(cs) == 0 || cs[0].State != "running" {
		t.Fatalf("no running app container in %s: %+v", drvShort(allocID), cs)
	}
	d.CLI(t, "kill", cs[0].ID)
}

// lastStart is the latest start record of the allocation's app.
func (j *gateJob) lastStart(t *testing.T, allocID string) harness.Record {
	t.Helper()
	var last harness.Record
	for _, r := range drvStarts(j.records(t)) {
		if r.AllocID == allocID {
			last = r
		}
	}
	if last.Instance == "" {
		t.Fatalf("no start record of alloc %s", drvShort(allocID))
	}
	return last
}

func (j *gateJob) records(t *testing.T) []harness.Record { return readRecords(t, j.record) }

// testGateRefusesUnsafeJobs: a gate that Nomad would restart (the default
// restart policy) is refused with the fix, and its gated task never starts.
func testGateRefusesUnsafeJobs(t *testing.T, a *harness.Agent, records string) {
	j := newGateJob(t, "raw_exec", records)
	j.id += "-unsafe"
	j.record = filepath.Join(records, j.id+".jsonl")
	j.taskRecord = j.record
	j.gateRestart = "attempts = 1\n        mode     = \"fail\""
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
	ev := gateWaitEvent(t, a, j.id, 60*time.Second, "restart {", "attempts = 0", `mode     = "fail"`)
	t.Logf("refused: %s", drvEventText(ev))
	if recs, _ := harness.ReadRecords(j.record); len(recs) > 0 {
		t.Fatalf("the gated app of a refused gate ran: %v", recs)
	}
}

// gateWaitEvent waits until the gate task of some allocation of the job has
// an event containing every one of subs.
func gateWaitEvent(t *testing.T, a *harness.Agent, jobID string, timeout time.Duration, subs ...string) *api.TaskEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var all []*api.TaskEvent
	for {
		allocs, _ := a.Allocs(jobID)
		all = all[:0]
		for _, al := range allocs {
			evs, _ := a.TaskEvents(al.ID, "gate")
			all = append(all, evs...)
			if m := drvMatching(evs, subs...); len(m) > 0 {
				return m[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: no gate event containing %q within %s; events:\n%s", jobID, subs, timeout, drvFormatEvents(all))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testGateUpdateAtOnce: the docker example (count = 2, update max_parallel
// = 0) updated three times: Nomad replaces both allocations at once, the
// old holder's app is dead before the new one starts, no app of an old
// version starts after an update (the old standby's gate is being stopped,
// so it never takes the lock from the new version), and each version ends
// with one holder running the app and one standby.
func testGateUpdateAtOnce(t *testing.T, a *harness.Agent, records string, d *harness.Docker) {
	j := newGateJob(t, "docker", records)
	j.id, j.svc = "web-update", "web-update"
	j.record, j.taskRecord = filepath.Join(records, j.id+".jsonl"), "/records/"+j.id+".jsonl"
	j.image = d.Image
	src, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "examples", j.example))
	if err != nil {
		t.Fatal(err)
	}
	// A second copy of the example under another job name.
	j.example = ""
	hcl := strings.Replace(strings.Replace(string(src), `job "web" {`, `job "web-update" {`, 1), `name     = "web"`, `name     = "web-update"`, 1)
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	register := func() {
		args := j.appArgs("$${NOMAD_PORT_http}")
		a.RunJobHCLVars(t, hcl, fmt.Sprintf("image = %q\ncommand = %q\nvolumes = [\"%s:/records\"]\nargs = %s\n",
			j.image, harness.ImageWorkloadPath, filepath.Dir(j.record), harness.HCLList(args...)))
	}
	register()
	t.Cleanup(func() { _ = a.Purge(j.id) })
	first := j.start(t, "", 0, 90*time.Second)
	j.standby(t, a, first.AllocID)

	// Three updates: each time every old allocation is being stopped, so
	// an old-version gate never takes the lock (it never acquires while
	// its allocation is being stopped; docs/updates.md): the only app
	// started after an update is of the new version.
	holder := first
	for v := 2; v <= 4; v++ {
		tag := "version-" + strconv.Itoa(v)
		j.extraArgs = []string{tag}
		t0 := harness.MonoNow()
		register()
		next := harness.WaitRecord(t, j.record, 2*time.Minute, func(r harness.Record) bool {
			return r.Event == harness.EventStart && r.Role == harness.RoleMain && slices.Contains(r.Argv, tag)
		})
		t.Logf("MEASURE gate_docker update_handover=%s (alloc %s -> %s)", harness.Millis(time.Duration(next.Mono-t0)), drvShort(holder.AllocID), drvShort(next.AllocID))
		j.standby(t, a, next.AllocID)
		recs, err := harness.ReadRecords(j.record)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Event == harness.EventStart && r.Role == harness.RoleMain && r.Mono > t0 && !slices.Contains(r.Argv, tag) {
				t.Errorf("update to %s: an app of another version started after the update (alloc %s, argv %v)", tag, drvShort(r.AllocID), r.Argv)
			}
		}
		holder = next
	}
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0)
}

// testGateRollingDeployment: with count = 1 there is no standby, and a
// rolling deployment (health_check = "task_states") works: the new
// allocation's gate waits until the old one has stopped its app and
// released, its app then starts, and the deployment succeeds.
func testGateRollingDeployment(t *testing.T, a *harness.Agent, records string) {
	j := newGateJob(t, "raw_exec", records)
	j.id, j.svc, j.count = "gate-rolling", "gate-rolling-app", 1
	j.record, j.taskRecord = filepath.Join(records, j.id+".jsonl"), filepath.Join(records, j.id+".jsonl")
	j.update = "      max_parallel     = 1\n      health_check     = \"task_states\"\n      min_healthy_time = \"1s\"\n      healthy_deadline = \"1m\"\n      progress_deadline = \"2m\""
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: harness.Proc.IsMainWorkload})
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
	first := j.start(t, "", 0, 90*time.Second)
	waitDeployment(t, a, j.id, 0, 2*time.Minute)

	j.extraArgs = []string{"version-2"}
	t0 := harness.MonoNow()
	a.RunJobHCL(t, j.hcl(t))
	next := harness.WaitRecord(t, j.record, 2*time.Minute, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain && slices.Contains(r.Argv, "version-2")
	})
	t.Logf("MEASURE gate_raw_exec rolling_handover=%s (alloc %s -> %s)", harness.Millis(time.Duration(next.Mono-t0)), drvShort(first.AllocID), drvShort(next.AllocID))
	waitDeployment(t, a, j.id, 1, 2*time.Minute)
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0)
}

// waitDeployment waits until the deployment of the job's version succeeds,
// and fails the test if it fails.
func waitDeployment(t *testing.T, a *harness.Agent, jobID string, version uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		deps, _, err := a.API().Jobs().Deployments(jobID, false, nil)
		if err == nil {
			for _, d := range deps {
				if d.JobVersion != version {
					continue
				}
				switch d.Status {
				case api.DeploymentStatusSuccessful:
					t.Logf("deployment of version %d: %s (%s)", version, d.Status, d.StatusDescription)
					return
				case api.DeploymentStatusFailed, api.DeploymentStatusCancelled:
					t.Fatalf("deployment of version %d: %s (%s)", version, d.Status, d.StatusDescription)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful deployment of %s version %d within %s: %s", jobID, version, timeout, a.Nomad(t, "job", "status", jobID))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// testGateWorkloadKilled: a gate with a command of its own whose process is
// SIGKILLed. The gate kills its gated raw_exec app itself, proves it dead,
// releases clean and fails (so Nomad kills what is left); the standby takes
// over at once.
func testGateWorkloadKilled(t *testing.T, a *harness.Agent, records string) {
	j := newGateJob(t, "raw_exec", records)
	j.id, j.svc = "gate-cmd", "gate-cmd-app"
	j.record, j.taskRecord = filepath.Join(records, j.id+".jsonl"), filepath.Join(records, j.id+".jsonl")
	j.gateMarker = j.marker + "-gate"
	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: j.marker, Filter: func(p harness.Proc) bool {
		return p.IsMainWorkload() && !slices.Contains(p.Argv, j.gateMarker)
	}})
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() { _ = a.Purge(j.id) })
	first := j.start(t, "", 0, 90*time.Second)
	j.standby(t, a, first.AllocID)
	var gw []harness.Proc
	for _, p := range mainWorkloads(t, j.gateMarker) {
		if p.AllocID == first.AllocID {
			gw = append(gw, p)
		}
	}
	if len(gw) != 1 {
		t.Fatalf("want the holder's one gate workload, found %v", gw)
	}
	t0 := harness.MonoNow()
	if err := syscall.Kill(gw[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The gate's own command writes no end record, and the sampler leaves it
	// out: its end is when the test saw its PID gone.
	known := harness.KnownEnd{PID: gw[0].PID, Mono: drvWaitGone(t, gw[0].PID, 30*time.Second)}
	next := j.start(t, first.AllocID, t0, 90*time.Second)
	t.Logf("MEASURE gate_raw_exec gate_workload_killed_takeover=%s (alloc %s -> %s)", harness.Millis(time.Duration(next.Mono-t0)), drvShort(first.AllocID), drvShort(next.AllocID))
	gateWaitEvent(t, a, j.id, 30*time.Second, "itself (the gate stopped: workload exited): proven dead")
	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0, known)
}

// TestGateACL: with ACLs on, a gate whose identity has the example policy
// (write on the lock path, read-job), applied to the gate task alone, gates
// its app, and a stop of the holder's allocation hands over with a clean
// release. A gate without read-job is refused, naming the capability, and
// its app never starts.
func TestGateACL(t *testing.T) {
	t.Parallel()
	records := t.TempDir()
	if err := os.Chmod(records, 0o777); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, false)
	opts.ACLs = true
	a := harness.StartAgent(t, opts)

	apply := func(j *gateJob, readJob bool) { applyGatePolicy(t, a, j, readJob) }
	ok := newGateJob(t, "raw_exec", records)
	ok.id, ok.svc = "gate-acl", "gate-acl-app"
	ok.record, ok.taskRecord = filepath.Join(records, ok.id+".jsonl"), filepath.Join(records, ok.id+".jsonl")
	denied := newGateJob(t, "raw_exec", records)
	denied.id, denied.svc = "gate-acl-denied", "gate-acl-denied-app"
	denied.record, denied.taskRecord = filepath.Join(records, denied.id+".jsonl"), filepath.Join(records, denied.id+".jsonl")
	apply(ok, true)
	apply(denied, false)

	smp := harness.StartSampler(t, harness.SamplerOptions{Marker: ok.marker, Filter: harness.Proc.IsMainWorkload})
	a.RunJobHCL(t, ok.hcl(t))
	a.RunJobHCL(t, denied.hcl(t))
	t.Cleanup(func() { _ = a.Purge(ok.id); _ = a.Purge(denied.id) })

	first := ok.start(t, "", 0, 90*time.Second)
	ok.standby(t, a, first.AllocID)
	t0 := harness.MonoNow()
	if err := a.StopAlloc(first.AllocID); err != nil {
		t.Fatal(err)
	}
	next := ok.start(t, first.AllocID, t0, 60*time.Second)
	t.Logf("MEASURE gate_acl alloc_stop_handover=%s", harness.Millis(time.Duration(next.Mono-t0)))
	evs, _ := a.TaskEvents(first.AllocID, "gate")
	if len(drvMatching(evs, "Released lock")) == 0 {
		t.Errorf("the stopped holder's gate did not release (its identity must read its allocation):\n%s", drvFormatEvents(evs))
	}

	ev := gateWaitEvent(t, a, denied.id, 60*time.Second, "permission denied", `capabilities = ["read-job"]`)
	t.Logf("denied: %s", drvEventText(ev))
	if recs, _ := harness.ReadRecords(denied.record); len(recs) > 0 {
		t.Errorf("the app of a gate without read-job ran: %v", recs)
	}
	if err := a.Purge(ok.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, ok.marker, ok.record, smp, 0)
}
