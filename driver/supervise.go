package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/textclip"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
	"github.com/ryanuber/go-glob"
)

// SuperviseCommand is the hidden argv[1] with which the plugin re-execs its
// own binary as a task's supervisor, so plugin and supervisor never skew.
const SuperviseCommand = "__singleton-supervise"

// MaybeRunSupervisor runs the supervisor and exits if args ask for it.
func MaybeRunSupervisor(args []string) {
	if len(args) < 3 || args[1] != SuperviseCommand {
		return
	}
	os.Exit(runSupervisor(args[2]))
}

// runSupervisor is the detached per-task process: it joins the task cgroup,
// runs the shim supervisor, publishes its state for the plugin and records
// its exit status. Its stdout and stderr are the task's log FIFOs.
func runSupervisor(path string) int {
	log := hclog.New(&hclog.LoggerOptions{Name: "singleton", Output: os.Stderr, Level: hclog.Info})
	if err := setOOMScoreAdj(supervisorOOMScoreAdj); err != nil {
		log.Warn("cannot shield the supervisor from the system OOM killer", "error", err)
	}
	dir, err := securefs.OpenPrivate(path, false)
	if err != nil {
		log.Error("open the task's state dir", "error", err)
		return shim.ExitInfra
	}
	var spec supervisorSpec
	if err := readSpec(dir, &spec); err != nil {
		log.Error("read supervisor spec", "error", err)
		_ = writeJSON(dir, exitFile, exitStatus{ExitCode: shim.ExitConfig, Message: err.Error()})
		return shim.ExitConfig
	}
	code, msg := superviseTask(dir, spec, log)
	es := exitStatus{ExitCode: code, Message: eventMessage(msg)}
	if spec.CgroupPath != "" {
		tree := &taskCgroup{mode: cgroupslib.Mode(spec.CgroupMode), path: spec.CgroupPath}
		es.OOMKilled = tree.oomKilledSince(spec.OOMKillsAtStart)
	}
	if es.OOMKilled {
		log.Warn("the kernel OOM-killed a workload process: it used more than the task's memory limit (resources.memory, memory_max)")
	}
	if err := writeJSON(dir, exitFile, es); err != nil {
		log.Error("write exit status", "error", err)
	}
	return code
}

// supervisorOOMScoreAdj keeps the system OOM killer off the supervisor: it
// must outlive its workload to prove it dead and release the lock. The
// workload gets its own value (default 0) at fork (see taskStarter).
const supervisorOOMScoreAdj = -999

// setOOMScoreAdj sets this process's oom_score_adj; children inherit it.
func setOOMScoreAdj(v int) error {
	return os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(v)), 0o644)
}

func superviseTask(dir *securefs.Dir, spec supervisorSpec, log hclog.Logger) (int, string) {
	run := spec.Run
	run.Holder = spec.holder()
	starter, err := newTaskStarter(spec, log)
	if err != nil {
		log.Error("find the cgroups to start the workload in", "error", err)
		return shim.ExitInfra, err.Error()
	}
	pub := &publisher{dir: dir, path: run.Path, log: log}
	records := &recordHook{dir: dir, run: run, log: log}
	env := shim.Env{Logger: log, Observe: pub.observe,
		GatedTasks: gatedTasksFunc(dir, spec, log), LBRecords: records}
	env.Hooks = append(env.Hooks, records)
	env.Stdout, env.Stderr = os.Stdout, os.Stderr
	env.Env = workloadEnv(os.Environ(), spec.ShareNomadToken, spec.DeniedEnvvars)
	// The forked child drops to the task user first and only then changes
	// into spec.WorkDir (Go's exec does it in that order), so work_dir
	// reaches only what the task user may reach.
	env.Dir = spec.WorkDir
	// The workload is born in the task cgroup (see taskStarter).
	env.StartIn, env.Tree, env.RequireGuard = starter.within, workloadTree(spec), true
	if spec.UID != nil {
		env.Credential = &syscall.Credential{Uid: *spec.UID, Gid: spec.GID, Groups: spec.Groups}
	}
	if spec.CgroupPath == "" {
		pub.note(noCgroupMessage())
	}
	if spec.Metrics {
		defer newMetricsWriter(dir, log, &env).flush()
	}

	forward := make(chan os.Signal, 16)
	stops := make(chan shim.StopRequest, 1)
	env.Stop = stops
	go routeSignals(dir, log, forward, stops)

	code, err := shim.Supervise(context.Background(), run, env, forward)
	if err != nil {
		return code, err.Error()
	}
	return code, ""
}

// holder is the lock's holder record: the task as the plugin named it in
// the spec (see supervisorSpec.Run), this host and this process.
func (spec supervisorSpec) holder() lockclient.Holder {
	h := spec.Run.Holder
	h.Hostname, _ = os.Hostname()
	h.Node = cmp.Or(h.Node, h.Hostname)
	h.PID = os.Getpid()
	return h
}

// workloadTree is the task cgroup, which holds the workload's processes and
// nothing else; without one, a tree that never proves anything dead.
func workloadTree(spec supervisorSpec) shim.Tree {
	if spec.CgroupPath == "" {
		return noTree{}
	}
	return &taskCgroup{mode: cgroupslib.Mode(spec.CgroupMode), path: spec.CgroupPath}
}

// noTree stands for a task cgroup that does not exist: the lock is then
// never released early.
type noTree struct{}

func (noTree) Signal(syscall.Signal) error { return nil }
func (noTree) Alive() (bool, error)        { return false, nil }
func (noTree) KillAll(time.Duration) error {
	return errors.New("no task cgroup, so the task's processes cannot be proven dead")
}

