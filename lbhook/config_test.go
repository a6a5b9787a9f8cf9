package lbhook

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

func validConfig() Config {
	c := testConfig("http://baragon.example:8080/baragon/v2/request")
	c.RequestTimeout, c.PollInterval, c.AddDeadline, c.RemoveDeadline = 0, 0, 0, 0
	return c
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	emptyKey := filepath.Join(dir, "empty")
	twoLines := filepath.Join(dir, "two")
	notPEM := filepath.Join(dir, "ca.pem")
	for path, content := range map[string]string{emptyKey: " \n", twoLines: "a\nb\n", notPEM: "not a certificate"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" means valid
	}{
		{"valid", func(*Config) {}, ""},
		{"trailing slash", func(c *Config) { c.URI += "/" }, ""},
		{"missing uri", func(c *Config) { c.URI = "" }, "uri is required"},
		{"uri not a URL", func(c *Config) { c.URI = "http://[::1" }, "uri is not a URL"},
		{"uri scheme", func(c *Config) { c.URI = "ftp://h/baragon/v2/request" }, "scheme must be http or https"},
		{"uri host", func(c *Config) { c.URI = "http:///baragon/v2/request" }, "host is missing"},
		{"uri query", func(c *Config) { c.URI += "?authkey=x" }, "must not have a query"},
		{"uri fragment", func(c *Config) { c.URI += "#x" }, "must not have a fragment"},
		{"uri path", func(c *Config) { c.URI = "http://h/baragon/v2" }, `path must end in Baragon's request collection`},
		{"uri password hidden", func(c *Config) { c.URI = "ftp://u:pw@h/request" }, "u:xxxxx@h"},
		{"missing service id", func(c *Config) { c.ServiceID = "" }, "service_id is required"},
		{"bad service id", func(c *Config) { c.ServiceID = "a/b" }, "service_id \"a/b\" cannot contain"},
		{"missing base path", func(c *Config) { c.BasePath = "" }, "base_path is required"},
		{"no groups", func(c *Config) { c.Groups = nil }, "groups needs at least one"},
		{"empty group", func(c *Config) { c.Groups = []string{"a", ""} }, "groups[1] is empty"},
		{"duplicate group", func(c *Config) { c.Groups = []string{"a", "a"} }, `groups[1] "a" is listed twice`},
		{"missing port label", func(c *Config) { c.PortLabel = " " }, "port_label is required"},
		{"empty owner", func(c *Config) { c.Owners = []string{""} }, "owners[0] is empty"},
		{"negative timeout", func(c *Config) { c.RequestTimeout = -1 }, "request_timeout must not be negative"},
		{"negative poll", func(c *Config) { c.PollInterval = -1 }, "poll_interval must not be negative"},
		{"negative add deadline", func(c *Config) { c.AddDeadline = -1 }, "add_deadline must not be negative"},
		{"negative remove deadline", func(c *Config) { c.RemoveDeadline = -1 }, "remove_deadline must not be negative"},
		{"1ns timeout", func(c *Config) { c.RequestTimeout = 1 }, "request_timeout = 1ns is below its minimum of 100ms"},
		{"1ns poll", func(c *Config) { c.PollInterval = 1 }, "poll_interval = 1ns is below its minimum of 100ms"},
		{"1ns add deadline", func(c *Config) { c.AddDeadline = 1 }, "add_deadline = 1ns is below its minimum of 100ms"},
		{"1ns remove deadline", func(c *Config) { c.RemoveDeadline = 1 }, "remove_deadline = 1ns is below its minimum of 100ms"},
		{"every minimum", func(c *Config) {
			c.RequestTimeout, c.PollInterval, c.AddDeadline, c.RemoveDeadline = MinRequestTimeout, MinPollInterval, MinAddDeadline, MinRemoveDeadline
		}, ""},
		{"unreadable authkey file", func(c *Config) { c.AuthKeyFile = filepath.Join(dir, "missing") }, "authkey_file: open"},
		{"empty authkey file", func(c *Config) { c.AuthKeyFile = emptyKey }, "is empty"},
		{"two-line authkey file", func(c *Config) { c.AuthKeyFile = twoLines }, "more than one line"},
		{"unreadable ca file", func(c *Config) { c.CAFile = filepath.Join(dir, "missing") }, "ca_file: open"},
		{"bad ca file", func(c *Config) { c.CAFile = notPEM }, "holds no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	t.Run("all problems at once", func(t *testing.T) {
		err := Config{}.Validate()
		for _, field := range []string{"uri", "service_id", "base_path", "groups", "port_label"} {
			if err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("err = %v, want it to name %s", err, field)
			}
		}
	})
}

