package driver

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Lease mode's standby half (docs/lease.md). The holder's supervisor
// writes the heartbeat and escrows its lock ID (lockclient/heartbeat.go);
// the plugin of a node whose lease-mode task waits for the lock watches
// that heartbeat with the operator's release token and, when the holder
// is proven dead by the rule in lockclient/takeover.go, releases the lock
// for it, so that its own task acquires. The token stays in the plugin: it
// goes only to the Nomad agent, through the task's api.sock
// (operatorEndpoint), never to a task.

// errLeaseNeedsToken refuses lease mode on a client without the token
// that reads the escrowed lock ID.
var errLeaseNeedsToken = errors.New(`config.lock.mode = "lease" needs the plugin config release_token_file: ` +
	"the standby's plugin reads the holder's escrowed lock ID with it (examples/acl/singleton-release.policy.hcl, docs/lease.md); " +
	"set it on every client, or remove mode = \"lease\"")

// checkLeaseMode refuses a lease-mode task this plugin could not stand by for.
func (d *Driver) checkLeaseMode(spec supervisorSpec) error {
	if !spec.Run.LeaseMode() {
		return nil
	}
	d.mu.RLock()
	path := d.config.ReleaseTokenFile
	d.mu.RUnlock()
	if path == "" {
		return errLeaseNeedsToken
	}
	return nil
}

// leaseStandbyCheck is how often the standby checks whether its task
// still waits.
const leaseStandbyCheck = time.Second

// startLeaseStandby says at start what lease mode derives (L), and runs
// the standby while the task waits for the lock.
func (d *Driver) startLeaseStandby(h *taskHandle, spec supervisorSpec) {
	hb := spec.Run.Heartbeat()
	if hb == nil {
		return
	}
	d.emitEvent(h.cfg, leaseModeMessage(*hb), nil)
	go d.leaseStandby(h, spec.Run, *hb)
}

// leaseStandby watches the lock's heartbeat until the task holds the lock
// or ends, and takes a dead holder's lock over (lockclient.WatchTakeover).
func (d *Driver) leaseStandby(h *taskHandle, run shim.Spec, hb lockclient.Heartbeat) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		t := time.NewTicker(leaseStandbyCheck)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				cancel()
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if shim.State(h.lastStatus().State).Holds() {
					cancel()
					return
				}
			}
		}
	}()
	log := h.logger.Named("lease-standby")
	defer d.metrics.standby(h.cfg.ID, false, 0)
	ep, err := d.operatorEndpoint(h)
	if err == nil {
		var l *lockclient.Locker
		l, err = lockclient.New(lockclient.Config{Endpoint: ep, Namespace: run.Namespace, Path: run.Path, Timing: run.Timing(), Logger: log})
		if err == nil {
			err = l.WatchTakeover(ctx, lockclient.TakeoverOptions{
				Heartbeat: hb, SealedBy: h.cfg.AllocID,
				MayAct: func() bool { return !h.exited() && shim.State(h.lastStatus().State) == shim.StateWaiting },
				OnSkip: func(why string) {
					d.emitEvent(h.cfg, leaseNoTakeoverMessage(why), map[string]string{"lock_state": string(shim.StateWaiting)})
				},
				OnRead: func(age time.Duration) { d.metrics.standby(h.cfg.ID, true, age) },
			})
		}
	}
	switch {
	case errors.Is(err, lockclient.ErrTakenOver):
		d.emitEvent(h.cfg, leaseTakeoverMessage(hb.Takeover()), map[string]string{"lock_state": string(shim.StateWaiting)})
	case err != nil && ctx.Err() == nil:
		log.Error("lease standby not running", "error", err)
		d.emitEvent(h.cfg, leaseStandbyOffMessage(err), nil)
	}
}
