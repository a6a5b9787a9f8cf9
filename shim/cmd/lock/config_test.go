package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/hclsnippet"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func TestParseRunArgs(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want func(*shim.Config)
	}{
		{
			name: "defaults and exact argv after the path",
			args: []string{"nomad/jobs/web/lock", "/bin/echo", "a b", "-x", `"q"`},
			want: func(c *shim.Config) {
				c.Path = "nomad/jobs/web/lock"
				c.Command = []string{"/bin/echo", "a b", "-x", `"q"`}
			},
		},
		{
			name: "every nomad var lock flag",
			args: []string{"-ttl", "10s", "-delay=1s", "-shell", "-verbose", "-early-return", "-max-retry", "3", "-backoff", "2s", "p", "cmd"},
			want: func(c *shim.Config) {
				c.Path, c.Command = "p", []string{"cmd"}
				c.TTL, c.LockDelay, c.Shell, c.Verbose, c.EarlyReturn, c.MaxRetry, c.Backoff =
					10*time.Second, time.Second, true, true, true, 3, 2*time.Second
			},
		},
		{
			name: "our flags",
			args: []string{"-wait", "1m", "-renew", "3s", "-kill-signal", "INT", "-kill-timeout", "9s", "-namespace", "prod", "p", "cmd"},
			want: func(c *shim.Config) {
				c.Path, c.Command = "p", []string{"cmd"}
				c.Wait, c.Renew, c.KillSignal, c.KillSignalSet, c.KillTimeout, c.Namespace =
					time.Minute, 3*time.Second, syscall.SIGINT, true, 9*time.Second, "prod"
			},
		},
		{
			name: "nomad's connection flags",
			args: []string{"-address", "https://n:4646", "-region", "eu", "-ca-cert", "ca.pem", "-ca-path", "cas", "-client-cert", "c.pem",
				"-client-key", "k.pem", "-tls-server-name", "server.global.nomad", "-tls-skip-verify", "-no-color", "-force-color", "p", "cmd"},
			want: func(c *shim.Config) {
				c.Path, c.Command, c.Address, c.Region = "p", []string{"cmd"}, "https://n:4646", "eu"
				c.TLS.CACert, c.TLS.CAPath, c.TLS.ClientCert, c.TLS.ClientKey, c.TLS.TLSServerName, c.TLS.Insecure =
					"ca.pem", "cas", "c.pem", "k.pem", "server.global.nomad", true
			},
		},
		{
			name: "-insecure is -tls-skip-verify",
			args: []string{"-insecure", "p", "cmd"},
			want: func(c *shim.Config) { c.Path, c.Command, c.TLS.Insecure = "p", []string{"cmd"}, true },
		},
		{
			name: "a semaphore of 3",
			args: []string{"-n", "3", "nomad/jobs/q/workers", "cmd"},
			want: func(c *shim.Config) {
				c.Path, c.Command, c.Holders = "nomad/jobs/q/workers", []string{"cmd"}, 3
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRunArgs(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			want := shim.DefaultConfig()
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestParseRunArgsErrors(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no args", nil, "missing lock path"},
		{"no command", []string{"nomad/jobs/x/lock"}, "missing command"},
		{"ttl too short", []string{"-ttl", "5s", "p", "c"}, "Nomad accepts 10s to 24h"},
		{"ttl without unit", []string{"-ttl", "10", "p", "c"}, `invalid value "10" for flag -ttl`},
		{"zero delay", []string{"-delay", "0s", "p", "c"}, "Nomad replaces 0 with 15s"},
		{"renew beyond fence", []string{"-ttl", "10s", "-renew", "10s", "p", "c"}, "renew interval"},
		{"path under nomad/ outside jobs", []string{"nomad/web", "c"}, "below nomad/jobs/"},
		{"bad path characters", []string{"web.lock", "c"}, "1-128 characters"},
		{"unknown flag", []string{"-frobnicate", "p", "c"}, "flag provided but not defined: -frobnicate"},
		{"token in argv", []string{"-token", "s3cret", "p", "c"}, "-token is refused"},
		{"unknown signal", []string{"-kill-signal", "SIGFOO", "p", "c"}, `unknown signal "SIGFOO"`},
		{"uncatchable kill signal", []string{"-kill-signal", "KILL", "p", "c"}, "cannot be handled"},
		{"negative wait", []string{"-wait", "-1s", "p", "c"}, "must not be negative"},
		{"negative holders", []string{"-n", "-1", "p", "c"}, "holders -1 is out of range"},
		{"too many holders", []string{"-n", "65", "p", "c"}, "1 to 64 holders"},
		{"slot paths too long", []string{"-n", "10", strings.Repeat("a", 125), "c"}, "the slot paths"},
		{"missing config file", []string{"-config", "/nonexistent.hcl", "p", "c"}, "read -config file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseRunArgs(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error echoes the token: %v", err)
			}
		})
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lock.hcl")
	src := `
command = "/bin/sleep"
args    = ["60"]
kill_signal  = "SIGINT"
kill_timeout = "7s"
lock {
  path  = "nomad/jobs/web/lock"
  ttl   = "20s"
  delay = "2s"
  wait  = "30s"
}
`
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := parseRunArgs([]string{"-config", file, "-ttl", "12s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := shim.DefaultConfig()
	want.Command = []string{"/bin/sleep", "60"}
	want.KillSignal, want.KillSignalSet, want.KillTimeout = syscall.SIGINT, true, 7*time.Second
	want.Path, want.LockDelay, want.Wait = "nomad/jobs/web/lock", 2*time.Second, 30*time.Second
	want.TTL = 12 * time.Second // the flag overrides the file
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("\n got %+v\nwant %+v", got, want)
	}
}

func TestConfigFileErrors(t *testing.T) {
	cases := []struct {
		name, src, wantErr string
	}{
		{"unknown key", `commnd = "x"`, `lock.hcl:1,1-7: Unsupported argument`},
		{"unknown key in lock", "lock {\n  tll = \"10s\"\n}", `lock.hcl:2,3-6: Unsupported argument`},
		{"bad duration", `lock { ttl = "ten seconds" }`, `lock.ttl = "ten seconds" is not a duration`},
		{"wrong type", `args = "not-a-list"`, `list of string required`},
		{"syntax error", `command = `, `parse`},
		{"args without command", `args = ["a"]`, `args given without command`},
		{"bad signal", `kill_signal = "SIGNOPE"`, `kill_signal: unknown signal`},
		{"unknown block", `health { }`, `Unsupported block type`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := shim.DefaultConfig()
			_, err := applyHCL(&c, []byte(tc.src), "lock.hcl")
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

// TestDocConfigFiles: every HCL block of the manual that is a -config file
// (a top-level command) decodes with lock's own parser, as a user would
// save it (the root module's TestDocHCL checks every other block).
func TestDocConfigFiles(t *testing.T) {
	pages, _ := filepath.Glob("../../../docs/*.md")
	pages = append(pages, "../../../README.md")
	n := 0
	for _, page := range pages {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range hclsnippet.MarkdownBlocks(filepath.Base(page), string(src)) {
			if b.Lang != "hcl" || !strings.HasPrefix(b.Text, "command") {
				continue
			}
			n++
			c := shim.DefaultConfig()
			if _, err := applyHCL(&c, []byte(b.Text), fmt.Sprintf("%s:%d", b.File, b.Line)); err != nil {
				t.Errorf("%s:%d: a -config file that lock refuses: %v", b.File, b.Line, err)
			}
		}
	}
	if n == 0 {
		t.Error("no -config file example found in the manual (an ```hcl block that begins with command)")
	}
}

// TestLBConfigBaragonFields: the -config file's load_balancer block takes
// options of any JSON type and the fields Singularity can set; -lb-* flags
// set them too and win over the file.
func TestLBConfigBaragonFields(t *testing.T) {
	t.Setenv("NOMAD_HOST_ADDR_http", "127.0.0.1:8080")
	file := filepath.Join(t.TempDir(), "lock.hcl")
	src := `
command = "/bin/sleep"
lock {
  path = "nomad/jobs/web/lock"
}
load_balancer {
  uri        = "http://127.0.0.1:1/baragon/v2/request"
  service_id = "web"
  base_path  = "/web"
  groups     = ["prod-lb"]
  port       = "http"
  options = {
    nginxExtraConfigs = ["proxy_read_timeout 5s;"]
    workers           = 4
  }
  template_name    = "custom"
  domains          = ["example.com"]
  additional_paths = ["/web2"]
  group            = "blue"
  rack_id          = "us_east_1a"
}
`
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := parseRunArgs([]string{"-config", file, "-lb-rack-id", "us_east_1b"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lb := got.LB.Config
	wantOpts := map[string]any{"nginxExtraConfigs": []any{"proxy_read_timeout 5s;"}, "workers": json.Number("4")}
	if !reflect.DeepEqual(lb.Options, wantOpts) {
		t.Errorf("options %#v, want %#v", lb.Options, wantOpts)
	}
	if lb.TemplateName != "custom" || !slices.Equal(lb.Domains, []string{"example.com"}) || !slices.Equal(lb.AdditionalPaths, []string{"/web2"}) ||
		lb.Group != "blue" || lb.RackID != "us_east_1b" {
		t.Errorf("config %+v", lb)
	}

	got, err = parseRunArgs([]string{"-lb-uri", "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id", "web",
		"-lb-base-path", "/web", "-lb-groups", "g", "-lb-port", "http", "-lb-option", "plain=1",
		"-lb-options-json", `{"nginxExtraConfigs":["a"],"n":2.5}`, "-lb-template-name", "t", "-lb-domains", "a.example,b.example",
		"-lb-additional-paths", "/x,/y", "-lb-group", "green", "nomad/jobs/web/lock", "/bin/sleep", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lb = got.LB.Config
	wantOpts = map[string]any{"plain": "1", "nginxExtraConfigs": []any{"a"}, "n": json.Number("2.5")}
	if !reflect.DeepEqual(lb.Options, wantOpts) || lb.TemplateName != "t" || !slices.Equal(lb.Domains, []string{"a.example", "b.example"}) ||
		!slices.Equal(lb.AdditionalPaths, []string{"/x", "/y"}) || lb.Group != "green" {
		t.Errorf("from flags: %+v", lb)
	}

	for _, bad := range []struct{ args []string }{
		{[]string{"-lb-options-json", `["not an object"]`}},
		{[]string{"-lb-group", "a b"}},
	} {
		args := append([]string{"-lb-uri", "http://127.0.0.1:1/baragon/v2/request", "-lb-service-id", "web",
			"-lb-base-path", "/web", "-lb-groups", "g", "-lb-port", "http"}, bad.args...)
		if _, err := parseRunArgs(append(args, "nomad/jobs/web/lock", "/bin/sleep", "1"), io.Discard); err == nil {
			t.Errorf("%v: accepted", bad.args)
		}
	}
}

// -upstream-port records the port's host:port as the holder's upstream
// (for a `lock lb follow` sidecar); a label the task lacks is an
// error naming the fix.
func TestUpstreamPortFlag(t *testing.T) {
	t.Setenv("NOMAD_HOST_ADDR_http", "10.0.0.7:25001")
	c, err := parseRunArgs([]string{"-upstream-port", "http", "nomad/jobs/api/lock", "/bin/true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream != "10.0.0.7:25001" {
		t.Errorf("Upstream = %q, want 10.0.0.7:25001", c.Upstream)
	}
	_, err = parseRunArgs([]string{"-upstream-port", "admin", "nomad/jobs/api/lock", "/bin/true"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-upstream-port") || !strings.Contains(err.Error(), `port "admin"`) {
		t.Errorf("unknown label: err = %v, want one naming -upstream-port and the network block fix", err)
	}
}

// lock's lease mode (the holder half): by flag or in the -config file's
// lock block, with the profile and the lease_* settings; refused with a
// semaphore and with timings that do not fit the TTL.
func TestLeaseModeFlags(t *testing.T) {
	got, err := parseRunArgs([]string{"-mode", "lease", "-lease-profile", "aggressive", "-lease-fence", "3s", "p", "cmd"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	hb := (shim.Spec{Config: got}).Heartbeat()
	if hb == nil || hb.Interval != 500*time.Millisecond || hb.Fence != 3*time.Second || hb.KillGrace != time.Second ||
		hb.Path != "p/lease" || hb.EscrowPath != "singleton/escrow/p" {
		t.Fatalf("heartbeat = %+v, want the aggressive profile with lease_fence 3s at p/lease, escrow singleton/escrow/p", hb)
	}
	if got.Timing().RenewInterval != 2*time.Second {
		t.Fatalf("renew = %s, want 2s in lease mode", got.Timing().RenewInterval)
	}

	file := filepath.Join(t.TempDir(), "lock.hcl")
	src := "command = \"/bin/true\"\nlock {\n  path = \"p\"\n  mode = \"lease\"\n  lease_kill_grace = \"3s\"\n}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = parseRunArgs([]string{"-config", file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if hb := (shim.Spec{Config: got}).Heartbeat(); hb == nil || hb.KillGrace != 3*time.Second || hb.Takeover() != 10*time.Second {
		t.Fatalf("heartbeat from the file = %+v, want K 3s, L 10s", hb)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-mode", "lease", "-n", "2", "p", "cmd"}, "holders"},
		{[]string{"-mode", "lease", "-ttl", "10s", "-lease-fence", "9s", "p", "cmd"}, "lease_fence 9s must be below the TTL"},
		{[]string{"-lease-fence", "3s", "p", "cmd"}, "apply to lease mode only"},
		{[]string{"-mode", "fast", "p", "cmd"}, `mode = "fast"`},
	} {
		if _, err := parseRunArgs(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one that says %q", c.args, err, c.want)
		}
	}
}
