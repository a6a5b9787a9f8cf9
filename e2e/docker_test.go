package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestDockerSmoke: the harness's private Docker engine runs a docker task of
// a real dev agent from the test image; its container is visible while it
// runs, and gone once the job is stopped.
func TestDockerSmoke(t *testing.T) {
	t.Parallel()
	d := harness.StartDocker(t)
	a := harness.StartAgent(t, harness.AgentOptions{Dev: true, Docker: d})

	recDir := t.TempDir()
	record := filepath.Join(recDir, "records.jsonl")
	marker := fmt.Sprintf("docker-smoke-%d", time.Now().UnixNano())
	job := a.RunJobHCL(t, fmt.Sprintf(`
job "docker-smoke" {
  group "g" {
    task "t" {
      driver = "docker"
      config {
        image        = %q
        network_mode = "none"
        command      = %q
        args         = ["-record", "/rec/records.jsonl", "-marker", %q]
        volumes      = ["%s:/rec"]
      }
      kill_timeout = "10s"
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}`, d.Image, harness.ImageWorkloadPath, marker, recDir))

	allocs := a.WaitAllocs(t, job, 1, "running", 2*time.Minute)
	allocID := allocs[0].ID
	start := harness.WaitRecord(t, record, time.Minute, func(r harness.Record) bool { return r.Event == "start" })
	cs := d.TaskContainers(t, allocID, "t")
	if len(cs) != 1 || cs[0].State != "running" || cs[0].PID <= 0 {
		t.Fatalf("want one running container for alloc %s, got %+v\n%s", allocID, cs, d.CLI(t, "ps", "-a"))
	}
	t.Logf("container %s (host pid %d) runs the workload (instance %s)", cs[0].ID[:12], cs[0].PID, start.Instance)

	a.Nomad(t, "job", "stop", "-detach", job)
	a.WaitAllocs(t, job, 1, "complete", 2*time.Minute)
	harness.WaitRecord(t, record, time.Minute, func(r harness.Record) bool {
		return r.Event == "stop" && r.Instance == start.Instance
	})
	deadline := time.Now().Add(time.Minute)
	for {
		cs = d.TaskContainers(t, allocID, "t")
		if len(cs) == 0 || cs[0].State != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container still running a minute after the job stopped: %+v", cs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
