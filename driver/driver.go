// Package driver is the `singleton` Nomad task driver: plugin glue around the
// shim supervisor. Each task's supervisor is this binary re-executed in its
// own session, so it survives plugin and agent restarts; the plugin recovers
// it by PID (pidfd) and reads its exit from a status file, turns its state
// changes into task events, and acts as a watchdog that kills the workload if
// the supervisor is stuck past its fence deadline.
//
// The plugin's methods are in driver.go; handle.go watches one task's
// supervisor (events, watchdog, exit, kill); statefiles.go is the file
// protocol between plugin and supervisor. The binary's other entry points,
// each behind a hidden argv[1], are here too: the supervisor's main
// (supervise.go, SuperviseCommand) and the helper that runs commands in a
// task for `nomad alloc exec` and script checks (exec.go, ExecCommand).
package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/dockerengine"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
	"golang.org/x/sys/unix"
)

const (
	// PluginName is what jobspecs use: driver = "singleton".
	PluginName = "singleton"
	// fingerprintPeriod is how often the driver re-reports its health.
	fingerprintPeriod = 30 * time.Second
	// taskHandleVersion is the version of driverState below.
	taskHandleVersion = 1
)

var pluginInfo = &base.PluginInfoResponse{
	Type:              base.PluginTypeDriver,
	PluginApiVersions: []string{drivers.ApiVersion010},
	PluginVersion:     shim.Version,
	Name:              PluginName,
}

var capabilities = &drivers.Capabilities{
	SendSignals:  true,
	Exec:         true,
	FSIsolation:  fsisolation.None,
	MountConfigs: drivers.MountConfigSupportNone,
	NetIsolationModes: []drivers.NetIsolationMode{
		drivers.NetIsolationModeHost,
	},
}

// Driver is the singleton task driver plugin.
type Driver struct {
	ctx     context.Context
	logger  hclog.Logger
	eventer *eventer.Eventer

	mu         sync.RWMutex
	config     PluginConfig
	ttl, delay time.Duration
	users      userPolicy
	// agent is the Nomad agent's program, the only server the operator's
	// release token is sent to.
	agent exeID
	// stateRoot is state_dir, held open: every task's state dir is below it.
	stateRoot *securefs.Dir

	tasks *taskStore
	// metrics is what /metrics serves (plugin config metrics_addr).
	metrics pluginMetrics
	// gateLeases are the leases of gates that Nomad may restart.
	gateLeases gateLeases
	// wardens keep the gated tasks of each gate that held dead while it
	// does not hold (warden.go).
	wardens wardens

	// Events emitted before Nomad has subscribed (the first moments after a
	// plugin restart, while tasks are recovered) wait here: the eventer drops
	// events nobody is subscribed to.
	eventsMu   sync.Mutex
	subscribed bool
	pending    []*drivers.TaskEvent
}

// New returns the plugin. It must do nothing else: Nomad starts the binary
// once only to read PluginInfo and ConfigSchema.
func New(ctx context.Context, logger hclog.Logger) *Driver {
	logger = logger.Named(PluginName)
	ttl, delay, _ := PluginConfig{}.defaults() // the lock settings' own
	return &Driver{
		ctx:     ctx,
		logger:  logger,
		eventer: eventer.NewEventer(ctx, logger),
		ttl:     ttl,
		delay:   delay,
		tasks:   newTaskStore(),
	}
}

func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

func (d *Driver) ConfigSchema() (*hclspec.Spec, error) { return pluginConfigSpec, nil }

func (d *Driver) TaskConfigSchema() (*hclspec.Spec, error) { return taskConfigSpec, nil }

func (d *Driver) Capabilities() (*drivers.Capabilities, error) { return capabilities, nil }

