package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// TestLBCommandRefusesBeforeNomad: `lock lb` says what is wrong with its
// arguments, with exit code 64, before it reaches Nomad or the LB; `lb add`
// and `lb follow` check their lock path as `lock` does.
func TestLBCommandRefusesBeforeNomad(t *testing.T) {
	t.Setenv("NOMAD_HOST_ADDR_http", "10.0.0.7:25001")
	lb := []string{"-lb-uri", "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id", "web", "-lb-base-path", "/web",
		"-lb-groups", "g1", "-lb-port", "http"}
	for _, tc := range []struct {
		name string
		args []string
		env  bool // NOMAD_ALLOC_ID and NOMAD_ALLOC_DIR set
		want string
	}{
		{"no verb", nil, true, "Usage:"},
		{"unknown verb", []string{"list"}, true, "Usage:"},
		{"bad flag", []string{"add", "-no-such-flag"}, true, "-no-such-flag"},
		{"no load balancer", []string{"add", "nomad/jobs/web/lock"}, true, "no load balancer configured"},
		{"no lock path", append([]string{"add"}, lb...), true, "give the lock path"},
		{"no allocation", append(append([]string{"add"}, lb...), "nomad/jobs/web/lock"), false, "NOMAD_ALLOC_ID and NOMAD_ALLOC_DIR are unset"},
		{"empty lock path", append(append([]string{"add"}, lb...), ""), true, "lock lb add: missing lock path"},
		{"follow: no lock path", append([]string{"follow"}, lb...), true, "give the lock path, e.g. lock lb follow"},
		{"follow: not in an allocation", append(append([]string{"follow"}, lb...), "nomad/jobs/web/lock"), false,
			"lock lb follow: NOMAD_ALLOC_ID is unset: run it as a poststart sidecar task"},
		{"follow: empty lock path", append(append([]string{"follow"}, lb...), ""), true, "lock lb follow: missing lock path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env {
				t.Setenv("NOMAD_ALLOC_ID", "5f3c7a4e-0000-4000-8000-000000000001")
				t.Setenv("NOMAD_ALLOC_DIR", t.TempDir())
			} else {
				t.Setenv("NOMAD_ALLOC_ID", "")
				t.Setenv("NOMAD_ALLOC_DIR", "")
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
