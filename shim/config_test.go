package shim

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{
		"SIGTERM": syscall.SIGTERM, "term": syscall.SIGTERM, "SIGUSR1": syscall.SIGUSR1, "2": syscall.SIGINT,
	} {
		got, err := ParseSignal(in)
		if err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseSignal("nope"); err == nil {
		t.Error("ParseSignal(nope) succeeded")
	}
}

func TestParseDurationKeepsDefaultAndNamesTheSetting(t *testing.T) {
	tests := []struct {
		v       string
		want    time.Duration
		wantErr string
	}{
		{"", 7 * time.Second, ""}, // empty: the default stands
		{"250ms", 250 * time.Millisecond, ""},
		{"1h2m", time.Hour + 2*time.Minute, ""},
		{"10", 7 * time.Second, `lock.ttl = "10" is not a duration: use a number with a unit, e.g. "10s"`},
		{"ten seconds", 7 * time.Second, `lock.ttl = "ten seconds" is not a duration`},
	}
	for _, tc := range tests {
		d := 7 * time.Second
		err := ParseDuration("lock.ttl", tc.v, "10s", &d)
		if d != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, error containing %q", tc.v, d, err, tc.want, tc.wantErr)
		}
	}
}
