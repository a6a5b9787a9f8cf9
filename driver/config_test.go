package driver

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
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
		if _, err := c.shimConfig(&drivers.TaskConfig{JobID: long + ".x", TaskGroupName: "group", Name: task}, 15*time.Second, 5*time.Second); err != nil {
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
		{name: "explicit lock block", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{
			Path: "nomad/jobs/web/leader", TTL: "20s", Delay: "2s", Renew: "5s", Wait: "1m", KillSignal: "SIGINT", KillTimeout: "9s"}}},
		{name: "ttl below Nomad's minimum", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{TTL: "5s"}},
			wantErr: "Nomad accepts 10s to 24h"},
		{name: "duration without unit", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{TTL: "10"}},
			wantErr: `config.lock.ttl = "10" is not a duration`},
		{name: "path outside nomad/jobs", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{Path: "nomad/web"}},
			wantErr: "below nomad/jobs/"},
		{name: "unknown kill signal", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{KillSignal: "SIGNOPE"}},
			wantErr: "config.lock.kill_signal"},
		{name: "zero delay", tc: TaskConfig{Command: "/bin/app", Lock: LockConfig{Delay: "0s"}},
			wantErr: "replaces 0 with 15s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.tc.shimConfig(cfg, 15*time.Second, 5*time.Second)
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
			if tc.tc.Lock.Path == "" && c.Path != "nomad/jobs/web/g/t/lock" {
				t.Fatalf("default path: %q", c.Path)
			}
			if tc.tc.Lock.TTL == "" && (c.TTL != 15*time.Second || c.LockDelay != 5*time.Second) {
				t.Fatalf("plugin defaults not applied: ttl %s delay %s", c.TTL, c.LockDelay)
			}
			if tc.tc.Lock.KillSignal == "SIGINT" && (c.KillSignal != syscall.SIGINT || c.KillTimeout != 9*time.Second) {
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
