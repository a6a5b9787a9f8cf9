package harness_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestSmokeDevAgentVarLock runs the upstream tool we benchmark against,
// `nomad var lock`, around the testworkload in a raw_exec task of a dev
// agent. It proves that the agent, the Task API socket, workload identity,
// the record file, FindProcs and the job helpers all work together.
func TestSmokeDevAgentVarLock(t *testing.T) {
	t.Parallel()
	began := time.Now()
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true})
	t.Logf("dev agent ready in %s", time.Since(began).Round(time.Millisecond))

	const jobID = "smoke-varlock"
	lockPath := "nomad/jobs/" + jobID + "/lock"
	record := filepath.Join(t.TempDir(), "records.jsonl")
	marker := fmt.Sprintf("smoke-varlock-%d", time.Now().UnixNano())
	workloadArgs := []string{"-record", record, "-marker", marker, "--", "arg with space", "ünïcode"}
	args := append([]string{"var", "lock", "-ttl", "10s", "-delay", "1s", "-shell=false",
		lockPath, harness.BuildTestWorkload(t)}, workloadArgs...)

	a.RunJobHCL(t, fmt.Sprintf(`
job %q {
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "t" {
      driver = "raw_exec"
      # NOMAD_TOKEN (and NOMAD_UNIX_ADDR) for the Task API.
      identity {
        env = true
      }
      # The nomad CLI reads NOMAD_ADDR only, never NOMAD_UNIX_ADDR.
      env {
        NOMAD_ADDR = "unix://${NOMAD_SECRETS_DIR}/api.sock"
      }
      config {
        command = %q
        args    = %s
      }
      kill_timeout = "5s"
    }
  }
}`, jobID, harness.NomadBin(t), harness.HCLList(args...)))

	alloc := a.WaitAllocs(t, jobID, 1, api.AllocClientStatusRunning, 30*time.Second)[0]
	start := harness.WaitRecord(t, record, 30*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStart && r.Role == harness.RoleMain
	})
	t.Logf("workload started %s after StartAgent was called", time.Since(began).Round(time.Millisecond))
	if start.AllocID != alloc.ID {
		t.Errorf("workload NOMAD_ALLOC_ID %q, want %q", start.AllocID, alloc.ID)
	}
	if got := start.Argv[1:]; !slices.Equal(got, workloadArgs) {
		t.Errorf("workload argv %q, want %q", got, workloadArgs)
	}

	// The lock is held, by the upstream tool.
	v, _, err := a.API().Variables().Read(lockPath, nil)
	if err != nil {
		t.Fatalf("read %s: %v", lockPath, err)
	}
	if v.Lock == nil || v.Lock.ID == "" {
		t.Fatalf("variable %s holds no lock: %+v", lockPath, v)
	}
	t.Logf("lock %s held: id=%s ttl=%s delay=%s index=%d", lockPath, v.Lock.ID, v.Lock.TTL, v.Lock.LockDelay, v.ModifyIndex)

	// Exactly one workload runs, a child of `nomad var lock`.
	procs, err := harness.FindProcs(marker)
	if err != nil {
		t.Fatal(err)
	}
	var workloads []harness.Proc
	parents := map[int]harness.Proc{}
	for _, p := range procs {
		if p.IsMainWorkload() {
			workloads = append(workloads, p)
		} else {
			parents[p.PID] = p
		}
	}
	if len(workloads) != 1 {
		t.Fatalf("want 1 workload process, found %v", procs)
	}
	parent, ok := parents[workloads[0].PPID]
	if !ok || !slices.Equal(parent.Argv[1:3], []string{"var", "lock"}) {
		t.Errorf("workload's parent is not `nomad var lock`: workload %v, others %v", workloads[0], procs)
	}
	if sum := harness.SampleFor(t, harness.SamplerOptions{Marker: marker, Filter: harness.Proc.IsMainWorkload}, 300*time.Millisecond); sum.MaxAllocs != 1 || len(sum.Empty()) != 0 {
		t.Errorf("sampler: %s", sum)
	}

	if out := a.AllocLogs(t, alloc.ID, "t", "stdout"); !strings.Contains(out, "testworkload started") {
		t.Errorf("stdout of the task lacks the start line: %q", out)
	}

	// Stopping the job stops the workload through `nomad var lock`, which
	// forwards the kill signal (SIGINT) to its child and releases the lock.
	if err := a.Purge(jobID); err != nil {
		t.Fatal(err)
	}
	stop := harness.WaitRecord(t, record, 20*time.Second, func(r harness.Record) bool {
		return r.Event == harness.EventStop && r.PID == start.PID
	})
	t.Logf("workload stopped by %s after %s", stop.Signal, time.Duration(stop.Mono-start.Mono).Round(time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, _, err := a.API().Variables().Read(lockPath, nil)
		if err == nil && v.Lock == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("lock not released 10s after the job stopped: %+v, %v", v, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSmokeAgentRestart starts a non-dev agent with ACLs and a data dir, runs
// the workload under raw_exec, restarts the agent and checks that the same
// process is still running, still under Nomad's control, on the same node.
func TestSmokeAgentRestart(t *testing.T) {
	t.Parallel()
	began := time.Now()
	a := harness.StartAgent(t, harness.AgentOptions{ACLs: true})
	t.Logf("non-dev agent ready in %s (exec healthy: %t)", time.Since(began).Round(time.Millisecond), a.DriverHealthy("exec"))

	// ACLs are really on: an anonymous request is refused.
	anon, err := api.NewClient(&api.Config{Address: a.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, _, err := anon.Jobs().List(nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("anonymous job list: want a 403, got %v", err)
	}
	if a.Token() == "" {
		t.Fatal("no management token")
	}
	if out := a.Nomad(t, "node", "status", "-short", a.NodeID()); !strings.Contains(out, "ready") {
		t.Errorf("nomad node status: %s", out)
	}

	const jobID = "smoke-restart"
	record := filepath.Join(t.TempDir(), "records.jsonl")
	marker := fmt.Sprintf("smoke-restart-%d", time.Now().UnixNano())
	a.RunJobHCL(t, fmt.Sprintf(`
job %q {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = %q
        args    = %s
      }
      kill_timeout = "5s"
    }
  }
}`, jobID, harness.BuildTestWorkload(t), harness.HCLList("-record", record, "-marker", marker)))

	alloc := a.WaitAllocs(t, jobID, 1, api.AllocClientStatusRunning, 30*time.Second)[0]
	start := harness.WaitRecord(t, record, 30*time.Second, func(r harness.Record) bool { return r.Event == harness.EventStart })
	nodeID := a.NodeID()

	// A paused client is frozen while the server keeps answering.
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if state := procState(t, a.Client().PID()); state != "T" {
		t.Errorf("paused client in state %q, want T (stopped)", state)
	}
	if _, err := a.API().Status().Leader(); err != nil {
		t.Errorf("server API while the client is paused: %v", err)
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}

	restartBegan := time.Now()
	if err := a.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Logf("agent restarted in %s", time.Since(restartBegan).Round(time.Millisecond))
	if a.NodeID() != nodeID {
		t.Errorf("node ID changed across restart: %s → %s", nodeID, a.NodeID())
	}

	// Same allocation, still running, same process, not restarted.
	running := a.WaitAllocs(t, jobID, 1, api.AllocClientStatusRunning, 30*time.Second)
	if running[0].ID != alloc.ID {
		t.Errorf("running allocation %s after restart, want %s", running[0].ID, alloc.ID)
	}
	procs, err := harness.FindProcs(marker)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].PID != start.PID {
		t.Errorf("after restart want only the original workload (pid %d), found %v", start.PID, procs)
	}
	recs, err := harness.ReadRecords(record)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Errorf("want only the first start record, got %d records", len(recs))
	}

	// The restarted client still controls the task: stopping the job
	// delivers the kill signal to the same process.
	if err := a.Purge(jobID); err != nil {
		t.Fatal(err)
	}
	stop := harness.WaitRecord(t, record, 20*time.Second, func(r harness.Record) bool { return r.Event == harness.EventStop })
	if stop.PID != start.PID {
		t.Errorf("stop recorded by pid %d, want %d", stop.PID, start.PID)
	}
}

// TestSmokeExecDriver runs the static testworkload under the exec driver
// (chroot and PID namespace), reaching it and its record file through host
// volumes. It is skipped where the exec driver is not healthy.
func TestSmokeExecDriver(t *testing.T) {
	t.Parallel()
	workload := harness.BuildTestWorkload(t)
	records := t.TempDir()
	a := harness.StartAgent(t, harness.AgentOptions{
		HostVolumes: map[string]string{"testworkload": filepath.Dir(workload), "records": records},
		// The static workload needs nothing from the host in its chroot.
		ChrootEnv: map[string]string{"/etc/hosts": "/etc/hosts"},
	})
	if !a.DriverHealthy("exec") {
		t.Skip("the exec driver is not healthy on this machine")
	}

	const jobID = "smoke-exec"
	a.RunJobHCL(t, fmt.Sprintf(`
job %q {
  group "g" {
    volume "testworkload" {
      type      = "host"
      source    = "testworkload"
      read_only = true
    }
    volume "records" {
      type   = "host"
      source = "records"
    }
    task "t" {
      driver = "exec"
      volume_mount {
        volume      = "testworkload"
        destination = "/opt/testworkload"
      }
      volume_mount {
        volume      = "records"
        destination = "/records"
      }
      config {
        command = "/opt/testworkload/%s"
        args    = ["-record", "/records/records.jsonl"]
      }
      kill_timeout = "5s"
    }
  }
}`, jobID, filepath.Base(workload)))

	alloc := a.WaitAllocs(t, jobID, 1, api.AllocClientStatusRunning, 30*time.Second)[0]
	recordFile := filepath.Join(records, "records.jsonl")
	start := harness.WaitRecord(t, recordFile, 30*time.Second, func(r harness.Record) bool { return r.Event == harness.EventStart })
	procs, err := harness.FindProcs(alloc.ID)
	if err != nil {
		t.Fatal(err)
	}
	var workloads []harness.Proc
	for _, p := range procs {
		if p.IsMainWorkload() {
			workloads = append(workloads, p)
		}
	}
	if len(workloads) != 1 {
		t.Fatalf("want 1 workload process in allocation %s, found %v", alloc.ID, procs)
	}
	// In its own PID namespace the workload records a PID that is not its
	// host PID, which is why records are paired by instance.
	t.Logf("workload: recorded pid %d, host pid %d", start.PID, workloads[0].PID)

	if err := a.Purge(jobID); err != nil {
		t.Fatal(err)
	}
	harness.WaitRecord(t, recordFile, 20*time.Second, func(r harness.Record) bool { return r.Event == harness.EventStop })
	recs, err := harness.ReadRecords(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	if ivs := harness.Intervals(recs, nil); len(ivs) != 1 || !ivs[0].Ended || ivs[0].AllocID != alloc.ID {
		t.Errorf("intervals: %+v", ivs)
	}
}

// procState returns the state letter of a process from /proc/<pid>/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return fields[0]
}

// TestCleanupLeavesNothing ends tests in awkward states and checks that the
// harness's cleanup still stops every task and removes every file.
func TestCleanupLeavesNothing(t *testing.T) {
	t.Parallel()
	harness.SkipOutsideSmoke(t) // its agents start in its subtests
	tests := []struct {
		name  string
		opts  harness.AgentOptions
		leave func(t *testing.T, a *harness.Agent) // puts the agent in the state to clean up from
	}{
		{"client stopped, task still running", harness.AgentOptions{}, func(t *testing.T, a *harness.Agent) {
			if err := a.Stop(); err != nil {
				t.Fatal(err)
			}
		}},
		{"server stopped", harness.AgentOptions{}, func(t *testing.T, a *harness.Agent) {
			if err := a.Server().Stop(); err != nil {
				t.Fatal(err)
			}
		}},
		{"client paused", harness.AgentOptions{}, func(t *testing.T, a *harness.Agent) {
			if err := a.Pause(); err != nil {
				t.Fatal(err)
			}
		}},
		{"the task's client partitioned from the server", harness.AgentOptions{Clients: 2, Netns: true}, func(t *testing.T, a *harness.Agent) {
			allocs, err := a.Allocs("left-running")
			if err != nil || len(allocs) != 1 {
				t.Fatalf("allocs: %v %v", allocs, err)
			}
			c := a.ClientOf(allocs[0].NodeID)
			if c == nil {
				t.Fatalf("no client runs node %s", allocs[0].NodeID)
			}
			if err := c.Partition(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	workload := harness.BuildTestWorkload(t)
	for _, tc := range tests {
		marker := fmt.Sprintf("cleanup-%d", time.Now().UnixNano())
		var dirs, netns []string
		t.Run(tc.name, func(t *testing.T) {
			a := harness.StartAgent(t, tc.opts)
			for _, c := range a.Clients() {
				dirs = append(dirs, c.DataDir())
				if ns := c.Netns(); ns != "" {
					netns = append(netns, ns)
				}
			}
			a.RunJobHCL(t, fmt.Sprintf(`
job "left-running" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = %q
        args    = ["-marker", %q, "-children", "1"]
      }
    }
  }
}`, workload, marker))
			a.WaitAllocs(t, "left-running", 1, api.AllocClientStatusRunning, 30*time.Second)
			tc.leave(t, a)
		})
		// The subtest's cleanup has run.
		if procs, err := harness.FindProcs(marker); err != nil || len(procs) > 0 {
			t.Errorf("%s: processes left behind: %v %v", tc.name, procs, err)
		}
		for _, dir := range dirs {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s: data dir %s not removed: %v", tc.name, dir, err)
			}
		}
		for _, ns := range netns {
			if _, err := os.Stat("/run/netns/" + ns); !os.IsNotExist(err) {
				t.Errorf("%s: network namespace %s not removed: %v", tc.name, ns, err)
			}
		}
	}
}

// TestNetnsPartition: clients in network namespaces register as separate
// nodes; a partitioned client can no longer be reached and is marked down
// by the server; healed, it is ready again.
func TestNetnsPartition(t *testing.T) {
	t.Parallel()
	a := harness.StartAgent(t, harness.AgentOptions{Clients: 2, Netns: true, HeartbeatTTL: 5 * time.Second})
	cs := a.Clients()
	if len(cs) != 2 || cs[0].NodeID() == cs[1].NodeID() || cs[0].Addr() == cs[1].Addr() {
		t.Fatalf("want two clients with their own nodes and addresses, got %s %s / %s %s",
			cs[0].NodeID(), cs[0].Addr(), cs[1].NodeID(), cs[1].Addr())
	}
	cut := cs[1]
	nodeStatus := func() string { return nodeStatusOf(t, a, cut.NodeID()) }
	waitStatus := func(want string, timeout time.Duration) time.Duration {
		began := time.Now()
		for nodeStatus() != want {
			if time.Since(began) > timeout {
				t.Fatalf("node of %s is %q, not %q, %s on", cut.Name(), nodeStatus(), want, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(began)
	}
	if err := cut.Partition(); err != nil {
		t.Fatal(err)
	}
	probe := &http.Client{Timeout: 2 * time.Second}
	if resp, err := probe.Get(cut.Addr() + "/v1/agent/self"); err == nil {
		resp.Body.Close()
		t.Errorf("the partitioned client still answers at %s", cut.Addr())
	}
	t.Logf("partitioned: node down after %s", waitStatus(api.NodeStatusDown, 45*time.Second).Round(time.Millisecond))
	if got := nodeStatusOf(t, a, cs[0].NodeID()); got != api.NodeStatusReady {
		t.Errorf("the other client's node is %q, want ready", got)
	}
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	t.Logf("healed: node ready after %s", waitStatus(api.NodeStatusReady, 60*time.Second).Round(time.Millisecond))
}

func nodeStatusOf(t *testing.T, a *harness.Agent, nodeID string) string {
	t.Helper()
	n, _, err := a.API().Nodes().Info(nodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	return n.Status
}
