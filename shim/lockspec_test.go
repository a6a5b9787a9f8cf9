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