// SetConfig receives the agent's plugin block. Errors here stop the agent
// from loading the plugin, with the message in the agent log.
func (d *Driver) SetConfig(cfg *base.Config) error {
	pc := PluginConfig{DockerEndpoint: dockerengine.DefaultEndpoint}
	if len(cfg.PluginConfig) != 0 {
		if err := base.MsgPackDecode(cfg.PluginConfig, &pc); err != nil {
			return fmt.Errorf("decode plugin config: %w", err)
		}
	}
	ttl, delay, err := pc.defaults()
	if err != nil {
		return err
	}
	users, err := newUserPolicy(d.logger, pc)
	if err != nil {
		return err
	}
	if pc.DockerEndpoint != "" {
		if _, err := dockerengine.SocketPath(pc.DockerEndpoint); err != nil {
			return fmt.Errorf("plugin config docker_endpoint: %w; set \"\" to leave gated docker tasks to Nomad", err)
		}
	}
	if pc.ReleaseTokenFile != "" {
		if _, err := readReleaseToken(pc.ReleaseTokenFile); err != nil {
			return err
		}
	}
	if pc.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(pc.MetricsAddr); err != nil {
			return fmt.Errorf("plugin config metrics_addr %q: %w; give host:port, e.g. \"127.0.0.1:9464\", or remove it", pc.MetricsAddr, err)
		}
	}
	root, err := securefs.OpenPrivate(cmp.Or(pc.StateDir, DefaultStateDir), true)
	if err != nil {
		return fmt.Errorf("plugin config state_dir: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stateRoot != nil {
		d.stateRoot.Close()
	}
	d.config, d.ttl, d.delay, d.users, d.stateRoot = pc, ttl, delay, users, root
	d.agent = agentExe()
	go d.resumeWardens(root)
	d.metrics.serve(d.ctx, pc.MetricsAddr, d.logger)
	return nil
}

