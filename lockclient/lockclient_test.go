package lockclient

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDiscoverEndpoint(t *testing.T) {
	secrets := t.TempDir()
	sock := filepath.Join(secrets, "api.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tokenDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(tokenDir, "nomad_token"), []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tokenDir, "api.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		env     map[string]string
		want    Endpoint
		wantErr error
	}{
		{
			name: "NOMAD_UNIX_ADDR and NOMAD_TOKEN from identity env",
			env:  map[string]string{"NOMAD_UNIX_ADDR": "unix:///x/api.sock", "NOMAD_TOKEN": "tok"},
			want: Endpoint{Address: "unix:///x/api.sock", Token: "tok", TaskAPI: true},
		},
		{
			name: "bare socket path gets the unix scheme",
			env:  map[string]string{"NOMAD_UNIX_ADDR": "/x/api.sock", "NOMAD_TOKEN": "tok"},
			want: Endpoint{Address: "unix:///x/api.sock", Token: "tok", TaskAPI: true},
		},
		{
			name: "socket in secrets dir",
			env:  map[string]string{"NOMAD_SECRETS_DIR": secrets, "NOMAD_TOKEN": "tok"},
			want: Endpoint{Address: "unix://" + sock, Token: "tok", TaskAPI: true},
		},
		{
			name: "token file from identity file = true",
			env:  map[string]string{"NOMAD_SECRETS_DIR": tokenDir},
			want: Endpoint{Address: "unix://" + filepath.Join(tokenDir, "api.sock"), Token: "file-token", TaskAPI: true},
		},
		{
			name: "NOMAD_TOKEN wins over the token file",
			env:  map[string]string{"NOMAD_SECRETS_DIR": tokenDir, "NOMAD_TOKEN": "env-token"},
			want: Endpoint{Address: "unix://" + filepath.Join(tokenDir, "api.sock"), Token: "env-token", TaskAPI: true},
		},
		{
			name: "NOMAD_ADDR outside a task, token optional",
			env:  map[string]string{"NOMAD_ADDR": "http://127.0.0.1:4646"},
			want: Endpoint{Address: "http://127.0.0.1:4646"},
		},
		{
			name:    "socket without token names the identity block",
			env:     map[string]string{"NOMAD_SECRETS_DIR": secrets},
			wantErr: ErrNoToken,
		},
		{
			name:    "nothing at all names the identity block",
			env:     map[string]string{},
			wantErr: ErrNoEndpoint,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DiscoverEndpoint(func(k string) string { return tc.env[k] })
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "identity { env = true }") {
					t.Fatalf("error does not name the fix: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Peer != nil || got.Address != tc.want.Address || got.Token != tc.want.Token || got.TaskAPI != tc.want.TaskAPI || got.RootPeer != tc.want.RootPeer {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if strings.Contains(got.String(), got.Token) && got.Token != "" {
				t.Fatalf("String() leaks the token: %s", got)
			}
		})
	}
}

func TestValidatePath(t *testing.T) {
	cases := []struct {
		path    string
		wantErr string
	}{
		{"nomad/jobs/web/lock", ""},
		{"locks/web", ""},
		{"a", ""},
		{"nomad/jobs", "below nomad/jobs/"},
		{"nomad/web/lock", "below nomad/jobs/"},
		{"nomad", "below nomad/jobs/"},
		{"", "1-128 characters"},
		{"has space", "1-128 characters"},
		{"dots.are.invalid", "1-128 characters"},
		{strings.Repeat("a", 129), "1-128 characters"},
		{"/leading", "slashes"},
		{"trailing/", "slashes"},
		{"double//slash", "slashes"},
	}
	for _, tc := range cases {
		err := ValidatePath(tc.path)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("ValidatePath(%q) = %v, want nil", tc.path, err)
			}
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ValidatePath(%q) = %v, want ConfigError containing %q", tc.path, err, tc.wantErr)
		}
	}
}

func TestTimingValidate(t *testing.T) {
	cases := []struct {
		name    string
		timing  Timing
		wantErr string
	}{
		{"defaults", Timing{TTL: 15 * time.Second, LockDelay: time.Second}, ""},
		{"minimum ttl", Timing{TTL: 10 * time.Second, LockDelay: time.Millisecond}, ""},
		{"ttl too short", Timing{TTL: 9 * time.Second, LockDelay: time.Second}, "10s to 24h"},
		{"ttl too long", Timing{TTL: 25 * time.Hour, LockDelay: time.Second}, "10s to 24h"},
		{"zero delay becomes 15s on the server", Timing{TTL: 10 * time.Second}, "replaces 0 with 15s"},
		{"renew slower than the fence", Timing{TTL: 10 * time.Second, LockDelay: time.Second, RenewInterval: 9 * time.Second}, "renew interval"},
		{"negative renew", Timing{TTL: 10 * time.Second, LockDelay: time.Second, RenewInterval: -time.Second}, "renew interval"},
		{"request timeout eats the renew slack", Timing{TTL: 10 * time.Second, LockDelay: time.Second, RequestTimeout: 5 * time.Second}, "request timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.timing.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestTimingDefaultsFenceBeforeServerExpiry(t *testing.T) {
	for _, ttl := range []time.Duration{10 * time.Second, time.Minute, 24 * time.Hour} {
		d := Timing{TTL: ttl, LockDelay: time.Second}.withDefaults()
		if d.RenewInterval != ttl/2 {
			t.Errorf("TTL %s: renew %s, want TTL/2", ttl, d.RenewInterval)
		}
		fence := ttl - d.FenceMargin
		if fence <= d.RenewInterval+d.RequestTimeout {
			t.Errorf("TTL %s: fence %s leaves no room for a renew (%s) and its timeout (%s)", ttl, fence, d.RenewInterval, d.RequestTimeout)
		}
	}
}

func TestHolderItemsRoundTrip(t *testing.T) {
	h := Holder{
		AllocID: "0b0f6c1e-1111-2222-3333-444455556666", JobID: "web", Group: "g", Task: "t",
		Node: "node-1", Hostname: "host-1", PID: 4242, Upstream: "10.0.0.1:8080", PreviousUpstream: "10.0.0.2:8080",
		AcquiredAt: time.Date(2026, 11, 21, 10, 0, 0, 123, time.UTC),
		TTL:        10 * time.Second, LockDelay: time.Second,
	}
	got := holderFromItems(h.items())
	if got != h {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, h)
	}
	if s := got.String(); s != "alloc 0b0f6c1e on node-1" {
		t.Fatalf("String() = %q", s)
	}
	if !holderFromItems(map[string]string{"unrelated": "x"}).IsZero() {
		t.Fatal("a variable without holder items must read as no holder")
	}
}

func TestPermissionErrorPrintsPolicy(t *testing.T) {
	err := &PermissionError{Op: "acquire", Path: "nomad/jobs/web/lock", Namespace: "prod", JobID: "web"}
	msg := err.Error()
	for _, want := range []string{
		`path "nomad/jobs/web/lock"`,
		`capabilities = ["write", "read"]`,
		`namespace "prod"`,
		"nomad acl policy apply -namespace prod -job web",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
}
