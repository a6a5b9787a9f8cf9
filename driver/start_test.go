package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// config.start: what each value makes of the task, and that a wrong value
// is refused with an error naming the field and the values it takes.
func TestStartOnLockConfig(t *testing.T) {
	cfg := &drivers.TaskConfig{ID: "a/t/1", AllocID: "8f0c2b5e-1111-2222-3333-444455556666", Namespace: "prod",
		JobID: "web", TaskGroupName: "g", Name: "t"}
	for _, c := range []struct {
		name, config string
		onLock       bool   // StartTask waits for the lock
		watch        bool   // the supervisor watches its allocation
		err          string // "": valid; else in the error, besides "config.start"
	}{
		{name: "default", config: `command = "/bin/app"`},
		{name: "at_once", config: `command = "/bin/app"
start = "at_once"`},
		{name: "on_lock", config: `command = "/bin/app"
start = "on_lock"`, onLock: true, watch: true},
		{name: "gate", config: `gate = true`, onLock: true},
		{name: "gate on_lock", config: `gate = true
start = "on_lock"`, onLock: true},
		{name: "gate at_once", config: `gate = true
start = "at_once"`, err: "a gate always starts once it holds the lock"},
		{name: "unknown value", config: `command = "/bin/app"
start = "onlock"`, err: `use "at_once"`},
		{name: "case matters", config: `command = "/bin/app"
start = "ON_LOCK"`, err: `or "on_lock"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := decodeJobspecConfig(t, "      config {\n"+c.config+"\n      }")
			sc, err := tc.runSpec(cfg, 15*time.Second, 5*time.Second)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), "config.start") || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one naming config.start and saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.startsOnLock(); got != c.onLock {
				t.Errorf("startsOnLock = %v, want %v", got, c.onLock)
			}
			if got := sc.WatchAlloc != nil; got != c.watch {
				t.Fatalf("watches its allocation = %v, want %v", got, c.watch)
			}
			if !c.watch {
				return
			}
			if w := sc.WatchAlloc; w.AllocID != cfg.AllocID || w.Namespace != cfg.Namespace || !strings.Contains(w.Who, `config.start = "on_lock"`) {
				t.Errorf("watch %+v: want allocation %s in namespace %s, worded for config.start", w, cfg.AllocID, cfg.Namespace)
			}
			// Through the supervisor's spec file and back, as the
			// supervisor builds its config.
			back := specThroughFile(t, supervisorSpec{Run: sc})
			if back.WatchAlloc == nil || *back.WatchAlloc != *sc.WatchAlloc {
				t.Errorf("the supervisor's watch %+v, want %+v", back.WatchAlloc, sc.WatchAlloc)
			}
		})
	}
}
