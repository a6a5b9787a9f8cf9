// Package allocs reads allocations, and a job's allocations, through the
// same endpoint and token as a lock: what a task needs to know of its own
// allocation (is it being stopped?), of a previous holder's (are its tasks
// dead?) and of its job's (is a newer version on its way?). The workload
// identity reads them only with the "read-job" capability in the
// namespace, which the implicit policy does not grant: a 403 says which
// policy fixes it.
package allocs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/apierr"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/testkey"
)

// Config is what a Reader needs.
type Config struct {
	Endpoint lockclient.Endpoint
	// Timing is the lock's: its RequestTimeout bounds a read, its
	// BlockingWait a blocking one (defaults filled in; a zero TTL is
	// lockclient.MinTTL).
	Timing lockclient.Timing
	// Holder names the task whose identity reads (its job, group and
	// task), for the ACL fix of a PermissionError.
	Holder lockclient.Holder
}

// ConfigOf is the Config that reads as l's lock does: its endpoint, its
// timing and its holder.
func ConfigOf(l *lockclient.Locker) Config {
	c := l.Config()
	return Config{Endpoint: c.Endpoint, Timing: c.Timing, Holder: c.Holder}
}

// Reader reads allocations.
type Reader struct {
	cfg  Config
	api  allocAPI
	jobs jobAllocsAPI
}

// allocAPI and jobAllocsAPI are the parts of Nomad's Allocations and Jobs
// APIs a Reader needs: *api.Allocations and *api.Jobs implement them, and
// so does lockclient/locktest's Server, whose allocations the test writes.
type allocAPI interface {
	Info(allocID string, q *api.QueryOptions) (*api.Allocation, *api.QueryMeta, error)
}

type jobAllocsAPI interface {
	Allocations(jobID string, allAllocs bool, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error)
}

// New builds a Reader over cfg's endpoint. No request is sent.
func New(cfg Config) (*Reader, error) {
	client, err := cfg.Endpoint.Client("")
	if err != nil {
		return nil, err
	}
	return &Reader{cfg: cfg.withDefaults(), api: client.Allocations(), jobs: client.Jobs()}, nil
}

// NewWithAPI builds a Reader whose reads go to a instead of Nomad: the seam
// of lockclient/locktest, whose key only packages under lockclient/ get.
func NewWithAPI(key testkey.Key, cfg Config, a interface {
	allocAPI
	jobAllocsAPI
}) (*Reader, error) {
	if !key.Valid() || a == nil {
		return nil, errors.New("allocs.NewWithAPI: for lockclient/locktest only")
	}
	return &Reader{cfg: cfg.withDefaults(), api: a, jobs: a}, nil
}

// withDefaults fills in the timing's defaults.
func (c Config) withDefaults() Config {
	if c.Timing.TTL == 0 {
		c.Timing.TTL = lockclient.MinTTL
	}
	c.Timing = c.Timing.WithDefaults()
	return c
}

// Config is the Reader's configuration.
func (r *Reader) Config() Config { return r.cfg }

