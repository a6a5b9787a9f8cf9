package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// Lease mode is refused where the workload can read the workload identity
// token (identity { file = true } writes secrets/nomad_token, readable by
// the task's user): with it, the workload could write the heartbeat the
// standby trusts. With the token in the supervisor's environment alone
// (identity { env = true }), which the workload never gets, it runs; and
// lock mode is not concerned.
func TestLeaseModeRefusesAReadableToken(t *testing.T) {
	for _, tc := range []struct {
		name, lockBlock string
		file            bool
		refused         bool
	}{
		{"lease, identity file", `lock { mode = "lease" }`, true, true},
		{"lease, identity env", `lock { mode = "lease" }`, false, false},
		{"lock mode, identity file", `lock { ttl = "10s" }`, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tcfg := decodeJobspecConfig(t, "\n      config {\n        command = \"/bin/true\"\n        "+tc.lockBlock+"\n      }")
			cfg := &drivers.TaskConfig{ID: "a/t/1", AllocID: "a", JobID: "web", JobName: "web", TaskGroupName: "g", Name: "t",
				AllocDir: t.TempDir(), Env: map[string]string{"NOMAD_TOKEN": "secret"}}
			secrets := cfg.TaskDir().SecretsDir
			if err := os.MkdirAll(secrets, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.file {
				if err := os.WriteFile(filepath.Join(secrets, "nomad_token"), []byte("secret"), 0o666); err != nil {
					t.Fatal(err)
				}
			}
			_, err := planTask(cfg, tcfg, 10*time.Second, time.Second, userPolicy{defaultUser: "root", allowRoot: true}, nil)
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "identity { file = true }") || !strings.Contains(err.Error(), "identity { env = true }") {
				t.Fatalf("planTask = %v, want a refusal that names identity { file = true } and the fix", err)
			}
		})
	}
}

// The standby's plugin acts on a lease-mode lock with the operator's
// token: a job may put its lease-mode lock only on its own job's paths,
// never on another job's (whose lock its node's plugin would then seal
// and release).
func TestLeaseModeTakesOnlyTheJobsOwnPaths(t *testing.T) {
	cfg := &drivers.TaskConfig{ID: "a/t/1", AllocID: "a", JobID: "web", JobName: "web", TaskGroupName: "g", Name: "t"}
	for _, tc := range []struct {
		lockBlock string
		ok        bool
	}{
		{`lock { mode = "lease" }`, true},
		{`lock {
          mode = "lease"
          path = "nomad/jobs/web/leader"
        }`, true},
		{`lock {
          mode = "lease"
          path = "nomad/jobs/db/db/db/lock"
        }`, false},
		{`lock {
          mode = "lease"
          path = "nomad/jobs/web-2/lock"
        }`, false},
		{`lock {
          mode = "lease"
          path = "locks/web"
        }`, false},
		{`lock { path = "locks/web" }`, true}, // lock mode: the task's own token decides
	} {
		tcfg := decodeJobspecConfig(t, "\n      config {\n        command = \"/bin/true\"\n        "+tc.lockBlock+"\n      }")
		_, err := tcfg.runSpec(cfg, 10*time.Second, time.Second)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: refused: %v", tc.lockBlock, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "config.lock.path") || !strings.Contains(err.Error(), "nomad/jobs/web/")):
			t.Errorf("%s: %v, want a refusal naming config.lock.path and nomad/jobs/web/", tc.lockBlock, err)
		}
	}
}
