package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The singleton task driver plugin, as built by `make build` (or `make plugin`).
const (
	// PluginFileName is the plugin binary's file name: the name its agent
	// config block must carry, `plugin "nomad-driver-singleton" { ... }`.
	PluginFileName = "nomad-driver-singleton"
	// PluginDriverName is what jobspecs use: driver = "singleton".
	PluginDriverName = "singleton"
	// EnvPluginDir overrides where PluginDir finds the plugin.
	EnvPluginDir = "E2E_PLUGIN_DIR"
	// SuperviseArg is argv[1] of a task's supervisor: the plugin binary
	// re-executed as `nomad-driver-singleton __singleton-supervise <state_dir>/<alloc ID>/<task>`.
	SuperviseArg = "__singleton-supervise"
)

// PluginDir returns the absolute directory holding the plugin binary:
// $E2E_PLUGIN_DIR, or <repo>/bin/plugins. It must hold nothing else that is
// executable, since Nomad launches every binary in plugin_dir. The test fails
// if the plugin is missing, with instructions to build it.
func PluginDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(EnvPluginDir)
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin", "plugins")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatalf("harness: plugin dir %s: %v", dir, err)
	}
	fi, err := os.Stat(filepath.Join(abs, PluginFileName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.Fatalf("harness: plugin %s not found in %s: run `make build` in the repository root (or set %s)",
			PluginFileName, abs, EnvPluginDir)
	case err != nil:
		t.Fatalf("harness: plugin: %v", err)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		t.Fatalf("harness: %s is not an executable file: run `make build`", filepath.Join(abs, PluginFileName))
	}
	return abs
}

// PluginBin is the absolute path of the plugin binary in PluginDir.
func PluginBin(t testing.TB) string {
	t.Helper()
	return filepath.Join(PluginDir(t), PluginFileName)
}

// SingletonPluginConfig is the agent config block that loads the plugin with
// the given lock defaults (e.g. "10s", "1s"; "" leaves the plugin's default).
// Nomad 1.11 loads a plugin from plugin_dir only if such a block names it.
//
// It opts in to root tasks (allow_root, default_user = "root"): most tests'
// workloads write their records into the test's private (0700) temp dirs.
// The security tests run the plugin with its safe defaults instead
// (SingletonPluginConfigSafe). Its state_dir is below each client's data
// dir, so a killed test leaves nothing behind elsewhere.
func SingletonPluginConfig(defaultTTL, defaultDelay string) string {
	return SingletonPluginConfigWith(defaultTTL, defaultDelay)
}

// SingletonPluginConfigWith is SingletonPluginConfig with extra config
// lines (e.g. `metrics_addr = "127.0.0.1:9464"`).
func SingletonPluginConfigWith(defaultTTL, defaultDelay string, extra ...string) string {
	var lines strings.Builder
	lines.WriteString("    allow_root    = true\n    default_user  = \"root\"\n    state_dir     = \"" + StateDirPlaceholder + "\"\n")
	for _, l := range extra {
		fmt.Fprintf(&lines, "    %s\n", l)
	}
	return singletonPluginConfig(defaultTTL, defaultDelay, lines.String())
}

// DockerEndpointPlaceholder in an AgentOptions.Config snippet becomes the
// test's private Docker engine (AgentOptions.Docker), through which a gate
// kills its gated docker tasks, or "" without one.
const DockerEndpointPlaceholder = "@SINGLETON_DOCKER_ENDPOINT@"

// StateDirPlaceholder in an AgentOptions.Config snippet becomes a directory
// below the client's data dir.
const StateDirPlaceholder = "@SINGLETON_STATE_DIR@"

// SingletonPluginConfigSafe loads the plugin with its defaults for who tasks
// run as (default_user "nobody", allow_root false) plus extra config lines.
func SingletonPluginConfigSafe(defaultTTL, defaultDelay string, extra ...string) string {
	var lines strings.Builder
	for _, l := range extra {
		fmt.Fprintf(&lines, "    %s\n", l)
	}
	return singletonPluginConfig(defaultTTL, defaultDelay, lines.String())
}

func singletonPluginConfig(defaultTTL, defaultDelay, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plugin %q {\n  config {\n", PluginFileName)
	b.WriteString(extra)
	if !strings.Contains(extra, "docker_endpoint") {
		fmt.Fprintf(&b, "    docker_endpoint = %q\n", DockerEndpointPlaceholder)
	}
	if defaultTTL != "" {
		fmt.Fprintf(&b, "    default_ttl   = %q\n", defaultTTL)
	}
	if defaultDelay != "" {
		fmt.Fprintf(&b, "    default_delay = %q\n", defaultDelay)
	}
	b.WriteString("  }\n}")
	return b.String()
}

// SingletonAgentOptions returns AgentOptions that load the singleton plugin
// (PluginDir, SingletonPluginConfig) and wait until both raw_exec and the
// singleton driver are healthy. Adjust the result (Dev, more Config) as needed.
func SingletonAgentOptions(t testing.TB, defaultTTL, defaultDelay string) AgentOptions {
	t.Helper()
	return AgentOptions{
		PluginDir:      PluginDir(t),
		Config:         []string{SingletonPluginConfig(defaultTTL, defaultDelay)},
		RequireDrivers: []string{"raw_exec", PluginDriverName},
	}
}

// PluginProcs returns the live driver plugin processes that agentPID
// launched: the plugin binary run with no arguments, whose parent is the
// agent. (Supervisors and exec helpers run the same binary with arguments.)
func PluginProcs(agentPID int, pluginBin string) ([]Proc, error) {
	return scanProcs(func(p Proc) bool {
		return p.PPID == agentPID && len(p.Argv) == 1 &&
			strings.TrimSuffix(p.Exe, " (deleted)") == pluginBin
	})
}

// SupervisorProcs returns the live supervisors (`__singleton-supervise`
// processes) of the allocation's tasks.
func SupervisorProcs(allocID string) ([]Proc, error) {
	if allocID == "" {
		return nil, errors.New("SupervisorProcs: empty alloc ID")
	}
	return scanProcs(func(p Proc) bool {
		return len(p.Argv) >= 3 && p.Argv[1] == SuperviseArg && strings.Contains(p.Argv[2], "/"+allocID+"/")
	})
}

// ProcStatus returns one field of /proc/<pid>/status, e.g. "VmHWM" gives
// "21344 kB".
func ProcStatus(pid int, field string) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// ProcStartTicks returns when the process started (field 22 of
// /proc/<pid>/stat, clock ticks since boot). With the PID it identifies a
// process for good: compare it before signalling a PID read earlier.
func ProcStartTicks(pid int) (uint64, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	const starttime = 22 - 3 // fields[0] is field 3 (state)
	if len(fields) <= starttime {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[starttime], 10, 64)
}

// TaskDir is the task's directory on the client: <AllocDir>/<alloc id>/<task>.
func (a *Agent) TaskDir(allocID, task string) string {
	return filepath.Join(a.AllocDir(), allocID, task)
}