// query is the options and the deadline of one read at index.
func (r *Reader) query(ctx context.Context, namespace string, index uint64) (*api.QueryOptions, context.CancelFunc) {
	t := r.cfg.Timing
	timeout := t.RequestTimeout
	q := &api.QueryOptions{Namespace: namespace}
	if index > 0 {
		q.WaitIndex = index
		q.WaitTime = t.BlockingWait
		// Nomad adds up to wait/16 of jitter to a blocking query.
		timeout += t.BlockingWait + t.BlockingWait/16
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	return q.WithContext(rctx), cancel
}

// Allocation reads one allocation: its job, desired status and the state
// of each of its tasks. With index > 0 it is a blocking query that returns
// once the allocation changes past index, or after BlockingWait.
func (r *Reader) Allocation(ctx context.Context, id, namespace string, index uint64) (*api.Allocation, uint64, error) {
	q, cancel := r.query(ctx, namespace, index)
	defer cancel()
	alloc, meta, err := r.api.Info(id, q)
	if err != nil {
		switch apierr.StatusCode(err) {
		case http.StatusForbidden:
			return nil, 0, r.PermissionError(id, namespace, err)
		case http.StatusNotFound:
			return nil, 0, fmt.Errorf("read allocation %s: %w", id, ErrGone)
		}
		if body := apierr.Body(err); strings.Contains(body, "Unknown allocation") {
			// Nomad's answer for an allocation that exists but that the
			// token may not read (no read-job); one that is gone gets a
			// 404. A task reads its own allocation, and knows which it
			// can be.
			return nil, 0, fmt.Errorf("read allocation %s: %w (%w)", id, ErrGone, ErrHidden)
		}
		if body := apierr.Body(err); strings.Contains(body, "allocation does not exist") {
			// The identity's own allocation is gone (a purged job), so
			// the token no longer authenticates.
			return nil, 0, fmt.Errorf("read allocation %s: %w", id, ErrGone)
		}
		if apierr.IdentityRejected(err) {
			// The Task API's answer when the identity does not
			// authenticate: its allocation is gone (a purged job), or the
			// servers could not be asked.
			return nil, 0, fmt.Errorf("read allocation %s: %w (%v)", id, lockclient.ErrIdentityRejected, err)
		}
		return nil, 0, fmt.Errorf("read allocation %s: %w", id, err)
	}
	var last uint64
	if meta != nil {
		last = meta.LastIndex
	}
	return alloc, last, nil
}

// JobAllocations lists the allocations of job jobID in namespace. With
// index > 0 it is a blocking query that returns once they change past
// index, or after BlockingWait. A 403 wraps ErrHidden.
func (r *Reader) JobAllocations(ctx context.Context, jobID, namespace string, index uint64) ([]*api.AllocationListStub, uint64, error) {
	q, cancel := r.query(ctx, namespace, index)
	defer cancel()
	stubs, meta, err := r.jobs.Allocations(jobID, false, q)
	if err != nil {
		if apierr.StatusCode(err) == http.StatusForbidden {
			return nil, 0, fmt.Errorf("read allocations of job %s: %w (%v)", jobID, ErrHidden, err)
		}
		return nil, 0, fmt.Errorf("read allocations of job %s: %w", jobID, err)
	}
	var last uint64
	if meta != nil {
		last = meta.LastIndex
	}
	return stubs, last, nil
}

// ErrGone means the servers do not know the allocation: it is gone (a
// purged job, garbage collection), or the token may not read it (Nomad
// answers "Unknown allocation" without read-job).
var ErrGone = errors.New("allocation not found")

// ErrHidden means that Nomad answered "Unknown allocation": the allocation
// exists but the token may not read it (no read-job in its namespace).
// Such errors wrap ErrGone too, for callers whose token can read its own
// allocation unless that is gone.
var ErrHidden = errors.New("the token may not read the allocation (read-job)")

// PermissionError is a 403 on reading the task's own allocation. Its
// message carries the ACL policy line that fixes it, and how to apply it
// to that task alone.
type PermissionError struct {
	AllocID, Namespace, JobID, Group, Task string
	// Who says what reads the allocation and why ("" says the task does).
	Who string
	Err error
}

func (e *PermissionError) Unwrap() error { return e.Err }

func (e *PermissionError) Error() string {
	ns, job := apierr.PolicyTarget(e.Namespace, e.JobID)
	group, task := cmp.Or(e.Group, "<group>"), cmp.Or(e.Task, "<task>")
	who := cmp.Or(e.Who, "The task reads allocations")
	return fmt.Sprintf(`read allocation %s: permission denied (HTTP 403, or "Unknown allocation" for an allocation that runs).
%s with its workload identity,
which needs the "read-job" capability in namespace %q; the implicit workload-identity policy does not grant it.
Add to the task's policy (beside the lock path's "write"; examples/acl/singleton-gate.policy.hcl):

namespace %q {
  capabilities = ["read-job"]
}

and apply it to that task alone (a policy on the whole job reaches its other tasks' identities too):

  nomad acl policy apply -namespace %s -job %s -group %s -task %s singleton-gate-%s singleton-gate.policy.hcl`,
		e.AllocID, who, ns, ns, ns, job, group, task, job)
}

// PermissionError is the error for a read of allocation id that the
// reader's identity may not make.
func (r *Reader) PermissionError(id, namespace string, err error) *PermissionError {
	h := r.cfg.Holder
	return &PermissionError{AllocID: id, Namespace: namespace, JobID: h.JobID, Group: h.Group, Task: h.Task, Err: err}
}
