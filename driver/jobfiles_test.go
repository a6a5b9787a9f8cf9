package driver

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func TestSecretsRel(t *testing.T) {
	td := &allocdir.TaskDir{Dir: "/data/alloc/a1/web", SecretsDir: "/data/alloc/a1/web/secrets"}
	cases := map[string]string{
		"secrets/lb.key":                     "secrets/lb.key",
		"/data/alloc/a1/web/secrets/lb.key":  "secrets/lb.key",
		"secrets/sub/ca.pem":                 "secrets/sub/ca.pem",
		"secrets/../local/x":                 "",
		"/etc/shadow":                        "",
		"local/lb.key":                       "",
		"secrets":                            "",
		"/data/alloc/a1/web/secrets/../../x": "",
	}
	for in, want := range cases {
		got, ok := secretsRel(td, in)
		if (want == "") == ok || got != want && ok {
			t.Errorf("secretsRel(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// The auth key and CA bundle a job names reach the LB config as contents,
// read from the task's secrets dir; nothing else is read.
func TestResolveLBFiles(t *testing.T) {
	cfg, td := testTaskConfig(t)
	if err := os.WriteFile(filepath.Join(td.SecretsDir, "lb.key"), []byte("k3y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resolved := func(lb shim.LBSpec) (shim.LBSpec, error) {
		b := shim.DriverBlocks{LoadBalancer: lb}
		err := resolveLBFiles(cfg, &b)
		return b.LoadBalancer, err
	}
	spec, err := resolved(shim.LBSpec{AuthKeyFile: "secrets/lb.key"})
	if err != nil || spec.AuthKey != "k3y\n" || spec.AuthKeyFile != "" {
		t.Fatalf("resolveLBFiles = %+v, %v", spec, err)
	}
	outside := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(outside, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(td.SecretsDir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []shim.LBSpec{{AuthKeyFile: outside}, {AuthKeyFile: "secrets/link"}, {CAFile: "/etc/ssl/certs/ca-certificates.crt"}} {
		spec, err := resolved(bad)
		if err == nil || !strings.Contains(err.Error(), "config.load_balancer.") || strings.Contains(spec.AuthKey, "secret") {
			t.Errorf("resolveLBFiles(%+v) = %+v, %v; want a refusal naming the field", bad, spec, err)
		}
	}
}

func TestWorkloadEnvDropsSecrets(t *testing.T) {
	env := []string{"PATH=/bin", "NOMAD_TOKEN=t0k", "SINGLETON_LB_AUTHKEY=k", "NOMAD_ALLOC_ID=a"}
	if got := workloadEnv(env, false, nil); !slices.Equal(got, []string{"PATH=/bin", "NOMAD_ALLOC_ID=a"}) {
		t.Errorf("workloadEnv = %q", got)
	}
	if got := workloadEnv(env, true, nil); !slices.Contains(got, "NOMAD_TOKEN=t0k") || slices.Contains(got, "SINGLETON_LB_AUTHKEY=k") {
		t.Errorf("workloadEnv(share) = %q", got)
	}
}

// testTaskConfig is a task config whose task dir (with secrets/) is a
// fresh temporary directory.
func testTaskConfig(t *testing.T) (*drivers.TaskConfig, *allocdir.TaskDir) {
	t.Helper()
	allocDir := t.TempDir()
	cfg := &drivers.TaskConfig{AllocID: "a1", Name: "web", AllocDir: allocDir}
	td := cfg.TaskDir()
	if err := os.MkdirAll(td.SecretsDir, 0o777); err != nil {
		t.Fatal(err)
	}
	return cfg, td
}

func TestWorkloadEnvDeniedEnvvars(t *testing.T) {
	env := []string{"PATH=/bin", "NOMAD_TOKEN=t0k", "AWS_SECRET_ACCESS_KEY=s", "AWS_REGION=r", "NOMAD_META_a=1", "KEEP=1"}
	got := workloadEnv(env, true, []string{"AWS_*", "NOMAD_TOKEN", "*_META_*"})
	if !slices.Equal(got, []string{"PATH=/bin", "KEEP=1"}) {
		t.Errorf("workloadEnv with denied globs = %q; want only PATH and KEEP (denied_envvars wins over share_nomad_token)", got)
	}
}
