package allocs

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/apierr"
)

// restartAPI is the part of Nomad's Allocations API that restarts an
// allocation: *api.Allocations implements it.
type restartAPI interface {
	Restart(alloc *api.Allocation, taskName string, q *api.QueryOptions) error
	RestartAllTasks(alloc *api.Allocation, q *api.QueryOptions) error
}

// RestartAllocation asks Nomad to restart every task of the allocation,
// in their lifecycle order: a whole-allocation restart, in which Nomad
// kills each task (kill_signal, kill_timeout) and holds the main tasks
// back until the prestart tasks, a gate among them, run again
// (docs/gate.md). A user's restart does not count against the restart
// policy. With check it restarts nothing: it names a task the allocation
// does not have, so that Nomad checks the token's alloc-lifecycle
// capability and then answers that there is no such task. A refusal is a
// *lockclient.StepDownPermissionError for the lock at lockPath.
func (r *Reader) RestartAllocation(ctx context.Context, lockPath, allocID, namespace string, check bool) error {
	ra, ok := r.api.(restartAPI)
	if !ok {
		return fmt.Errorf("restart allocation %s: this reader cannot restart allocations", allocID)
	}
	q := (&api.QueryOptions{Namespace: namespace}).WithContext(ctx)
	alloc := &api.Allocation{ID: allocID, Namespace: namespace}
	var err error
	if check {
		err = ra.Restart(alloc, noSuchTask, q)
		if err != nil && strings.Contains(apierr.Body(err), noSuchTask) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("restart allocation %s: Nomad restarted a task named %q", allocID, noSuchTask)
		}
	} else {
		err = ra.RestartAllTasks(alloc, q)
	}
	if apierr.StatusCode(err) == http.StatusForbidden {
		return &lockclient.StepDownPermissionError{LockPath: lockPath, Path: "allocation " + allocID,
			Capability: "restart (alloc-lifecycle)", Namespace: namespace, Err: err}
	}
	if err != nil {
		return fmt.Errorf("restart allocation %s: %w", allocID, err)
	}
	return nil
}

// noSuchTask is a task name no allocation has: RestartAllocation's check.
const noSuchTask = "singleton-step-down-check-no-such-task"
