package shim

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

func TestCheckGateJob(t *testing.T) {
	dur := func(d time.Duration) *time.Duration { return &d }
	gateTask := func(mut func(*api.Task)) *api.Task {
		t := &api.Task{Name: "gate", Driver: "singleton",
			Lifecycle:     &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
			RestartPolicy: &api.RestartPolicy{Attempts: new(int), Mode: new(string)}}
		*t.RestartPolicy.Mode = "fail"
		if mut != nil {
			mut(t)
		}
		return t
	}
	app := &api.Task{Name: "app", Driver: "docker", KillTimeout: dur(5 * time.Second)}
	alloc := func(tasks ...*api.Task) *api.Allocation {
		name := "web"
		return &api.Allocation{ID: "a1", TaskGroup: name,
			Job: &api.Job{TaskGroups: []*api.TaskGroup{{Name: &name, Tasks: tasks}}}}
	}
	timing := lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second}
	for _, tc := range []struct {
		name  string
		alloc *api.Allocation
		gated string // joined, on success
		err   string // substring that names the fix
	}{
		{"safe", alloc(gateTask(nil), app,
			&api.Task{Name: "tail", Lifecycle: &api.TaskLifecycle{Hook: "poststart"}},
			&api.Task{Name: "cleanup", Lifecycle: &api.TaskLifecycle{Hook: "poststop"}}), "app,tail", ""},
		{"not a prestart sidecar", alloc(gateTask(func(t *api.Task) { t.Lifecycle = nil }), app), "",
			`lifecycle { hook = "prestart"  sidecar = true }`},
		{"prestart but not sidecar", alloc(gateTask(func(t *api.Task) { t.Lifecycle.Sidecar = false }), app), "",
			`sidecar = true`},
		{"leader", alloc(gateTask(func(t *api.Task) { t.Leader = true }), app), "", "remove leader = true"},
		{"restarts", alloc(gateTask(func(t *api.Task) { *t.RestartPolicy.Attempts = 2 }), app), "",
			`restart { attempts = 0  mode = "fail" }`},
		{"restart mode delay", alloc(gateTask(func(t *api.Task) { *t.RestartPolicy.Mode = "delay" }), app), "",
			`mode = "fail"`},
		{"no restart policy", alloc(gateTask(func(t *api.Task) { t.RestartPolicy = nil }), app), "", `attempts = 0`},
		{"kill_timeout too long", alloc(gateTask(nil), &api.Task{Name: "db", KillTimeout: dur(30 * time.Second)}), "",
			`task "db": kill_timeout (30s)`},
		{"shutdown_delay counts", alloc(gateTask(nil), &api.Task{Name: "db", KillTimeout: dur(5 * time.Second), ShutdownDelay: 5 * time.Second}), "",
			`shutdown_delay (5s)`},
		{"prestart task beside the gate", alloc(gateTask(nil), app, &api.Task{Name: "init", Lifecycle: &api.TaskLifecycle{Hook: "prestart"}}), "",
			`task "init" is a prestart task`},
		{"poststart sidecar beside the gate", alloc(gateTask(nil), app, &api.Task{Name: "log", Lifecycle: &api.TaskLifecycle{Hook: "poststart", Sidecar: true}}), "",
			`task "log" is a poststart sidecar`},
		{"nothing to gate", alloc(gateTask(nil)), "", "no other task to gate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gated, err := checkGateJob(tc.alloc, &Gate{AllocID: "a1", Task: "gate"}, timing)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got := strings.Join(gated, ","); got != tc.gated {
					t.Fatalf("gated = %q, want %q", got, tc.gated)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error = %v, want one that says %q", err, tc.err)
			}
			if _, ok := err.(interface{ Unwrap() []error }); !ok {
				if _, ok := err.(*GateConfigError); !ok {
					t.Fatalf("error %T is not a GateConfigError", err)
				}
			}
		})
	}
}
