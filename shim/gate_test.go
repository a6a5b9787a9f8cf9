package shim

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
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
			"lifecycle {\n  hook    = \"prestart\"\n  sidecar = true\n}"},
		{"prestart but not sidecar", alloc(gateTask(func(t *api.Task) { t.Lifecycle.Sidecar = false }), app), "",
			`sidecar = true`},
		{"leader", alloc(gateTask(func(t *api.Task) { t.Leader = true }), app), "", "remove leader = true"},
		{"restarts", alloc(gateTask(func(t *api.Task) { *t.RestartPolicy.Attempts = 2 }), app), "",
			"restart {\n  attempts = 0\n  mode     = \"fail\"\n}"},
		{"restart mode delay", alloc(gateTask(func(t *api.Task) { *t.RestartPolicy.Mode = "delay" }), app), "",
			`mode     = "fail"`},
		{"no restart policy", alloc(gateTask(func(t *api.Task) { t.RestartPolicy = nil }), app), "", `attempts = 0`},
		{"kill_timeout too long", alloc(gateTask(nil), &api.Task{Name: "db", KillTimeout: dur(30 * time.Second)}), "",
			`task "db": the group's shutdown_delay (0s) + the task's kill_timeout (30s)`},
		{"shutdown_delay counts", alloc(gateTask(nil), &api.Task{Name: "db", KillTimeout: dur(5 * time.Second), ShutdownDelay: 5 * time.Second}), "",
			`shutdown_delay (5s)`},
		{"prestart task beside the gate", alloc(gateTask(nil), app, &api.Task{Name: "init", Lifecycle: &api.TaskLifecycle{Hook: "prestart"}}), "",
			`task "init" is a prestart task`},
		{"poststart sidecar beside the gate", alloc(gateTask(nil), app, &api.Task{Name: "log", Lifecycle: &api.TaskLifecycle{Hook: "poststart", Sidecar: true}}), "",
			`task "log" is a poststart sidecar`},
		{"nothing to gate", alloc(gateTask(nil)), "", "no other task to gate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gated, err := checkGateJob(tc.alloc, "gate", &gatedWorkload{}, timing, nil)
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

// The bounds checkGateJob checks depend on who kills a gated task: Nomad
// (its kill begins after the group's shutdown_delay, and must end before
// the server can expire the lock) or the gate itself (Nomad must then not
// restart the task before its own kill begins, after the group's
// shutdown_delay).
func TestCheckGateJobBounds(t *testing.T) {
	dur := func(d time.Duration) *time.Duration { return &d }
	num := func(n int) *int { return &n }
	str := func(s string) *string { return &s }
	zero, fail := 0, "fail"
	group := func(delay time.Duration, app *api.Task) *api.Allocation {
		name := "web"
		gate := &api.Task{Name: "gate", Driver: "singleton", Lifecycle: &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
			RestartPolicy: &api.RestartPolicy{Attempts: &zero, Mode: &fail}}
		tg := &api.TaskGroup{Name: &name, Tasks: []*api.Task{gate, app}}
		if delay > 0 {
			tg.ShutdownDelay = dur(delay)
		}
		return &api.Allocation{ID: "a1", TaskGroup: name, Job: &api.Job{TaskGroups: []*api.TaskGroup{tg}}}
	}
	app := func(rp *api.RestartPolicy) *api.Task {
		return &api.Task{Name: "app", Driver: "docker", KillTimeout: dur(5 * time.Second), RestartPolicy: rp}
	}
	timing := lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second}
	for _, tc := range []struct {
		name   string
		alloc  *api.Allocation
		direct bool
		err    string // "" accepted; else a substring that names the fix
		bound  time.Duration
	}{
		{"Nomad kills, group shutdown_delay counts (N1)", group(40*time.Second, app(nil)), false,
			`the group's shutdown_delay (40s) + the task's kill_timeout (5s)`, 0},
		{"Nomad kills, within ttl + delay", group(2*time.Second, app(nil)), false, "", 7 * time.Second},
		{"gate kills, but a failed kill falls back to Nomad's: a long group shutdown_delay is refused", group(40*time.Second,
			app(&api.RestartPolicy{Attempts: num(0), Mode: str("fail")})), true,
			`the gate kills it itself, but whenever that kill fails Nomad's kill, after the gate has failed, is what ends it`, 0},
		{"gate kills, a long group shutdown_delay within a long ttl", group(40*time.Second,
			app(&api.RestartPolicy{Attempts: num(0), Mode: str("fail")})), true, "", gateKillAllTimeout},
		{"gate kills, Nomad's default restart delay (15s) beats no group delay", group(0, app(nil)), true, "", gateKillAllTimeout},
		{"gate kills, restart delay shorter than the group shutdown_delay", group(40*time.Second,
			app(&api.RestartPolicy{Attempts: num(2), Delay: dur(15 * time.Second), Mode: str("fail")})), true,
			`restart { delay = "48s" } or more, or restart { attempts = 0 }`, 0},
		{"gate kills, restart delay within the slack", group(0,
			app(&api.RestartPolicy{Attempts: num(2), Delay: dur(5 * time.Second), Mode: str("fail")})), true,
			`restart delay 5s is too short`, 0},
		{"gate kills, restart delay above group delay + slack", group(3*time.Second,
			app(&api.RestartPolicy{Attempts: num(2), Delay: dur(20 * time.Second), Mode: str("fail")})), true, "", gateKillAllTimeout},
		{"gate kills, a group Nomad service counts its deregistration", func() *api.Allocation {
			a := group(0, app(nil))
			a.Job.TaskGroups[0].Services = []*api.Service{{Name: "web", Provider: "nomad"}}
			return a
		}(), true, `restart { delay = "1m8s" } or more`, 0},
		{"gate kills, restart mode delay", group(0,
			app(&api.RestartPolicy{Attempts: num(0), Delay: dur(time.Minute), Mode: str("delay")})), true, `restart mode "delay"`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gatedWorkload{}
			direct := map[string]bool{"app": tc.direct}
			tm := timing
			if strings.Contains(tc.name, "within a long ttl") {
				tm.TTL = 50 * time.Second
			}
			_, err := checkGateJob(tc.alloc, "gate", g, tm, direct)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if g.killBound != tc.bound {
					t.Errorf("kill bound %s, want %s", g.killBound, tc.bound)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error = %v, want one that says %q", err, tc.err)
			}
		})
	}
}

