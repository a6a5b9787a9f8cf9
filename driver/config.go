package driver

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/dockerengine"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// PluginConfig is the agent's `plugin "nomad-driver-singleton" { config {} }`:
// what an operator sets once per client.
type PluginConfig struct {
	// DeniedHostUIDs and DeniedHostGIDs are ranges like "0-999,65534" that
	// a task's user must not map to.
	DeniedHostUIDs string `codec:"denied_host_uids"`
	DeniedHostGIDs string `codec:"denied_host_gids"`
	// DefaultTTL and DefaultDelay apply when a task's lock block sets none.
	DefaultTTL   string `codec:"default_ttl"`
	DefaultDelay string `codec:"default_delay"`
	// StateDir is where the plugin and each task's supervisor keep their
	// state: a root-owned 0700 directory that no task and no local user can
	// write (see internal/securefs).
	StateDir string `codec:"state_dir"`
	// DefaultUser runs tasks that set no `user`.
	DefaultUser string `codec:"default_user"`
	// AllowRoot lets tasks run as uid 0. Off by default: whoever may submit
	// a job would otherwise have root on every client.
	AllowRoot bool `codec:"allow_root"`
	// DeniedEnvvars are glob patterns (as raw_exec's) of environment
	// variables removed from every task's workload.
	DeniedEnvvars []string `codec:"denied_envvars"`
	// ReleaseTokenFile holds an ACL token the plugin releases with when a
	// task's own workload identity no longer authenticates (a purged job),
	// once it has proven the task dead (see releasetoken.go).
	ReleaseTokenFile string `codec:"release_token_file"`
	// DockerEndpoint is the local Docker engine's socket, through which a
	// gate kills and proves dead its gated docker tasks (see gatedtasks.go).
	// Empty ("") leaves them to Nomad's client.
	DockerEndpoint string `codec:"docker_endpoint"`
	// MetricsAddr, if set, is the host:port where the plugin serves
	// /metrics for every task it supervises (docs/operations.md).
	MetricsAddr string `codec:"metrics_addr"`
}

// Plugin config defaults.
const (
	DefaultStateDir = "/var/lib/nomad-driver-singleton"
	DefaultUser     = "nobody"
)

var pluginConfigSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"denied_host_uids": hclspec.NewAttr("denied_host_uids", "string", false),
	"denied_host_gids": hclspec.NewAttr("denied_host_gids", "string", false),
	"default_ttl": hclspec.NewDefault(hclspec.NewAttr("default_ttl", "string", false),
		hclspec.NewLiteral(`"15s"`)),
	"default_delay": hclspec.NewDefault(hclspec.NewAttr("default_delay", "string", false),
		hclspec.NewLiteral(`"5s"`)),
	"state_dir": hclspec.NewDefault(hclspec.NewAttr("state_dir", "string", false),
		hclspec.NewLiteral(`"`+DefaultStateDir+`"`)),
	"default_user": hclspec.NewDefault(hclspec.NewAttr("default_user", "string", false),
		hclspec.NewLiteral(`"`+DefaultUser+`"`)),
	"allow_root": hclspec.NewDefault(hclspec.NewAttr("allow_root", "bool", false),
		hclspec.NewLiteral("false")),
	"denied_envvars":     hclspec.NewAttr("denied_envvars", "list(string)", false),
	"release_token_file": hclspec.NewAttr("release_token_file", "string", false),
	"docker_endpoint": hclspec.NewDefault(hclspec.NewAttr("docker_endpoint", "string", false),
		hclspec.NewLiteral(`"`+dockerengine.DefaultEndpoint+`"`)),
	"metrics_addr": hclspec.NewAttr("metrics_addr", "string", false),
})