func (d *Driver) Fingerprint(ctx context.Context) (<-chan *drivers.Fingerprint, error) {
	ch := make(chan *drivers.Fingerprint)
	go func() {
		defer close(ch)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-timer.C:
				timer.Reset(fingerprintPeriod)
				select {
				case ch <- d.fingerprint():
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}

func (d *Driver) fingerprint() *drivers.Fingerprint {
	d.mu.RLock()
	ttl, delay := d.ttl, d.delay
	d.mu.RUnlock()
	return &drivers.Fingerprint{
		Health:            drivers.HealthStateHealthy,
		HealthDescription: drivers.DriverHealthy,
		Attributes: map[string]*pstructs.Attribute{
			"driver.singleton":               pstructs.NewBoolAttribute(true),
			"driver.singleton.version":       pstructs.NewStringAttribute(shim.Version),
			"driver.singleton.default_ttl":   pstructs.NewStringAttribute(ttl.String()),
			"driver.singleton.default_delay": pstructs.NewStringAttribute(delay.String()),
		},
	}
}

func (d *Driver) TaskEvents(ctx context.Context) (<-chan *drivers.TaskEvent, error) {
	ch, err := d.eventer.TaskEvents(ctx)
	if err != nil {
		return nil, err
	}
	d.eventsMu.Lock()
	pending := d.pending
	d.pending, d.subscribed = nil, true
	d.eventsMu.Unlock()
	go func() {
		for _, ev := range pending {
			d.send(ev)
		}
	}()
	return ch, nil
}

func (d *Driver) emitEvent(cfg *drivers.TaskConfig, msg string, annotations map[string]string) {
	ev := &drivers.TaskEvent{
		TaskID:      cfg.ID,
		TaskName:    cfg.Name,
		AllocID:     cfg.AllocID,
		Timestamp:   time.Now(),
		Message:     eventMessage(msg),
		Annotations: annotations,
	}
	d.metrics.taskEvent(cfg.ID, msg)
	d.eventsMu.Lock()
	if !d.subscribed {
		d.pending = append(d.pending, ev)
		d.eventsMu.Unlock()
		return
	}
	d.eventsMu.Unlock()
	d.send(ev)
}

func (d *Driver) send(ev *drivers.TaskEvent) {
	if err := d.eventer.EmitEvent(ev); err != nil {
		d.logger.Warn("emit task event", "task_id", ev.TaskID, "error", err)
	}
}

// driverState is persisted by Nomad in the task handle, to recover the task
// after a plugin restart.
type driverState struct {
	PID        int
	StartTicks uint64
	StartedAt  time.Time
	StateDir   string
	// SpecVersion is the version of the task's spec.json (shim.SpecVersion
	// when it was written; 0: version 1, before it was recorded).
	SpecVersion int `json:",omitempty"`
}

// StartTask starts the task's supervisor, detached in its own session.
func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	if _, ok := d.tasks.get(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task %q already started", cfg.ID)
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, nil, fmt.Errorf("decode task config: %w", err)
	}
	d.mu.RLock()
	ttl, delay, root, users, denied := d.ttl, d.delay, d.stateRoot, d.users, d.config.DeniedEnvvars
	metrics := d.config.MetricsAddr != ""
	d.mu.RUnlock()
	if root == nil {
		return nil, nil, errors.New("the plugin has no state dir: see the agent log for the plugin config error")
	}

	spec, err := planTask(cfg, tc, ttl, delay, users, denied)
	if err != nil {
		return nil, nil, err
	}
	if err := d.checkLeaseMode(spec); err != nil {
		return nil, nil, err
	}
	spec.Metrics = metrics
	cg, err := d.setUpCgroup(cfg, &spec)
	if err != nil {
		return nil, nil, err
	}
	if err := d.takeOver(cfg, root, tc, &spec); err != nil {
		return nil, nil, err
	}
	dir, proc, err := d.startSupervisor(cfg, root, spec)
	if err != nil {
		return nil, nil, err
	}
	ticks, _ := startTicks(proc.pid)

	h := &taskHandle{
		cfg: cfg, dir: dir, proc: proc, cgroup: cg, startedAt: time.Now(),
		logger: d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		done:   make(chan struct{}), gate: tc.Gate, lease: spec.Run.LeaseMode(),
	}
	if tc.startsOnLock() {
		h.holding = make(chan struct{})
	}
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg
	if err := handle.SetDriverState(&driverState{PID: proc.pid, StartTicks: ticks, StartedAt: h.startedAt, StateDir: dir.Path(),
		SpecVersion: spec.Run.Version}); err != nil {
		_ = proc.signal(syscall.SIGKILL)
		return nil, nil, fmt.Errorf("set driver state: %w", err)
	}
	d.tasks.set(cfg.ID, h)
	d.metrics.track(h, spec)
	go d.run(h, &eventTail{dir: dir})
	h.logger.Info("started supervisor", "pid", proc.pid, "lock", spec.Run.Path)
	d.startLeaseStandby(h, spec)
	if h.holding != nil {
		if err := d.waitHolding(h, root, spec.Run.Path); err != nil {
			return nil, nil, err
		}
	}
	return handle, nil, nil
}

// takeOver readies the start of a task that starts on lock: it ends an
// earlier start of the same task, and gives a gate the lease its previous
// run left (gateLeases, supersedeStart). A gate that held before in this
// allocation, whose gated tasks Nomad may start again (its warden is
// armed), and that finds no lease to take over, is refused: it would wait
// for the lock while they run, or start, beside the next holder; unless
// Nomad restarted the whole allocation (restartedWhole: a step-down), which
// holds the gated tasks back until the gate holds again.
// The new run's spec, which names the lease, is on disk before the
// plugin's warden may look again (runHolds).
func (d *Driver) takeOver(cfg *drivers.TaskConfig, root *securefs.Dir, tc TaskConfig, spec *supervisorSpec) error {
	if spec.Run.Gate != nil {
		d.mu.RLock()
		spec.DockerEndpoint = d.config.DockerEndpoint
		d.mu.RUnlock()
	}
	var adopt *shim.AdoptLease
	if tc.startsOnLock() {
		adopt = d.supersedeStart(cfg, root)
	}
	if spec.Run.Gate == nil {
		return nil
	}
	d.gateLeases.mu.Lock()
	defer d.gateLeases.mu.Unlock()
	if kept := d.gateLeases.takeLocked(cfg, root); kept != nil && adopt == nil {
		adopt = kept
	}
	spec.Run.Gate.Adopt = adopt
	if adopt == nil && d.wardenArmed(cfg, root) && !d.restartedWhole(cfg, spec.Run) {
		d.emitEvent(cfg, gateNotRestartedMessage(), map[string]string{"lock_state": string(shim.StateLost)})
		return fmt.Errorf("gate %q: %s", cfg.Name, gateNotRestartedMessage())
	}
	dir, err := openTaskState(root, cfg)
	if err != nil {
		return fmt.Errorf("task state dir: %w", err)
	}
	defer dir.Close()
	return prepareStateDir(dir, *spec)
}

// RecoverTask reattaches to a supervisor after a plugin restart. The task
// keeps running and keeps its lock: the supervisor never noticed.
func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return errors.New("recover task: nil handle")
	}
	if _, ok := d.tasks.get(handle.Config.ID); ok {
		return nil
	}
	var st driverState
	if err := handle.GetDriverState(&st); err != nil {
		return fmt.Errorf("recover task: decode driver state: %w", err)
	}
	cfg := handle.Config
	cg, _ := newTaskCgroup(cfg)
	dir, err := securefs.OpenPrivate(st.StateDir, false)
	if err != nil {
		// A task started by an older plugin keeps its state in the task dir,
		// which the task user can write: nothing in it can be trusted. Kill
		// its supervisor (proven by PID and start time; its group guard then
		// kills the workload) and let the lock expire on the server.
		killUnrecoverable(st)
		return fmt.Errorf("recover task: its state dir cannot be trusted (%w); its supervisor was killed and "+
			"its lock expires on the server within 2×TTL + delay", err)
	}
	var spec supervisorSpec
	if err := checkSpecVersion(cmp.Or(st.SpecVersion, legacySpecVersion)); err != nil {
		// A later plugin's task, whose state this one cannot read: it could
		// neither watch it nor release for it. Not a silent failover: the
		// task fails with the way out, and its lock expires on the server.
		dir.Close()
		killUnrecoverable(st)
		return fmt.Errorf("recover task: %w; its supervisor was killed and its lock expires on the server within 2×TTL + delay", err)
	}
	h := &taskHandle{
		cfg: cfg, dir: dir, cgroup: cg, startedAt: st.StartedAt,
		logger: d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		done:   make(chan struct{}),
	}
	// A recovered gate is still a gate: its watchdog kills its gated tasks.
	h.gate = readSpec(dir, &spec) == nil && spec.Run.Gate != nil
	h.lease = spec.Run.LeaseMode()
	d.metrics.track(h, spec)
	tail := &eventTail{dir: dir}
	tail.restore()

	proc, err := findSupervisor(st.PID, st.StartTicks)
	if err != nil && !errors.Is(err, errSupervisorGone) {
		// No pidfd (say EMFILE), but the supervisor may live: Nomad would
		// otherwise start a second one beside it. Watch it by PID and start
		// time instead.
		h.logger.Warn("recover task: no pidfd on the supervisor; watching it by PID and start time", "pid", st.PID, "error", err)
		proc, err = &supervisorProc{pid: st.PID, pidfd: -1, ticks: st.StartTicks}, nil
	}
	switch {
	case errors.Is(err, errSupervisorGone):
		h.logger.Warn("supervisor exited while the plugin was down", "pid", st.PID)
		d.tasks.set(cfg.ID, h)
		go func() {
			d.drainEvents(h, tail)
			d.cleanUpAfterExit(h)
			h.finish(d.exitResult(h, nil, nil))
		}()
		return nil
	case err != nil:
		return fmt.Errorf("recover task: %w", err)
	}
	h.proc = proc
	d.tasks.set(cfg.ID, h)
	go d.run(h, tail)
	h.logger.Info("recovered supervisor", "pid", st.PID)
	if spec.Run.LeaseMode() && d.checkLeaseMode(spec) == nil {
		go d.leaseStandby(h, spec.Run, *spec.Run.Heartbeat())
	}
	return nil
}

