package driver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/jobspec2"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func TestDefaultLockPath(t *testing.T) {
	cfg := &drivers.TaskConfig{JobID: "web", TaskGroupName: "g", Name: "t"}
	if got := DefaultLockPath(cfg); got != "nomad/jobs/web/g/t/lock" {
		t.Fatalf("got %q", got)
	}
	cfg.JobID, cfg.ParentJobID = "report/periodic-1700000000", "report"
	if got := DefaultLockPath(cfg); got != "nomad/jobs/report/g/t/lock" {
		t.Fatalf("periodic children must share the parent's lock, got %q", got)
	}
}

// Names Nomad allows but its variable paths do not still get a valid,
// distinct default lock path.
func TestDefaultLockPathEscapes(t *testing.T) {
	long := strings.Repeat("j", 100)
	cases := []struct{ job, group, task, want string }{
		{"api.v2", "g", "t", "nomad/jobs/api~2ev2/g/t/lock"},
		{"api~2ev2", "g", "t", "nomad/jobs/api~7e2ev2/g/t/lock"},
		{"web", "front end", "nginx:1", "nomad/jobs/web/front~20end/nginx~3a1/lock"},
	}
	for _, c := range cases {
		got := DefaultLockPath(&drivers.TaskConfig{JobID: c.job, TaskGroupName: c.group, Name: c.task})
		if got != c.want {
			t.Errorf("%s/%s/%s: got %q, want %q", c.job, c.group, c.task, got, c.want)
		}
	}
	seen := map[string]string{}
	for _, task := range []string{"a", "b"} {
		got := DefaultLockPath(&drivers.TaskConfig{JobID: long + ".x", TaskGroupName: "group", Name: task})
		if len(got) > 128 || !strings.HasPrefix(got, "nomad/jobs/jjjj") {
			t.Errorf("long names: %q (%d characters)", got, len(got))
		}
		if other, dup := seen[got]; dup {
			t.Errorf("tasks %s and %s share the lock %s", other, task, got)
		}
		seen[got] = task
		c := TaskConfig{Command: "/bin/true"}
		if _, err := c.runSpec(&drivers.TaskConfig{JobID: long + ".x", TaskGroupName: "group", Name: task}, 15*time.Second, 5*time.Second); err != nil {
			t.Errorf("the default lock path of a long, dotted job is refused: %v", err)
		}
	}
}

func TestShimConfig(t *testing.T) {
	cfg := &drivers.TaskConfig{JobID: "web", TaskGroupName: "g", Name: "t", Namespace: "prod"}
	cases := []struct {
		name    string
		tc      TaskConfig
		wantErr string
	}{
		{name: "defaults from the plugin", tc: TaskConfig{Command: "/bin/app", Args: []string{"a b"}}},
		{name: "explicit lock block", tc: taskWithLock("/bin/app", LockConfig{
			"path": "nomad/jobs/web/leader", "ttl": "20s", "delay": "2s", "renew": "5s", "wait": "1m", "kill_signal": "SIGINT", "kill_timeout": "9s"})},
		{name: "ttl below Nomad's minimum", tc: taskWithLock("/bin/app", LockConfig{"ttl": "5s"}),
			wantErr: "Nomad accepts 10s to 24h"},
		{name: "duration without unit", tc: taskWithLock("/bin/app", LockConfig{"ttl": "10"}),
			wantErr: `config.lock.ttl = "10" is not a duration`},
		{name: "path outside nomad/jobs", tc: taskWithLock("/bin/app", LockConfig{"path": "nomad/web"}),
			wantErr: "below nomad/jobs/"},
		{name: "unknown kill signal", tc: taskWithLock("/bin/app", LockConfig{"kill_signal": "SIGNOPE"}),
			wantErr: "config.lock.kill_signal"},
		{name: "zero delay", tc: taskWithLock("/bin/app", LockConfig{"delay": "0s"}),
			wantErr: "replaces 0 with 15s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.tc.runSpec(cfg, 15*time.Second, 5*time.Second)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Namespace != "prod" || c.Command[0] != "/bin/app" {
				t.Fatalf("unexpected config %+v", c)
			}
			if tc.tc.Lock["path"] == "" && c.Path != "nomad/jobs/web/g/t/lock" {
				t.Fatalf("default path: %q", c.Path)
			}
			if tc.tc.Lock["ttl"] == "" && (c.TTL != 15*time.Second || c.LockDelay != 5*time.Second) {
				t.Fatalf("plugin defaults not applied: ttl %s delay %s", c.TTL, c.LockDelay)
			}
			if tc.tc.Lock["kill_signal"] == "SIGINT" && (c.KillSignal != syscall.SIGINT || c.KillTimeout != 9*time.Second) {
				t.Fatalf("loss signal/timeout not applied: %v %s", c.KillSignal, c.KillTimeout)
			}
		})
	}
}

