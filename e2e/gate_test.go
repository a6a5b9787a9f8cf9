package e2e

// The gate: a singleton task (config { gate = true }, a prestart sidecar)
// holds the lock for the other tasks of its group, of any driver. Only the
// holder's allocation ever runs them, across every way a holder ends.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	workload := harness.BuildTestWorkload(t)
	records := t.TempDir()
	if err := os.Chmod(records, 0o777); err != nil {
		t.Fatal(err)
	}
	opts := drvAgentOptions(t, true)
	opts.HostVolumes = map[string]string{"testworkload": filepath.Dir(workload), "records": records}
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
	subtests = append(subtests, subtest{"unsafe_jobs_are_refused", func(t *testing.T) { testGateRefusesUnsafeJobs(t, a, records) }})
	runConcurrently(t, subtests)
}

// gateJob is a count = 2 job whose group has a gate and one gated task of
// kind (raw_exec, exec, docker) running the testworkload, with an HTTP port
// and a Nomad service.
type gateJob struct {
	id, kind, marker string
	record           string // on the host
	taskRecord       string // as the gated task sees it
	// gateExtra is added to the gate task; appExtra to the gated task.
	gateExtra, appExtra string
	// gateRestart and appKill override the gate's restart block and the
	// gated task's kill_timeout.
	gateRestart, appKill string
	// image is the docker kind's image (harness.Docker.Image).
	image string
	// count is the group's count (newGateJob: 2).
	count int
	// noService leaves out the gated task's Nomad service.
	noService bool
}

func newGateJob(t *testing.T, kind, records string) *gateJob {
	id := "gate-" + strings.ReplaceAll(kind, "_", "-")
	j := &gateJob{id: id, kind: kind, marker: fmt.Sprintf("%s-%d", id, time.Now().UnixNano()),
		record: filepath.Join(records, id+".jsonl"), taskRecord: filepath.Join(records, id+".jsonl"),
		gateRestart: "attempts = 0\n        mode     = \"fail\"", appKill: "3s", count: 2}
	if kind != "raw_exec" {
		j.taskRecord = "/records/" + id + ".jsonl"
	}
	return j
}

func (j *gateJob) lockPath() string { return fmt.Sprintf("nomad/jobs/%s/g/gate/lock", j.id) }
func (j *gateJob) service() string  { return j.id + "-app" }

// serviceHCL is the gated task's service block (provider "nomad").
func (j *gateJob) serviceHCL() string {
	if j.noService {
		return ""
	}
	return fmt.Sprintf(`      service {
        provider = "nomad"
        name     = %q
        port     = "http"
        address  = "127.0.0.1"
      }
`, j.service())
}

func (j *gateJob) hcl(t *testing.T) string {
	command := harness.BuildTestWorkload(t)
	volumes, mounts := "", ""
	if j.kind != "raw_exec" {
		command = "/opt/testworkload/" + filepath.Base(command)
		volumes = `
    volume "testworkload" {
      type      = "host"
      source    = "testworkload"
      read_only = true
    }
    volume "records" {
      type   = "host"
      source = "records"
    }`
		mounts = `
      volume_mount {
        volume      = "testworkload"
        destination = "/opt/testworkload"
      }
      volume_mount {
        volume      = "records"
        destination = "/records"
      }`
	}
	args := harness.HCLList("-record", j.taskRecord, "-marker", j.marker, "-http", "127.0.0.1:${NOMAD_PORT_http}")
	config := fmt.Sprintf("command = %q\n        args    = %s", command, args)
	if j.kind == "docker" {
		// As real images often are: PID 1 ignores SIGTERM, so every stop
		// takes the whole kill_timeout and ends in SIGKILL.
		args = harness.HCLList("-record", j.taskRecord, "-marker", j.marker, "-http", "127.0.0.1:${NOMAD_PORT_http}", "-ignore-term")
		config = fmt.Sprintf("image        = %q\n        network_mode = \"host\"\n        command      = %q\n        args         = %s\n        volumes      = [\"%s:/records\"]",
			j.image, harness.ImageWorkloadPath, args, filepath.Dir(j.record))
		volumes, mounts = "", ""
	}
	return fmt.Sprintf(`
job %[1]q {
  group "g" {
    count = %[14]d
    network {
      port "http" {}
    }
    reschedule {
      delay          = "5s"
      delay_function = "constant"
      unlimited      = true
    }%[2]s
    task "gate" {
      driver = "singleton"
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
      restart {
        %[3]s
      }
      identity {
        env = true
      }
      config {
        gate = true
        lock {
          ttl   = %[4]q
          delay = %[5]q
        }
      }
      resources {
        cpu    = 20
        memory = 32
      }%[6]s
    }
    task "app" {
      driver = %[7]q%[8]s
      config {
        %[9]s
      }
      kill_timeout = %[11]q%[10]s
      restart {
        attempts = 10
        interval = "10m"
        delay    = "1s"
        mode     = "delay"
      }
%[15]s      resources {
        cpu    = 50
        memory = 64
      }%[13]s
    }
  }
}`, j.id, volumes, j.gateRestart, drvTTLHCL, drvDelayHCL, j.gateExtra, j.kind, mounts, config, "", j.appKill, j.service(), j.appExtra, j.count, j.serviceHCL())
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
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, p := range mainWorkloads(t, j.marker) {
			if p.AllocID == allocID {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no app process of alloc %s: %v", drvShort(allocID), mainWorkloads(t, j.marker))
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
	a.RunJobHCL(t, j.hcl(t))
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
	if j.kind == "docker" {
		cs := d.TaskContainers(t, holder, "app")
		if len(cs) == 0 || cs[0].State != "running" {
			t.Fatalf("no running app container in %s: %+v", drvShort(holder), cs)
		}
		d.CLI(t, "kill", cs[0].ID)
	} else if err := syscall.Kill(app.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
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

	// A graceful stop of the holder's allocation: Nomad stops the gated app
	// first, then the gate, which releases once Nomad reports the app dead.
	t0 = harness.MonoNow()
	if err := a.StopAlloc(holder); err != nil {
		t.Fatal(err)
	}
	next := j.start(t, holder, t0, 60*time.Second)
	measure("alloc_stop_handover", t0, next)
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
	v := drvLock(t, a, j.lockPath())
	if v.Lock == nil || v.Items["holder_alloc_id"] != holder {
		t.Fatalf("lock %s: %+v, want held by %s", j.lockPath(), v.Lock, drvShort(holder))
	}
	t0 = harness.MonoNow()
	if _, _, err := a.API().Variables().ReleaseLock(&api.Variable{Path: j.lockPath(), Lock: &api.VariableLock{ID: v.Lock.ID}}, nil); err != nil {
		t.Fatalf("release %s behind the holder's back: %v", j.lockPath(), err)
	}
	next = j.start(t, holder, t0, 90*time.Second)
	measure("released_by_hand_takeover", t0, next)
	holder = next.AllocID

	if err := a.Purge(j.id); err != nil {
		t.Fatal(err)
	}
	checkNoTwoAllocs(t, j.marker, j.record, smp, 0, known...)
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
	ev := gateWaitEvent(t, a, j.id, 60*time.Second, `restart { attempts = 0  mode = "fail" }`)
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