// defaults parses the plugin-level lock defaults.
func (pc PluginConfig) defaults() (ttl, delay time.Duration, err error) {
	if ttl, err = (shim.DriverBlocks{}).LockDefault("ttl", pc.DefaultTTL, "plugin config default_ttl"); err != nil {
		return 0, 0, err
	}
	if delay, err = (shim.DriverBlocks{}).LockDefault("delay", pc.DefaultDelay, "plugin config default_delay"); err != nil {
		return 0, 0, err
	}
	t := lockclient.Timing{TTL: ttl, LockDelay: delay}
	if err := t.Validate(); err != nil {
		return 0, 0, fmt.Errorf("plugin config: %w", err)
	}
	return ttl, delay, nil
}

// TaskConfig is a task's `config {}` block.
type TaskConfig struct {
	// Gate makes the task hold the lock for the other tasks of its group
	// (any driver) instead of, or besides, running a command (docs/gate.md).
	Gate bool `codec:"gate"`
	// Start says when Nomad sees the task started: StartAtOnce (the
	// default) or StartOnLock.
	Start   string   `codec:"start"`
	Command string   `codec:"command"`
	Args    []string `codec:"args"`
	// DriverBlocks are config.lock, load_balancer and health_check, whose
	// settings package shim declares.
	shim.DriverBlocks
	// ShareNomadToken passes the workload identity token (NOMAD_TOKEN) on
	// to the workload. Off by default: the token can write the lock path,
	// so a workload holding it could release or renew the lock itself.
	ShareNomadToken bool `codec:"share_nomad_token"`
	// OOMScoreAdj is the workload's oom_score_adj (0–1000, as raw_exec's).
	OOMScoreAdj int `codec:"oom_score_adj"`
	// WorkDir is the workload's working directory (absolute); the default
	// is the task dir. The forked workload changes into it only after it has
	// dropped to the task user, so a job cannot use it to reach what that
	// user cannot.
	WorkDir string `codec:"work_dir"`
	// DeniedEnvvars are glob patterns of environment variables removed from
	// the workload, on top of the plugin's.
	DeniedEnvvars []string `codec:"denied_envvars"`
}

var taskConfigSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"command":           hclspec.NewAttr("command", "string", false),
	"gate":              hclspec.NewAttr("gate", "bool", false),
	"start":             hclspec.NewAttr("start", "string", false),
	"args":              hclspec.NewAttr("args", "list(string)", false),
	"share_nomad_token": hclspec.NewAttr("share_nomad_token", "bool", false),
	"oom_score_adj":     hclspec.NewAttr("oom_score_adj", "number", false),
	"work_dir":          hclspec.NewAttr("work_dir", "string", false),
	"denied_envvars":    hclspec.NewAttr("denied_envvars", "list(string)", false),
	"lock":              blockSpec("lock"),
	"load_balancer":     blockSpec("load_balancer"),
	"health_check":      blockSpec("health_check"),
})

// blockSpec is the HCL schema of the block named name, from its settings'
// declarations (shim.DriverBlocks): each an optional attribute (the lock's
// durations and signals are strings: "10s", "SIGTERM").
func blockSpec(name string) *hclspec.Spec {
	attrs := map[string]*hclspec.Spec{}
	for attr, typ := range (shim.DriverBlocks{}).Schema()[name] {
		attrs[attr] = hclspec.NewAttr(attr, typ, false)
	}
	return hclspec.NewBlock(name, false, hclspec.NewObject(attrs))
}

// DefaultLockPath is the lock of a task when its lock block names none:
// nomad/jobs/<job>/<group>/<task>/lock. The job is the parent job for
// periodic and dispatched children, so every instance of a periodic job
// competes for one lock. Nomad allows names that its variable paths do not
// (a "." in "api.v2"), so each name is escaped (see escapePathName); a path
// that would be longer than Nomad's 128 characters keeps a readable prefix
// of the job and a hash of all three names.
func DefaultLockPath(cfg *drivers.TaskConfig) string {
	job := cfg.JobID
	if cfg.ParentJobID != "" {
		job = cfg.ParentJobID
	}
	ej, eg, et := escapePathName(job), escapePathName(cfg.TaskGroupName), escapePathName(cfg.Name)
	path := fmt.Sprintf("nomad/jobs/%s/%s/%s/lock", ej, eg, et)
	if len(path) <= maxVariablePath {
		return path
	}
	sum := sha256.Sum256([]byte(job + "\x00" + cfg.TaskGroupName + "\x00" + cfg.Name))
	return fmt.Sprintf("nomad/jobs/%s/%x/lock", truncateEscaped(ej, 64), sum[:12])
}