// In lease mode every gated task must be one the gate kills and proves
// dead itself: Nomad's kill of the others cannot be bounded by
// lease_fence + lease_kill_grace.
func TestCheckGateJobLease(t *testing.T) {
	zero, fail := 0, "fail"
	name := "web"
	gate := &api.Task{Name: "gate", Driver: "singleton", Lifecycle: &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
		RestartPolicy: &api.RestartPolicy{Attempts: &zero, Mode: &fail}}
	app := &api.Task{Name: "app", Driver: "docker", RestartPolicy: &api.RestartPolicy{Attempts: &zero, Mode: &fail}}
	vm := &api.Task{Name: "vm", Driver: "qemu"}
	alloc := func(tasks ...*api.Task) *api.Allocation {
		return &api.Allocation{ID: "a1", TaskGroup: name, Job: &api.Job{TaskGroups: []*api.TaskGroup{{Name: &name, Tasks: tasks}}}}
	}
	timing := lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second}
	g := &gatedWorkload{lease: true, tasks: []GatedTask{{"app", "docker"}, {"vm", "qemu"}}}
	if gated, err := checkGateJob(alloc(gate, app), "gate", g, timing, map[string]bool{"app": true}); err != nil || strings.Join(gated, ",") != "app" {
		t.Fatalf("lease mode, every gated task direct: gated %v, error %v; want app, no error", gated, err)
	}
	_, err := checkGateJob(alloc(gate, app, vm), "gate", g, timing, map[string]bool{"app": true})
	if err == nil || !strings.Contains(err.Error(), `task "vm" (driver "qemu")`) || !strings.Contains(err.Error(), `config.lock.mode = "lock"`) ||
		!strings.Contains(err.Error(), "lease_fence + lease_kill_grace") {
		t.Fatalf("lease mode, a task left to Nomad: error %v, want one naming the task, its driver and the fix", err)
	}
	g.lease = false
	if _, err := checkGateJob(alloc(gate, app, vm), "gate", g, timing, map[string]bool{"app": true}); err != nil {
		t.Fatalf("lock mode, a task left to Nomad within the bound: %v", err)
	}
}

