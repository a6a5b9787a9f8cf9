package dockerengine

import "testing"

func TestOnlyALocalSocketIsAnEndpoint(t *testing.T) {
	for _, tc := range []struct {
		endpoint, socket string
		ok               bool
	}{
		{DefaultEndpoint, "/var/run/docker.sock", true},
		{"unix:///run/user/0/docker.sock", "/run/user/0/docker.sock", true},
		{"tcp://127.0.0.1:2375", "", false},
		{"unix://docker.sock", "", false},
		{"/var/run/docker.sock", "", false},
		{"", "", false},
	} {
		got, err := SocketPath(tc.endpoint)
		if (err == nil) != tc.ok || got != tc.socket {
			t.Errorf("SocketPath(%q) = %q, %v; want %q (ok %v)", tc.endpoint, got, err, tc.socket, tc.ok)
		}
	}
}