// maxVariablePath is Nomad's limit on a variable path.
const maxVariablePath = 128

// escapePathName makes one name fit Nomad's variable path alphabet
// (a-z A-Z 0-9 - _ ~): every other byte, and "~" itself, becomes "~" and two
// hex digits, so different names never share a lock.
func escapePathName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "~%02x", c)
	}
	return b.String()
}

// truncateEscaped cuts an escaped name to at most n bytes without splitting
// an escape.
func truncateEscaped(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	if i := strings.LastIndexByte(s, '~'); i >= 0 && i > len(s)-3 {
		s = s[:i]
	}
	return s
}

// Values of config.start.
const (
	// StartAtOnce: StartTask returns as soon as the supervisor runs, and
	// the supervisor waits for the lock inside the running task. Nomad then
	// registers the task's services, and runs its poststart tasks, on
	// standbys too.
	StartAtOnce = "at_once"
	// StartOnLock: StartTask returns only once the lock is held (as a
	// gate's), so Nomad registers the task's services and runs its
	// poststart tasks on the holder alone. A standby stays "pending",
	// waiting for the lock, and watches its allocation, so that a stop
	// ends its wait (Nomad cannot stop a task whose StartTask has not
	// returned): its identity needs read-job on the namespace.
	StartOnLock = "on_lock"
)

// onLockWho words the permission error of a start = "on_lock" task that
// cannot read its allocation.
const onLockWho = `A task with config.start = "on_lock" watches its own allocation while it waits for the lock ` +
	`(Nomad cannot stop a task whose start has not returned, so a stop of the allocation must end the wait)`

// startsOnLock reports whether StartTask waits for the lock: a task with
// start = "on_lock", and every gate.
func (tc TaskConfig) startsOnLock() bool { return tc.Gate || tc.Start == StartOnLock }

// validateStart checks config.start.
func (tc TaskConfig) validateStart() error {
	switch {
	case tc.Start == "" || tc.Start == StartOnLock:
		return nil
	case tc.Start == StartAtOnce && tc.Gate:
		return fmt.Errorf("config.start = %q with config.gate = true: a gate always starts once it holds the lock "+
			"(the group's other tasks start only then); remove config.start", tc.Start)
	case tc.Start == StartAtOnce:
		return nil
	}
	return fmt.Errorf("config.start = %q: use %q (the default: Nomad sees the task running at once, and it waits for the lock "+
		"inside, so its services are registered on standbys too) or %q (the task starts, and Nomad registers its services, "+
		"only once it holds the lock; needs read-job for the task's identity: see docs/services.md)", tc.Start, StartAtOnce, StartOnLock)
}