// killUnrecoverable SIGKILLs the supervisor of a task that cannot be
// recovered, once proven by PID and start time: its group guard then kills
// the workload.
func killUnrecoverable(st driverState) {
	if proc, err := findSupervisor(st.PID, st.StartTicks); err == nil {
		_ = proc.signal(syscall.SIGKILL)
		unix.Close(proc.pidfd)
	}
}

func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *drivers.ExitResult, 1)
	go func() {
		defer close(ch)
		select {
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		case <-h.done:
		}
		h.mu.Lock()
		res := h.exit.Copy()
		h.mu.Unlock()
		ch <- res
	}()
	return ch, nil
}

// StopTask asks the supervisor to stop the workload with the task's
// kill_signal and kill_timeout and release the lock. If it has not exited by
// kill_timeout + stopReserve it is SIGKILLed; its group guard then kills the
// workload, and the lock expires on the server.
func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.exited() {
		return nil
	}
	if h.proc == nil {
		// Recovered after its supervisor had exited: the clean-up after
		// that exit (a crash release, bounded) is under way, and ends the
		// task. There is no supervisor to ask.
		select {
		case <-h.done:
		case <-time.After(timeout + stopReserve):
		}
		return nil
	}
	sig := syscall.SIGINT // Nomad's default kill_signal
	if signal != "" {
		s, err := shim.ParseSignal(signal)
		if err != nil {
			return fmt.Errorf("stop task: kill_signal: %w", err)
		}
		sig = s
	}
	if err := writeJSON(h.dir, stopFile, stopRequest{Signal: int(sig), Timeout: timeout}); err != nil {
		h.logger.Error("write stop request; killing the supervisor instead", "error", err)
		return h.kill("stop request could not be written")
	}
	if err := h.proc.signal(stopSignal); err != nil {
		return fmt.Errorf("stop task: signal supervisor: %w", err)
	}
	wait := timeout + stopReserve + h.lbRemoveReserve()
	select {
	case <-h.done:
		return nil
	case <-time.After(wait):
		return h.kill(fmt.Sprintf("supervisor still running %s after the stop request", wait))
	}
}

