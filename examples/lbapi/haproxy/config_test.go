package haproxy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy/haproxytest"
)

func TestName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"web", "web"},
		{"127.0.0.1:31005", "127.0.0.1:31005"},
		{"svc-a_b.c", "svc-a_b.c"},
		{"web/api", "web_api-"}, // lossy: hashed
		{"wé b", "w__b-"},       // lossy: hashed
		{"", "-"},               // empty: hashed
	} {
		got := haproxy.Name(tc.in)
		if strings.HasSuffix(tc.want, "-") {
			if !strings.HasPrefix(got, tc.want) || len(got) != len(tc.want)+8 {
				t.Errorf("Name(%q) = %q, want %q + 8 hex digits", tc.in, got, tc.want)
			}
		} else if got != tc.want {
			t.Errorf("Name(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if haproxy.Name(got) != got {
			t.Errorf("Name(%q) = %q is not a fixed point", tc.in, got)
		}
	}
	if a, b := haproxy.Name("a/b"), haproxy.Name("a|b"); a == b {
		t.Errorf("distinct inputs share the name %q", a)
	}
}

func TestConfigRenderRefuses(t *testing.T) {
	ok := haproxy.Config{Socket: "/tmp/x.sock", Bind: "127.0.0.1:8080", Services: []haproxy.Service{{Backend: "web", PathPrefix: "/web"}}}
	for _, tc := range []struct {
		name string
		edit func(*haproxy.Config)
		err  string
	}{
		{"no socket", func(c *haproxy.Config) { c.Socket = "" }, "socket path"},
		{"bad bind", func(c *haproxy.Config) { c.Bind = "8080" }, "bind"},
		{"no service", func(c *haproxy.Config) { c.Services = nil }, "no service"},
		{"invalid backend name", func(c *haproxy.Config) { c.Services[0].Backend = "a b" }, "not a valid HAProxy name"},
		{"twice", func(c *haproxy.Config) { c.Services = append(c.Services, c.Services[0]) }, "listed twice"},
		{"prefix with brace", func(c *haproxy.Config) { c.Services[0].PathPrefix = "/x}" }, "brace"},
		{"unknown default", func(c *haproxy.Config) { c.Default = "other" }, "default backend"},
		{"negative slots", func(c *haproxy.Config) { c.Slots = -1 }, "slots -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.Services = append([]haproxy.Service(nil), ok.Services...)
			tc.edit(&c)
			if _, err := c.Render(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Render() error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestConfigAcceptedByHAProxy: what Render writes passes `haproxy -c`, with
// routes by path prefix and a default backend.
func TestConfigAcceptedByHAProxy(t *testing.T) {
	bin := haproxytest.Binary(t)
	dir := t.TempDir()
	c := haproxy.Config{
		Socket: filepath.Join(dir, "admin.sock"), Bind: "127.0.0.1:18080",
		Services: []haproxy.Service{{Backend: "web", PathPrefix: "/web/"}, {Backend: "api", PathPrefix: "/api"}, {Backend: "root", PathPrefix: "/"}},
		Default:  "root",
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := c.Write(path); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c refused the rendered config: %v\n%s", err, out)
	}
	text, _ := c.Render()
	for _, want := range []string{
		"stats socket " + c.Socket + " level admin",
		"use_backend web if { path /web } || { path_beg /web/ }",
		"use_backend api if { path /api } || { path_beg /api/ }",
		"default_backend root",
		"backend api\n    balance roundrobin\n    server-template slot 1-8 127.0.0.1:1 disabled",
		"option redispatch 1",
		"retries 3",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("config lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "use_backend root") {
		t.Errorf("a \"/\" prefix must route only as the default:\n%s", text)
	}
}

// TestDemoConfigMatches: the HAProxy configuration scripts/demo.sh writes
// (a shell heredoc) carries the same defaults and slots as Config.
func TestDemoConfigMatches(t *testing.T) {
	demo, err := os.ReadFile(filepath.Join("..", "..", "..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{haproxy.Defaults, "backend web\n" + haproxy.BackendLines(haproxy.DefaultSlots)} {
		if !strings.Contains(string(demo), want+"\n") {
			t.Errorf("scripts/demo.sh lacks\n%s", want)
		}
	}
}