// runSpec turns a task's config into the run its supervisor supervises,
// validated. Every error names the jobspec field to fix.
func (tc TaskConfig) runSpec(cfg *drivers.TaskConfig, ttl, delay time.Duration) (shim.Spec, error) {
	var errs []error
	if err := tc.validateStart(); err != nil {
		errs = append(errs, err)
	}
	run, err := tc.DriverBlocks.Spec(ttl, delay, func(k string) string { return cfg.Env[k] })
	if err != nil {
		errs = append(errs, err)
	}
	run.Holder = taskHolder(cfg)
	c := &run.Config
	if tc.Command != "" || !tc.Gate {
		c.Command = append([]string{tc.Command}, tc.Args...)
	}
	if tc.Gate {
		run.Gate = &shim.GateSpec{AllocID: cfg.AllocID, Task: cfg.Name, Namespace: cfg.Namespace}
	} else if tc.Start == StartOnLock {
		run.WatchAlloc = &shim.AllocWatch{AllocID: cfg.AllocID, Namespace: cfg.Namespace, Who: onLockWho}
	}
	if c.Path == "" {
		c.Path = DefaultLockPath(cfg)
	}
	if c.LeaseMode() {
		if err := checkLeasePath(cfg, c.Path); err != nil {
			errs = append(errs, err)
		}
	}
	c.Namespace = cfg.Namespace
	// The supervisor, as root beside a task it does not trust, reaches
	// Nomad only through the task's secrets dir, from the plugin (never from
	// the task environment, which a job can set): its Task API socket.
	c.RootSecretsDir = cfg.TaskDir().SecretsDir
	c.AllocIndex = allocIndex(cfg)
	errs = append(errs, tc.validateProcess()...)
	if tc.Command == "" && !tc.Gate {
		errs = append(errs, errors.New("config.command is missing: give the program to run, or set config.gate = true "+
			"to hold the lock for the group's other tasks"))
	}
	if c.LeaseMode() && tc.ShareNomadToken {
		errs = append(errs, errors.New(`config.lock.mode = "lease" with config.share_nomad_token = true: `+
			"a workload with the token could write the heartbeat the standby trusts; remove share_nomad_token"))
	}
	if tc.Command == "" && len(tc.Args) > 0 {
		errs = append(errs, errors.New("config.args without config.command: a gate with args needs a command to pass them to"))
	}
	if len(errs) > 0 {
		return run, errors.Join(errs...)
	}
	if err := run.Validate(); err != nil {
		return run, fmt.Errorf("invalid config.lock: %w", err)
	}
	return run, nil
}

// checkLeasePath keeps a lease-mode task to its own job's locks: the
// standby's plugin watches, seals and releases the lock at path with the
// operator's token, so a job naming another job's lock path would have its
// node's plugin stand by for that job's lock. The task's own default path,
// or any path under nomad/jobs/<its job>/ (the job as DefaultLockPath
// names it), where the job's own policies reach.
func checkLeasePath(cfg *drivers.TaskConfig, path string) error {
	job := escapePathName(cmp.Or(cfg.ParentJobID, cfg.JobID))
	if path == DefaultLockPath(cfg) || strings.HasPrefix(path, "nomad/jobs/"+job+"/") {
		return nil
	}
	return fmt.Errorf(`config.lock.path = %q with config.lock.mode = "lease": the standby's plugin acts on a lease-mode lock `+
		`with the operator's token, so lease mode takes only the job's own lock paths: remove config.lock.path (the default is %s) `+
		`or put it under nomad/jobs/%s/`, path, DefaultLockPath(cfg), job)
}

// validateProcess checks the options that shape the workload's process.
func (tc TaskConfig) validateProcess() []error {
	var errs []error
	if tc.OOMScoreAdj < 0 || tc.OOMScoreAdj > 1000 {
		errs = append(errs, fmt.Errorf("config.oom_score_adj = %d: use 0 to 1000 (a negative value would shield the workload from the OOM killer)", tc.OOMScoreAdj))
	}
	if tc.WorkDir != "" && !filepath.IsAbs(tc.WorkDir) {
		errs = append(errs, fmt.Errorf("config.work_dir = %q: use an absolute path, e.g. \"${NOMAD_TASK_DIR}\" or \"/srv/app\"", tc.WorkDir))
	}
	return errs
}

// checkIdentity fails fast when the task cannot reach the Task API.
func checkIdentity(cfg *drivers.TaskConfig) error {
	if cfg.Env["NOMAD_TOKEN"] != "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(cfg.TaskDir().SecretsDir, "nomad_token")); err == nil {
		return nil
	}
	return fmt.Errorf("task %q has no workload identity token, so it cannot take the lock: "+
		"add `identity { env = true }` (or `identity { file = true }`) to the task", cfg.Name)
}