func TestPluginConfigDefaults(t *testing.T) {
	if _, _, err := (PluginConfig{DefaultTTL: "3s", DefaultDelay: "1s"}).defaults(); err == nil ||
		!strings.Contains(err.Error(), "10s to 24h") {
		t.Fatalf("want a TTL range error, got %v", err)
	}
	if _, _, err := (PluginConfig{DefaultTTL: "ten", DefaultDelay: "1s"}).defaults(); err == nil ||
		!strings.Contains(err.Error(), "default_ttl") {
		t.Fatalf("want the field named, got %v", err)
	}
	if _, _, err := (PluginConfig{DefaultDelay: "1ns"}).defaults(); err == nil ||
		!strings.Contains(err.Error(), "plugin config default_delay = 1ns is below its minimum of 100ms") {
		t.Fatalf("want the minimum named, got %v", err)
	}
	ttl, delay, err := PluginConfig{}.defaults()
	if err != nil || ttl != 15*time.Second || delay != 5*time.Second {
		t.Fatalf("empty plugin config: %s %s %v", ttl, delay, err)
	}
}

func TestEventTail(t *testing.T) {
	base := filepath.Join(t.TempDir(), "state")
	dir, err := securefs.OpenPrivate(base, true)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	path := filepath.Join(base, eventsFile)
	tail := &eventTail{dir: dir}
	if evs, err := tail.read(); err != nil || len(evs) != 0 {
		t.Fatalf("missing file: %v %v", evs, err)
	}
	for _, m := range []string{"Waiting", "Acquired lock (fence 7)"} {
		if err := appendJSONLine(dir, eventsFile, taskEventLine{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(`{"Message":"half`) // a line still being written
	f.Close()

	evs, err := tail.read()
	if err != nil || len(evs) != 2 || evs[1].Message != "Acquired lock (fence 7)" {
		t.Fatalf("first read: %+v %v", evs, err)
	}
	tail.save()

	f, _ = os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(` written"}` + "\n")
	f.Close()
	again := &eventTail{dir: dir}
	again.restore() // a restarted plugin resumes where the old one stopped
	evs, err = again.read()
	if err != nil || len(evs) != 1 || evs[0].Message != "half written" {
		t.Fatalf("after restore: %+v %v", evs, err)
	}
}

func TestStartTicksIdentifiesProcess(t *testing.T) {
	a, err := startTicks(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("startTicks(self) = %d, %v", a, err)
	}
	if _, err := findSupervisor(os.Getpid(), a+1); err != errSupervisorGone {
		t.Fatalf("a PID with another start time must count as gone, got %v", err)
	}
	p, err := findSupervisor(os.Getpid(), a)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(p.pidfd)
}

func TestReadKV(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.stat")
	os.WriteFile(path, []byte("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nbogus\n"), 0o600)
	kv, err := readKV(path)
	if err != nil || kv["usage_usec"] != 1500 || kv["system_usec"] != 500 || len(kv) != 3 {
		t.Fatalf("readKV = %v, %v", kv, err)
	}
}

// TestLoadBalancerBaragonFields: the load_balancer block takes options of
// any JSON type (lists such as nginxExtraConfigs, numbers, maps), and the
// fields Singularity can set (template_name, domains, additional_paths,
// the upstream's group and rack_id), decoded the way a Nomad client does
// (jobspec → the hclspec → msgpack → TaskConfig), and they reach the wire.
func TestLoadBalancerBaragonFields(t *testing.T) {
	tc := decodeJobspecConfig(t, `
      config {
        command = "/bin/true"
        load_balancer {
          uri        = "http://127.0.0.1:1/baragon/v2/request"
          service_id = "web"
          base_path  = "/web"
          groups     = ["prod-lb"]
          port       = "http"
          options = {
            nginxExtraConfigs = ["proxy_read_timeout 5s;"]
            workers           = 4
            nested            = { a = "b", list = [1, "two"] }
            plain             = "x"
          }
          template_name    = "custom"
          domains          = ["example.com"]
          additional_paths = ["/web2"]
          group            = "blue"
          rack_id          = "us_east_1a"
        }
      }`)
	cfg := &drivers.TaskConfig{ID: "a/t/1", JobID: "j", JobName: "j", TaskGroupName: "g", Name: "t", Env: map[string]string{"NOMAD_HOST_ADDR_http": "127.0.0.1:8080"}}
	sc, err := tc.runSpec(cfg, 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client, err := lbhook.NewClient(sc.LB.Config, lbhook.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req := client.NewRequest("a-ADD-1", []lbhook.UpstreamInfo{client.Self(sc.LB.Upstream)}, nil)
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Service struct {
			Options         map[string]any `json:"options"`
			TemplateName    string         `json:"templateName"`
			Domains         []string       `json:"domains"`
			AdditionalPaths []string       `json:"additionalPaths"`
		} `json:"loadBalancerService"`
		Add []struct {
			Upstream, Group, RackID string
		} `json:"addUpstreams"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	wantOpts := map[string]any{
		"nginxExtraConfigs": []any{"proxy_read_timeout 5s;"},
		"workers":           float64(4),
		"nested":            map[string]any{"a": "b", "list": []any{float64(1), "two"}},
		"plain":             "x",
	}
	if !reflect.DeepEqual(got.Service.Options, wantOpts) {
		t.Errorf("options on the wire %#v, want %#v (from %s)", got.Service.Options, wantOpts, b)
	}
	if got.Service.TemplateName != "custom" || !slices.Equal(got.Service.Domains, []string{"example.com"}) ||
		!slices.Equal(got.Service.AdditionalPaths, []string{"/web2"}) {
		t.Errorf("service %+v", got.Service)
	}
	if len(got.Add) != 1 || got.Add[0].Upstream != "127.0.0.1:8080" || got.Add[0].Group != "blue" || got.Add[0].RackID != "us_east_1a" {
		t.Errorf("upstreams %+v, want 127.0.0.1:8080 in group blue, rack us_east_1a", got.Add)
	}
	// The driver hands the load balancer to its supervisor in spec.json.
	if back := specThroughFile(t, supervisorSpec{Run: sc}); back.LB == nil || !reflect.DeepEqual(back.LB.Options, wantOpts) {
		t.Errorf("options through spec.json: %#v", back.LB)
	}
}

// decodeJobspecConfig takes a task's config block the way a Nomad agent
// does: the jobspec parser (which hands a map attribute over as a list of
// one map), the driver's hclspec, msgpack to the plugin, TaskConfig.
func decodeJobspecConfig(t *testing.T, config string) TaskConfig {
	t.Helper()
	src := "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"singleton\"\n" + config + "\n    }\n  }\n}\n"
	job, err := jobspec2.ParseWithConfig(&jobspec2.ParseConfig{Path: "j.nomad.hcl", Body: []byte(src), Strict: true})
	if err != nil {
		t.Fatalf("jobspec: %v", err)
	}
	spec, diags := hclspecutils.Convert(taskConfigSpec)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	val, diags, errs := hclutils.ParseHclInterface(job.TaskGroups[0].Tasks[0].Config, spec, nil)
	if diags.HasErrors() {
		t.Fatalf("hclspec: %v", errs)
	}
	raw := &drivers.TaskConfig{}
	if err := raw.EncodeDriverConfig(val); err != nil {
		t.Fatal(err)
	}
	var tc TaskConfig
	if err := raw.DecodeDriverConfig(&tc); err != nil {
		t.Fatalf("decode task config: %v", err)
	}
	return tc
}

func TestProcessOptionsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		tc   TaskConfig
		want string
	}{
		{TaskConfig{OOMScoreAdj: -1}, "config.oom_score_adj"},
		{TaskConfig{OOMScoreAdj: 1001}, "config.oom_score_adj"},
		{TaskConfig{WorkDir: "data"}, "config.work_dir"},
	} {
		errs := tc.tc.validateProcess()
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("validateProcess(%+v) = %v, want one error naming %s", tc.tc, errs, tc.want)
		}
	}
	if errs := (TaskConfig{OOMScoreAdj: 1000, WorkDir: "/srv/app"}).validateProcess(); len(errs) != 0 {
		t.Errorf("valid options refused: %v", errs)
	}
}

// TestGateLoadBalancer: a gate takes load_balancer and health_check blocks
// (it carries its gated task's registration), resolving the port label from
// the group's network, and its errors name the field to fix.
func TestGateLoadBalancer(t *testing.T) {
	tc := decodeJobspecConfig(t, `
      config {
        gate = true
        load_balancer {
          uri        = "http://127.0.0.1:1/baragon/v2/request"
          service_id = "web"
          base_path  = "/web"
          groups     = ["prod-lb"]
          port       = "http"
        }
        health_check {
          type = "http"
          path = "/health"
        }
      }`)
	cfg := &drivers.TaskConfig{ID: "a/gate/1", AllocID: "a", JobID: "j", JobName: "j", TaskGroupName: "g", Name: "gate",
		Env: map[string]string{"NOMAD_HOST_ADDR_http": "127.0.0.1:8080"}}
	sc, err := tc.runSpec(cfg, 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Gate == nil || sc.LB == nil || sc.LB.Upstream != "127.0.0.1:8080" || sc.LB.Health == nil || sc.LB.Health.Address != "127.0.0.1:8080" {
		t.Fatalf("gate %+v, lb %+v: want a gate whose LB upstream and health check are the group's http port", sc.Gate, sc.LB)
	}
	cfg.Env = nil // no group port "http"
	if _, err := tc.runSpec(cfg, 10*time.Second, time.Second); err == nil || !strings.Contains(err.Error(), "config.load_balancer.port") {
		t.Fatalf("error %v, want one naming config.load_balancer.port", err)
	}
}

// TestLockBlockDecodes: config.lock takes exactly the settings
// shim.LockSettings allows in the driver, decoded the way a Nomad client
// does; settings left out stay unset, and lock-only ones are refused.
func TestLockBlockDecodes(t *testing.T) {
	tc := decodeJobspecConfig(t, `
      config {
        command = "/bin/true"
        lock {
          path         = "nomad/jobs/web/leader"
          ttl          = "20s"
          kill_signal  = "SIGINT"
        }
      }`)
	want := LockConfig{"path": "nomad/jobs/web/leader", "ttl": "20s", "kill_signal": "SIGINT"}
	for _, s := range shim.LockSettings.In(shim.InDriver) {
		if tc.Lock[s.Name] != want[s.Name] {
			t.Errorf("lock.%s = %q, want %q", s.Name, tc.Lock[s.Name], want[s.Name])
		}
	}
	var names []string
	for _, s := range shim.LockSettings.In(shim.InDriver) {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if want := []string{"delay", "holders", "kill_signal", "kill_timeout", "lease_fence", "lease_interval", "lease_kill_grace",
		"lease_profile", "mode", "path", "renew", "ttl", "update_grace", "wait"}; !slices.Equal(names, want) {
		t.Errorf("config.lock takes %v, want %v", names, want)
	}

	spec, diags := hclspecutils.Convert(taskConfigSpec)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	src := "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"singleton\"\n" +
		"      config {\n        command = \"/bin/true\"\n        lock { backoff = \"1s\" }\n      }\n    }\n  }\n}\n"
	job, err := jobspec2.ParseWithConfig(&jobspec2.ParseConfig{Path: "j.nomad.hcl", Body: []byte(src), Strict: true})
	if err != nil {
		t.Fatalf("jobspec: %v", err)
	}
	if _, diags, _ := hclutils.ParseHclInterface(job.TaskGroups[0].Tasks[0].Config, spec, nil); !diags.HasErrors() {
		t.Error("config.lock.backoff (a flag of lock only) was accepted")
	}
}

// A jobspec that sets a duration to 1ns would make the root supervisor
// spin against the LB, the health-checked port or Nomad: each is refused,
// naming its field and minimum.
func TestJobspecDurationsBelowTheirMinimum(t *testing.T) {
	tc := decodeJobspecConfig(t, `
      config {
        command = "/bin/true"
        lock { renew = "1ns" }
        load_balancer {
          uri              = "http://127.0.0.1:1/baragon/v2/request"
          service_id       = "web"
          base_path        = "/web"
          groups           = ["prod-lb"]
          port             = "http"
          request_timeout  = "1ns"
          poll_interval    = "1ns"
          add_deadline     = "1ns"
          remove_deadline  = "1ns"
          recheck_interval = "1ns"
        }
        health_check {
          type     = "tcp"
          interval = "1ns"
          timeout  = "1ns"
        }
      }`)
	cfg := &drivers.TaskConfig{ID: "a/t/1", JobID: "j", JobName: "j", TaskGroupName: "g", Name: "t", Env: map[string]string{"NOMAD_HOST_ADDR_http": "127.0.0.1:8080"}}
	_, err := tc.runSpec(cfg, 10*time.Second, time.Second)
	for _, want := range []string{
		"config.lock.renew = 1ns is below its minimum of 1s",
		"request_timeout = 1ns is below its minimum of 100ms",
		"poll_interval = 1ns is below its minimum of 100ms",
		"add_deadline = 1ns is below its minimum of 100ms",
		"remove_deadline = 1ns is below its minimum of 100ms",
		"load_balancer.recheck_interval = 1ns is below its minimum of 1s",
		"health_check.interval = 1ns is below its minimum of 100ms",
		"health_check.timeout = 1ns is below its minimum of 100ms",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant it to say %q", err, want)
		}
	}
}

// The holder record names the task as Nomad's task config does. A job's env
// block may set NOMAD_ALLOC_ID and the like in the task environment, where
// the supervisor runs; the record must not follow it (the next gate waits
// for the allocation it names, and the LB request ids are made of it).
func TestHolderRecordComesFromTheTaskConfig(t *testing.T) {
	for k, v := range map[string]string{"NOMAD_ALLOC_ID": "forged-alloc", "NOMAD_JOB_ID": "forged-job",
		"NOMAD_JOB_PARENT_ID": "forged-parent", "NOMAD_GROUP_NAME": "forged-group", "NOMAD_TASK_NAME": "forged-task",
		"NOMAD_NODE_NAME": "forged-node"} {
		t.Setenv(k, v)
	}
	cfg := &drivers.TaskConfig{ID: "0b0e7c52-2a3b-4c5d-8e9f-0a1b2c3d4e5f/t/1", AllocID: "0b0e7c52-2a3b-4c5d-8e9f-0a1b2c3d4e5f",
		JobID: "web/dispatch-1", ParentJobID: "web", TaskGroupName: "g", Name: "t", NodeName: "node-1",
		Env: map[string]string{"NOMAD_ALLOC_ID": "forged-alloc"}}
	h := supervisorSpec{Run: shim.Spec{Holder: taskHolder(cfg)}}.holder()
	if h.AllocID != cfg.AllocID || h.JobID != "web" || h.Group != "g" || h.Task != "t" || h.Node != "node-1" || h.PID != os.Getpid() {
		t.Errorf("holder %+v, want alloc %s, job web (the parent), group g, task t, node node-1 and this PID", h, cfg.AllocID)
	}
	cfg.ParentJobID, cfg.NodeName = "", ""
	if h := (supervisorSpec{Run: shim.Spec{Holder: taskHolder(cfg)}}).holder(); h.JobID != cfg.JobID || h.Node == "" || h.Node == "forged-node" {
		t.Errorf("holder %+v, want job %s and the host name for the node", h, cfg.JobID)
	}
}

// TestLockHoldersMakesASemaphoreSpec: config.lock.holders = N makes the
// supervisor hold one of N slots under the lock path, trying first the
// slot of the allocation index Nomad's task config gives; a gate's too.
func TestLockHoldersMakesASemaphoreSpec(t *testing.T) {
	tc := decodeJobspecConfig(t, `
      config {
        command = "/bin/true"
        lock { holders = 3 }
      }`)
	cfg := &drivers.TaskConfig{ID: "a/t/1", AllocID: "a", JobID: "web", JobName: "web", TaskGroupName: "g", Name: "t",
		Env: map[string]string{"NOMAD_ALLOC_INDEX": "4"}}
	sc, err := tc.runSpec(cfg, 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := buildSpec(cfg, tc, sc, userPolicy{defaultUser: "root", allowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	got := specThroughFile(t, spec)
	if got.Holders != 3 || got.AllocIndex != 4 || got.Path != DefaultLockPath(cfg) {
		t.Errorf("supervisor config: holders %d, alloc index %d, path %s; want 3, 4, %s", got.Holders, got.AllocIndex, got.Path, DefaultLockPath(cfg))
	}

	tc = decodeJobspecConfig(t, `
      config {
        gate = true
        lock { holders = 2 }
      }`)
	sc, err = tc.runSpec(cfg, 10*time.Second, time.Second)
	if err != nil {
		t.Fatalf("a gate with holders: %v", err)
	}
	spec, err = buildSpec(cfg, tc, sc, userPolicy{defaultUser: "root", allowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := specThroughFile(t, spec); got.Holders != 2 || got.Gate == nil || got.AllocIndex != 4 {
		t.Errorf("a gate with holders: holders %d, gate %v, alloc index %d; want 2, a gate, 4", got.Holders, got.Gate, got.AllocIndex)
	}
}