func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if !h.exited() {
		if !force {
			return errors.New("cannot destroy a running task without force")
		}
		if err := h.kill("task destroyed"); err != nil {
			return err
		}
	}
	d.tasks.delete(taskID)
	d.metrics.forget(taskID)
	d.mu.RLock()
	root := d.stateRoot
	d.mu.RUnlock()
	d.gateLeases.keep(h, root)
	if root != nil {
		if err := removeTaskState(root, h.cfg); err != nil {
			h.logger.Warn("remove the task's state dir", "error", err)
		}
	}
	h.dir.Close()
	return nil
}

func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := &drivers.TaskStatus{
		ID: h.cfg.ID, Name: h.cfg.Name, State: drivers.TaskStateRunning, StartedAt: h.startedAt,
		DriverAttributes: map[string]string{
			"lock_state": h.status.State,
			"lock_path":  h.status.Path,
			"fence":      strconv.FormatUint(h.status.Fence, 10),
		},
	}
	if h.exit != nil {
		ts.State, ts.CompletedAt, ts.ExitResult = drivers.TaskStateExited, h.completedAt, h.exit.Copy()
	}
	return ts, nil
}

// SignalTask delivers `nomad alloc signal` to the workload itself.
func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig, err := shim.ParseSignal(signal)
	if err != nil {
		return err
	}
	st := h.lastStatus()
	if h.gate && st.WorkloadPID == 0 && shim.State(st.State).Holds() {
		return fmt.Errorf("task %q is a gate with no command: there is no workload to signal; signal the gated tasks", h.cfg.Name)
	}
	if st.WorkloadPID <= 1 || h.proc == nil || !(shim.State(st.State).Holds() || st.State == string(shim.StateStopping)) {
		return fmt.Errorf("task %q is waiting for lock %s: there is no workload to signal yet", h.cfg.Name, st.Path)
	}
	return signalChild(h.proc.pid, st.WorkloadPID, sig)
}

func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.cgroup == nil {
		return nil, errors.New("task stats: no task cgroup (cgroups are disabled on this client)")
	}
	ch := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(ch)
		var prev cpuSample
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.done:
				return
			case <-timer.C:
			}
			usage, cur, err := h.cgroup.usage(&prev)
			prev = cur
			if err != nil {
				h.logger.Debug("task stats", "error", err)
			} else {
				select {
				case ch <- usage:
				case <-ctx.Done():
					return
				}
			}
			timer.Reset(interval)
		}
	}()
	return ch, nil
}