// checkLeaseIdentity refuses lease mode where the workload can read the
// workload identity token: with identity { file = true } Nomad writes it to
// secrets/nomad_token, readable by the task's user, and whoever holds it
// can write the heartbeat that a standby trusts (docs/lease.md). With
// identity { env = true } alone the workload never gets it (workloadEnv).
func checkLeaseIdentity(cfg *drivers.TaskConfig, run shim.Spec) error {
	if !run.LeaseMode() {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(cfg.TaskDir().SecretsDir, "nomad_token")); err != nil {
		return nil
	}
	return errors.New(`config.lock.mode = "lease" with the task's identity { file = true }: Nomad writes the workload identity token ` +
		`to secrets/nomad_token, which the workload can read, and with it write the heartbeat the standby trusts; ` +
		`use identity { env = true } alone (the driver keeps NOMAD_TOKEN from the workload), or remove mode = "lease"`)
}

// planTask validates the task's config and turns it into the supervisor's
// spec: the files the jobspec names read in, the identity checked, and the
// plugin's and the task's denied_envvars joined.
func planTask(cfg *drivers.TaskConfig, tc TaskConfig, ttl, delay time.Duration, users userPolicy, denied []string) (supervisorSpec, error) {
	if err := resolveLBFiles(cfg, &tc.DriverBlocks); err != nil {
		return supervisorSpec{}, err
	}
	run, err := tc.runSpec(cfg, ttl, delay)
	if err != nil {
		return supervisorSpec{}, err
	}
	if err := checkIdentity(cfg); err != nil {
		return supervisorSpec{}, err
	}
	if err := checkLeaseIdentity(cfg, run); err != nil {
		return supervisorSpec{}, err
	}
	spec, err := buildSpec(cfg, tc, run, users)
	if err != nil {
		return supervisorSpec{}, err
	}
	spec.DeniedEnvvars = slices.Concat(denied, tc.DeniedEnvvars)
	return spec, nil
}

// taskHolder is the holder record of the task, as Nomad's task config
// names it. A dispatched or periodic job's child is recorded as its parent
// job, as NOMAD_JOB_PARENT_ID would be.
func taskHolder(cfg *drivers.TaskConfig) lockclient.Holder {
	return lockclient.Holder{AllocID: cfg.AllocID, JobID: cmp.Or(cfg.ParentJobID, cfg.JobID),
		Group: cfg.TaskGroupName, Task: cfg.Name, Node: cfg.NodeName}
}

// buildSpec turns the validated run into the supervisor's spec, with the
// task's user resolved and checked against the plugin's user policy.
func buildSpec(cfg *drivers.TaskConfig, tc TaskConfig, run shim.Spec, users userPolicy) (supervisorSpec, error) {
	// The driver's supervisor waits for an ACL policy rather than fail (a
	// task event names it), and stands behind its task with the plugin,
	// which releases with its own token what the task's identity no longer
	// can.
	run.WaitForPolicy, run.PluginReleases = true, true
	spec := supervisorSpec{Run: run, TaskID: cfg.ID, taskProcess: taskProcess{
		WorkDir: cmp.Or(tc.WorkDir, cfg.TaskDir().Dir), ShareNomadToken: tc.ShareNomadToken, OOMScoreAdj: tc.OOMScoreAdj}}
	id, err := users.resolve(cfg.User)
	if err != nil {
		return spec, err
	}
	// A work_dir of the job's choosing is not checked here (that would tell
	// the job about paths its user cannot see): the workload changes into it
	// as the task user, so the kernel's permission checks decide.
	if err := checkReach(cfg.TaskDir().Dir, id); err != nil {
		return spec, err
	}
	if id.uid != 0 {
		uid := id.uid
		spec.UID, spec.GID, spec.Groups = &uid, id.gid, id.groups
	}
	return spec, nil
}

// allocIndex is the allocation's index in its group, as Nomad's task config
// gives it (NOMAD_ALLOC_INDEX of the task's environment; 0 if none). A
// semaphore's holder tries that slot first: a preference only, which bears
// on no guarantee, so a jobspec that sets the variable itself changes
// nothing but its own order of tries.
func allocIndex(cfg *drivers.TaskConfig) int {
	i, err := strconv.Atoi(cfg.Env["NOMAD_ALLOC_INDEX"])
	if err != nil || i < 0 {
		return 0
	}
	return i
}