// routeSignals turns stopSignal into a StopRequest from stop.json and passes
// every other catchable signal on.
func routeSignals(dir *securefs.Dir, log hclog.Logger, forward chan<- os.Signal, stops chan<- shim.StopRequest) {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPIPE:
			continue
		case stopSignal:
			var req stopRequest
			if err := readJSON(dir, stopFile, &req); err != nil {
				log.Error("stop requested but the request is unreadable; using SIGTERM and 5s", "error", err)
				req = stopRequest{Signal: int(syscall.SIGTERM), Timeout: shim.DefaultKillTimeout}
			}
			select {
			case stops <- shim.StopRequest{Signal: syscall.Signal(req.Signal), Timeout: req.Timeout}:
			default: // a stop is already under way
			}
		default:
			forward <- sig
		}
	}
}

// workloadEnv is the supervisor's environment less what the workload must
// not hold: the workload identity token (it can write the lock path, so a
// workload with it could release or renew the lock; shareToken keeps it),
// the LB auth key, and every variable matching a denied glob pattern (raw_exec's
// denied_envvars: "*" matches any run of characters).
func workloadEnv(env []string, shareToken bool, denied []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if (name == "NOMAD_TOKEN" && !shareToken) || name == lbhook.DefaultAuthKeyEnv ||
			slices.ContainsFunc(denied, func(pattern string) bool { return glob.Glob(pattern, name) }) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// joinCgroups moves this process into each cgroup; children inherit them.
func joinCgroups(procsFiles []string) error {
	pid := strconv.Itoa(os.Getpid())
	var errs []error
	for _, f := range procsFiles {
		if err := os.WriteFile(f, []byte(pid), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// selfTicks is this process's start time in clock ticks (0 if unknown).
var selfTicks = sync.OnceValue(func() uint64 {
	t, _ := startTicks(os.Getpid())
	return t
})

// publisher writes the supervisor's events for the plugin: every event
// refreshes status.json; a change of state or message is also appended to
// events.jsonl, which the plugin turns into task events. A notice (an LB
// API that does not answer, a re-add) is appended as it comes and leaves
// the status alone: the supervisor paces notices itself.
type publisher struct {
	dir  *securefs.Dir
	path string
	log  hclog.Logger
	last shim.Event
	// status is the status last written.
	status supervisorStatus
}

// note appends a task event that is not a state change.
func (p *publisher) note(msg string) {
	if err := appendJSONLine(p.dir, eventsFile, taskEventLine{Time: time.Now(), Message: eventMessage(msg)}); err != nil {
		p.log.Warn("write event", "error", err)
	}
}

func (p *publisher) observe(ev shim.Event) {
	if ev.Notice {
		// Not a change of state: one task event each, and the status keeps
		// the state's own message.
		p.appendEvent(ev)
		return
	}
	st := supervisorStatus{
		State: string(ev.State), Message: eventMessage(ev.Message), Path: p.path, Fence: ev.Fence,
		FenceDeadlineBoot: lockclient.BootNanos(ev.FenceDeadline), StopDeadlineBoot: lockclient.BootNanos(ev.StopDeadline),
		LastRenewBoot: lockclient.BootNanos(ev.LastRenew),
		WorkloadPID:   ev.WorkloadPID, WorkloadPGID: ev.WorkloadPGID,
		SupervisorPID: os.Getpid(), SupervisorTicks: selfTicks(), UpdatedBoot: bootNow(),
	}
	p.keepDeadlines(&st)
	if err := writeJSON(p.dir, statusFile, st); err != nil {
		p.log.Warn("write status", "error", err)
	}
	p.status = st
	if ev.State == shim.StateReleased {
		_ = p.dir.Remove(leaseFile)
	}
	if ev.Message == "" || (ev.State == p.last.State && ev.Message == p.last.Message) {
		return
	}
	p.last = ev
	p.appendEvent(ev)
}

// keepDeadlines gives a stopping or lost status that carries no deadline
// or last renew of its own (an event that only words what the supervisor
// decides) those last published for the same lease: the watchdog would
// skip a zero deadline, and the plugin would take the acquire for the
// last renew of a lease kept for a restarted gate.
func (p *publisher) keepDeadlines(st *supervisorStatus) {
	prev := p.status
	if st.Fence == 0 || st.Fence != prev.Fence || (st.State != string(shim.StateStopping) && st.State != string(shim.StateLost)) {
		return
	}
	if st.FenceDeadlineBoot == 0 {
		st.FenceDeadlineBoot = prev.FenceDeadlineBoot
	}
	if st.StopDeadlineBoot == 0 {
		st.StopDeadlineBoot = prev.StopDeadlineBoot
	}
	if st.LastRenewBoot == 0 {
		st.LastRenewBoot = prev.LastRenewBoot
	}
}

// appendEvent adds ev to events.jsonl, which the plugin turns into a task event.
func (p *publisher) appendEvent(ev shim.Event) {
	line := taskEventLine{Time: ev.Time, State: string(ev.State), Message: eventMessage(ev.Message), Fence: ev.Fence}
	if !ev.Holder.IsZero() {
		// From the lock's Items, which whoever may write the lock path
		// writes: an allocation ID is 36 bytes.
		line.Holder = textclip.Clip(ev.Holder.AllocID, maxHolderID)
	}
	if err := appendJSONLine(p.dir, eventsFile, line); err != nil {
		p.log.Warn("write event", "error", err)
	}
}
