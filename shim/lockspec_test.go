package shim

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// Each setting's documented default is what DefaultConfig sets; a default
// that is no value ("TTL/2") documents a zero field.
func TestLockSettingsDefaultsAreDefaultConfigs(t *testing.T) {
	def := DefaultConfig()
	for _, s := range LockSettings {
		var c Config
		err := LockSpec{s}.Apply(&c, LockValues{s.Name: s.Default}, func(s LockSetting) string { return s.Name })
		want := reflect.ValueOf(s.field(&def)).Elem().Interface()
		got := reflect.ValueOf(s.field(&c)).Elem().Interface()
		if err != nil {
			got = reflect.Zero(reflect.TypeOf(want)).Interface()
		}
		if got != want {
			t.Errorf("%s: documented default %q, DefaultConfig has %v", s.Name, s.Default, want)
		}
	}
}

func TestLockSpecApplyNamesTheSetting(t *testing.T) {
	c := DefaultConfig()
	c.Namespace = "from-file"
	err := LockSettings.Apply(&c, LockValues{
		"ttl": "10", "kill_signal": "SIGNOPE", "max_retry": "x", "early_return": "maybe",
		"delay": "", "namespace": "", "renew": "3s",
	}, func(s LockSetting) string { return "config.lock." + s.Name })
	for _, want := range []string{
		`config.lock.ttl = "10" is not a duration: use a number with a unit, e.g. "10s"`,
		`config.lock.kill_signal: unknown signal "SIGNOPE"`,
		`config.lock.max_retry = "x" is not a whole number`,
		`config.lock.early_return = "maybe" is not true or false`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to say %s", err, want)
		}
	}
	if c.Renew != 3*time.Second || c.LockDelay != DefaultLockDelay || c.Namespace != "" || !c.KillSignalSet {
		t.Errorf("renew %s, delay %s, namespace %q, kill signal set %v: want 3s, the default, emptied, set",
			c.Renew, c.LockDelay, c.Namespace, c.KillSignalSet)
	}
}

func TestLockSettingKinds(t *testing.T) {
	for name, want := range map[string]Kind{
		"path": KindString, "ttl": KindDuration, "kill_signal": KindSignal, "max_retry": KindInt, "early_return": KindBool,
	} {
		for _, s := range LockSettings {
			if s.Name == name && s.Kind() != want {
				t.Errorf("%s: kind %d, want %d", name, s.Kind(), want)
			}
		}
	}
	if s := (LockSetting{Name: "kill_timeout"}); s.Flag() != "kill-timeout" {
		t.Errorf("flag %q", s.Flag())
	}
}

// A duration below its setting's minimum would make the root supervisor
// busy-loop against Nomad (a 1ns renew or backoff): it is refused with the
// setting's name, as the user wrote it, and the minimum. The minimum itself
// is accepted, and so is 0, which Config.Validate judges (the default, or
// Nomad's own 15s for a delay).
func TestLockDurationsHaveMinimums(t *testing.T) {
	label := func(s LockSetting) string { return "config.lock." + s.Name }
	want := map[string]time.Duration{"delay": 100 * time.Millisecond, "renew": time.Second, "backoff": 100 * time.Millisecond, "update_grace": time.Second,
		"lease_interval": 250 * time.Millisecond, "lease_fence": 500 * time.Millisecond, "lease_kill_grace": 100 * time.Millisecond}
	for _, s := range LockSettings {
		if s.Kind() != KindDuration || s.Name == "ttl" || s.Name == "wait" || s.Name == "kill_timeout" {
			continue // ttl: Nomad's 10s-24h; wait and kill_timeout: any length is a choice, none loops
		}
		if s.Min != want[s.Name] {
			t.Errorf("%s: minimum %s, want %s", s.Name, s.Min, want[s.Name])
		}
		c := DefaultConfig()
		err := LockSpec{s}.Apply(&c, LockValues{s.Name: "1ns"}, label)
		if msg := "config.lock." + s.Name + " = 1ns is below its minimum of " + s.Min.String(); err == nil || err.Error() != msg {
			t.Errorf("%s = 1ns: error %v, want %q", s.Name, err, msg)
		}
		for _, ok := range []string{s.Min.String(), "0s"} {
			if err := (LockSpec{s}).Apply(&c, LockValues{s.Name: ok}, label); err != nil {
				t.Errorf("%s = %s: %v", s.Name, ok, err)
			}
		}
	}
	if err := LockSettings.CheckMin("delay", time.Nanosecond, "plugin config default_delay"); err == nil ||
		!strings.Contains(err.Error(), "plugin config default_delay = 1ns is below its minimum of 100ms") {
		t.Errorf("CheckMin: %v", err)
	}
}
