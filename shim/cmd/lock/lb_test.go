package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// TestLBCommandRefusesBeforeNomad: `lock lb` says what is wrong with its
// arguments, with exit code 64, before it reaches Nomad or the LB; `lb
// follow` checks its lock path as `lock` does.
func TestLBCommandRefusesBeforeNomad(t *testing.T) {
	t.Setenv("NOMAD_HOST_ADDR_http", "10.0.0.7:25001")
	lb := []string{"-lb-uri", "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id", "web", "-lb-base-path", "/web",
		"-lb-groups", "g1", "-lb-port", "http"}
	for _, tc := range []struct {
		name string
		args []string
		env  bool // NOMAD_ALLOC_ID set
		want string
	}{
		{"no verb", nil, true, "Usage:"},
		{"unknown verb", []string{"list"}, true, "Usage:"},
		{"bad flag", []string{"follow", "-no-such-flag"}, true, "-no-such-flag"},
		{"no load balancer", []string{"follow", "nomad/jobs/web/lock"}, true, "no load balancer configured"},
		{"follow: no lock path", append([]string{"follow"}, lb...), true, "give the lock path, e.g. lock lb follow"},
		{"follow: not in an allocation", append(append([]string{"follow"}, lb...), "nomad/jobs/web/lock"), false,
			"lock lb follow: NOMAD_ALLOC_ID is unset: run it as a poststart sidecar task"},
		{"follow: empty lock path", append(append([]string{"follow"}, lb...), ""), true, "lock lb follow: missing lock path"},
		{"follow: -n out of range", append(append([]string{"follow", "-n", "65"}, lb...), "nomad/jobs/web/lock"), true,
			"holders 65 is out of range: a semaphore has 1 to 64 holders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env {
				t.Setenv("NOMAD_ALLOC_ID", "5f3c7a4e-0000-4000-8000-000000000001")
			} else {
				t.Setenv("NOMAD_ALLOC_ID", "")
			}
			var stdout, stderr bytes.Buffer
			if code := runLB(tc.args, &stdout, &stderr); code != shim.ExitConfig {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, shim.ExitConfig, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// TestLBRetiredVerbs: the once-per-allocation `lock lb add` and `lock lb
// remove` are gone. A job that still runs them fails its hook task with exit
// code 64 and a message that names the replacement, a poststart sidecar
// running `lock lb follow`, and where to read how; whatever the flags, and
// without a request to Nomad, the LB, or the file system.
func TestLBRetiredVerbs(t *testing.T) {
	t.Setenv("NOMAD_HOST_ADDR_http", "10.0.0.7:25001")
	t.Setenv("NOMAD_ALLOC_ID", "5f3c7a4e-0000-4000-8000-000000000001")
	t.Setenv("NOMAD_ALLOC_DIR", t.TempDir())
	lb := []string{"-lb-uri", "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id", "web", "-lb-base-path", "/web",
		"-lb-groups", "g1", "-lb-port", "http"}
	for _, verb := range []string{"add", "remove"} {
		for _, args := range [][]string{
			nil,
			{"-h"},
			{"-wait", "30s", "-config", "/nonexistent/lb.hcl", "nomad/jobs/web/lock"},
			append(append([]string{}, lb...), "nomad/jobs/web/lock"),
		} {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"lb", verb}, args...), &stdout, &stderr)
			if code != shim.ExitConfig {
				t.Errorf("lock lb %s %v: exit code %d, want %d", verb, args, code, shim.ExitConfig)
			}
			msg := stderr.String()
			for _, want := range []string{"lock lb " + verb + ": retired", `"lock lb follow"`, "hook    = \"poststart\"\n  sidecar = true",
				"docs/lock-lb.md", "examples/lock-docker-lb-hooks.nomad.hcl"} {
				if !strings.Contains(msg, want) {
					t.Errorf("lock lb %s %v: stderr does not say %q:\n%s", verb, args, want, msg)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("lock lb %s %v: stdout %q, want nothing", verb, args, stdout.String())
			}
		}
	}
}