func TestDefaults(t *testing.T) {
	c := validConfig().WithDefaults()
	if c.RequestTimeout != 2*time.Second || c.PollInterval != DefaultPollInterval ||
		c.AddDeadline != DefaultAddDeadline || c.RemoveDeadline != DefaultRemoveDeadline {
		t.Errorf("defaults %+v", c)
	}
	cl, err := NewClient(validConfig(), ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cl.opts.CancelWait != 2*2*time.Second+4*DefaultPollInterval || cl.Config().RequestTimeout != 2*time.Second {
		t.Errorf("client defaults: cancel wait %s", cl.opts.CancelWait)
	}
}

func TestNewClientErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		opts ClientOptions
		want string
	}{
		{"bad config", Config{}, ClientOptions{}, "lb config: uri is required"},
		{"authkey in query params", validConfig(), ClientOptions{QueryParams: map[string]string{"authkey": "x"}}, "must not set authkey"},
		{"empty query param name", validConfig(), ClientOptions{QueryParams: map[string]string{"": "x"}}, "empty parameter name"},
		{"negative cancel wait", validConfig(), ClientOptions{CancelWait: -1}, "cancel wait"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewClient(tc.cfg, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// The auth key comes from authkey_file, else the environment; it goes in
// the authkey parameter of POST and DELETE, which Baragon authenticates, and
// not of the polling GET or the state GET (@NoAuth in Baragon), so that it
// stays out of access logs. Query params go on all three request calls.
func TestAuthKeySourcesAndPlacement(t *testing.T) {
	f := newFront(nil).
		on(http.MethodPost, 0, answerStatus(200, `{"loadBalancerState":"WAITING"}`)).
		on(http.MethodGet, 0, answerStatus(200, `{"loadBalancerState":"SUCCESS"}`)).
		on(http.MethodDelete, 0, answerStatus(200, `{"loadBalancerState":"SUCCESS"}`))
	ts := httptest.NewServer(f)
	defer ts.Close()

	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		return map[string]string{DefaultAuthKeyEnv: "from-env", "OTHER": "from-other"}[k]
	}
	tests := []struct {
		name    string
		file    string
		envName string
		want    string
	}{
		{"file wins", keyFile, "", "from-file"},
		{"default env", "", "", "from-env"},
		{"named env", "", "OTHER", "from-other"},
		{"none", "", "UNSET", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.callList())
			cfg := testConfig(ts.URL + "/baragon/v2/request")
			cfg.AuthKeyFile = tc.file
			c, err := NewClient(cfg, ClientOptions{Getenv: env, AuthKeyEnv: tc.envName, QueryParams: map[string]string{"team": "x y"}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			_, _ = c.Post(ctx, c.NewRequest("r1", nil, nil))
			_, _ = c.Get(ctx, "r1")
			_, _ = c.Cancel(ctx, "r1")
			_, _ = c.ServiceState(ctx)
			calls := f.callList()[before:]
			if len(calls) != 4 {
				t.Fatalf("%d calls", len(calls))
			}
			for i, cl := range calls[:3] {
				want := tc.want
				if i == 1 { // the poll
					want = ""
				}
				if got := cl.query.Get("authkey"); got != want || cl.query.Has("authkey") != (want != "") {
					t.Errorf("%s %s: authkey %q, want %q", cl.method, cl.path, got, want)
				}
				if cl.query.Get("team") != "x y" {
					t.Errorf("%s %s: query params %v", cl.method, cl.path, cl.query)
				}
			}
			if st := calls[3]; st.path != "/baragon/v2/state/web" || len(st.query) != 0 {
				t.Errorf("state call %s ?%v, want /baragon/v2/state/web and no query", st.path, st.query)
			}
			if calls[1].path != "/baragon/v2/request/r1" || calls[0].path != "/baragon/v2/request" {
				t.Errorf("paths %s %s", calls[0].path, calls[1].path)
			}
		})
	}
}

// Singularity builds the state URL with String.replace, which replaces
// every "request"; so do we, with a warning.
func TestStateURIReplacesEveryOccurrence(t *testing.T) {
	if got := stateURIFor("http://request.example/lb/request"); got != "http://state.example/lb/state" {
		t.Errorf("state uri = %s", got)
	}
	var logs proctest.SyncBuffer
	cfg := validConfig()
	cfg.URI = "http://request.example/baragon/v2/request/"
	c := newTestClient(t, cfg, &logs)
	if c.stateURI != "http://state.example/baragon/v2/state" || c.requestURI != "http://request.example/baragon/v2/request" {
		t.Errorf("uris %s %s", c.requestURI, c.stateURI)
	}
	if !strings.Contains(logs.String(), `contains "request" more than once`) {
		t.Errorf("no warning logged: %s", logs.String())
	}
}

func TestCAFile(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"service":{"serviceId":"web"},"upstreams":[]}`))
	}))
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake without ca_file fails on purpose
	ts.StartTLS()
	defer ts.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(ts.URL + "/baragon/v2/request")
	cfg.CAFile = caFile
	if _, err := newTestClient(t, cfg, nil).ServiceState(context.Background()); err != nil {
		t.Fatalf("with ca_file: %v", err)
	}
	cfg.CAFile = ""
	_, err := newTestClient(t, cfg, nil).ServiceState(context.Background())
	var ce *CallError
	if !errors.As(err, &ce) || ce.State != StateUnknown || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without ca_file: %v", err)
	}
	plain := validConfig()
	plain.CAFile = caFile
	if err := plain.Validate(); err == nil || !strings.Contains(err.Error(), "plain http") {
		t.Errorf("ca_file with http uri: %v", err)
	}
}
