// Package driver is the `singleton` Nomad task driver: plugin glue around the
// shim supervisor. Each task's supervisor is this binary re-executed in its
// own session, so it survives plugin and agent restarts; the plugin recovers
// it by PID (pidfd) and reads its exit from a status file, turns its state
// changes into task events, and acts as a watchdog that kills the workload if
// the supervisor is stuck past its fence deadline.
package driver

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
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
	// stateRoot is state_dir, held open: every task's state dir is below it.
	stateRoot *securefs.Dir

	tasks *taskStore
	// gateLeases are the leases of gates that Nomad may restart.
	gateLeases gateLeases

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
	return &Driver{
		ctx:     ctx,
		logger:  logger,
		eventer: eventer.NewEventer(ctx, logger),
		ttl:     shim.DefaultTTL,
		delay:   shim.DefaultLockDelay,
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
	var pc PluginConfig
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
		Message:     msg,
		Annotations: annotations,
	}
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

// taskStore maps task IDs to handles.
type taskStore struct {
	mu    sync.RWMutex
	store map[string]*taskHandle
}

func newTaskStore() *taskStore { return &taskStore{store: map[string]*taskHandle{}} }

func (s *taskStore) set(id string, h *taskHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store[id] = h
}

func (s *taskStore) get(id string) (*taskHandle, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.store[id]
	return h, ok
}

// all returns every handle.
func (s *taskStore) all() []*taskHandle {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*taskHandle, 0, len(s.store))
	for _, h := range s.store {
		out = append(out, h)
	}
	return out
}

func (s *taskStore) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.store, id)
}