// A gate in lease mode: its kill needs lease_kill_grace of at least
// GateLeaseKillGrace; a profile's shorter K is raised (and L with it), a
// written one refused.
func TestGateLeaseKillGrace(t *testing.T) {
	c := Spec{Config: DefaultConfig(), Gate: &GateSpec{AllocID: "a1", Task: "gate"}}
	c.Path, c.Command, c.TTL, c.LockDelay = "nomad/jobs/web/web/gate/lock", nil, 10*time.Second, time.Second
	c.Mode = ModeLease
	if err := c.Validate(); err != nil {
		t.Fatalf("lease mode on a gate: %v", err)
	}
	if hb := c.Heartbeat(); hb.KillGrace != 2*time.Second || hb.Takeover() != 9*time.Second {
		t.Fatalf("default profile on a gate: K %s, L %s; want 2s, 9s", hb.KillGrace, hb.Takeover())
	}
	c.LeaseProfile = ProfileAggressive
	if hb := c.Heartbeat(); hb.KillGrace != GateLeaseKillGrace || hb.Takeover() != 5*time.Second {
		t.Fatalf("aggressive profile on a gate: K %s, L %s; want %s, 5s", hb.KillGrace, hb.Takeover(), GateLeaseKillGrace)
	}
	c.LeaseKillGrace = time.Second
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "config.lock.lease_kill_grace = 1s is below a gate's minimum of 2s") {
		t.Fatalf("lease_kill_grace 1s on a gate: error %v, want one naming the setting", err)
	}
	c.Gate = nil
	c.Command = []string{"/bin/true"}
	if err := c.Validate(); err != nil {
		t.Fatalf("lease_kill_grace 1s on a driver task: %v", err)
	}
}

// Every block of HCL that a refusal shows as its fix parses (HCL allows
// one argument in a one-line block only).
func TestGateRefusalsShowHCLThatParses(t *testing.T) {
	dur := func(d time.Duration) *time.Duration { return &d }
	num := func(n int) *int { return &n }
	str := func(s string) *string { return &s }
	name := "web"
	gate := &api.Task{Name: "gate", Driver: "singleton", Leader: true, RestartPolicy: &api.RestartPolicy{Attempts: num(2), Mode: str("delay")}}
	apps := []*api.Task{gate,
		{Name: "db", KillTimeout: dur(30 * time.Second)},
		{Name: "api", Driver: "docker", KillTimeout: dur(30 * time.Second), RestartPolicy: &api.RestartPolicy{Attempts: num(2), Delay: dur(time.Second), Mode: str("fail")}},
		{Name: "cron", Driver: "docker", RestartPolicy: &api.RestartPolicy{Attempts: num(2), Mode: str("delay")}},
	}
	alloc := &api.Allocation{ID: "a1", TaskGroup: name, Job: &api.Job{TaskGroups: []*api.TaskGroup{{Name: &name, Tasks: apps, ShutdownDelay: dur(10 * time.Second)}}}}
	_, err := checkGateJob(alloc, "gate", &gatedWorkload{}, lockclient.Timing{TTL: 10 * time.Second, LockDelay: time.Second},
		map[string]bool{"api": true, "cron": true})
	if err == nil {
		t.Fatal("the job was accepted")
	}
	blocks := regexp.MustCompile(`(?s)\b[a-z_]+ \{[^{}]*\}`).FindAllString(err.Error(), -1)
	if len(blocks) < 5 {
		t.Fatalf("only %d HCL blocks in the refusal, want one per fix:\n%v", len(blocks), err)
	}
	for _, b := range blocks {
		if _, diags := hclsyntax.ParseConfig([]byte(b), "refusal.hcl", hcl.InitialPos); diags.HasErrors() {
			t.Errorf("the refusal shows HCL that does not parse: %q: %v", b, diags)
		}
	}
}
