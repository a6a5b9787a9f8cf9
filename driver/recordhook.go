package driver

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// recordHook is the driver's part in its supervisor's life cycle: it keeps
// in the task's root-only state dir what the plugin needs should the
// supervisor die, the lease it holds (lease.json, for the crash release,
// see releaseAfterCrash) and its LB registration (lb.json, for the crash
// REMOVE, see removeAfterCrash), and drops them once they are no longer
// the plugin's to act on.
type recordHook struct {
	dir *securefs.Dir
	run shim.Spec
	log hclog.Logger
}

func (h *recordHook) Name() string { return "records" }

// Held records the lease, before any other hook's work and the workload's
// start: a semaphore's, its slot's lock.
func (h *recordHook) Held(_ context.Context, l *lockclient.Lease) error {
	held := heldLease{LockID: l.LockID(), Path: l.Path(), Namespace: h.run.Namespace, Fence: l.Fence,
		TTL: h.run.TTL, LockDelay: h.run.LockDelay, LastRenewBoot: lockclient.BootNanos(l.LastRenew())}
	if err := writeJSON(h.dir, leaseFile, held); err != nil {
		h.log.Warn("record the lease for a crash release; a crash will wait for the lock to expire", "error", err)
	}
	return nil
}

func (h *recordHook) Release(context.Context, shim.ReleaseRequest, *shim.ReleaseResponse) {}

// Released drops the lease record once the supervisor has tried to release
// by itself (after a loss the lock may still be ours on the server): a
// second try by the plugin would only delay the task's exit by its budget.
// Unless the task's identity no longer authenticates (a purged job): the
// workload is proven dead, and the record tells the plugin to release with
// the operator's token (see releaseAfterCrash).
func (h *recordHook) Released(err error) {
	var held heldLease
	if errors.Is(err, lockclient.ErrIdentityRejected) && readJSON(h.dir, leaseFile, &held) == nil {
		held.IdentityRejected = true
		if werr := writeJSON(h.dir, leaseFile, held); werr == nil {
			return
		}
	}
	_ = h.dir.Remove(leaseFile)
}

// LBPosted records the registration before the ADD is sent.
func (h *recordHook) LBPosted(cfg lbhook.Config, hook *lbhook.Hook, self lbhook.UpstreamInfo) {
	reg := lbRegistration{Config: cfg, AllocID: h.run.Holder.AllocID, Fence: hook.Fence(), Upstream: self}
	if err := writeJSON(h.dir, lbFile, reg); err != nil {
		h.log.Warn("record the LB registration for a crash REMOVE", "error", err)
	}
}

// LBRemoved drops the registration once it is out of the load balancer.
func (h *recordHook) LBRemoved() { _ = h.dir.Remove(lbFile) }
