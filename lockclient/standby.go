package lockclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/hclsnippet"
)

// A standby that waits for a lock records itself in a variable under the
// lock's path (StandbyPrefixFor), from when it finds the lock held until
// it acquires or stops waiting: so that `lock step-down` knows whether
// anyone waits, and which allocations `-to` may name, whatever runs the
// standby (lock, a driver task, a gate). It costs two Raft writes per
// wait (the record, then its delete), none while it waits. Its identity
// needs write and destroy on that prefix; without them it waits as
// before, unlisted, and says so once.

// StandbyPrefixFor is the prefix of the standby records of the lock at
// lockPath.
func StandbyPrefixFor(lockPath string) string { return lockPath + "/standby/" }

// Standby is a waiting standby's record.
type Standby struct {
	// Key is Holder.Key of the standby: the last segment of its record's path.
	Key                                         string
	AllocID, JobID, Group, Task, Node, Hostname string
	PID                                         int
	// Since is when it began to wait (its clock).
	Since time.Time
	// Path is the record's variable.
	Path string
}

// Items of a standby record; distinct from a holder record's, so that no
// listing of locks takes one for a lock.
const (
	sbAlloc    = "standby_alloc_id"
	sbJob      = "standby_job_id"
	sbGroup    = "standby_group"
	sbTask     = "standby_task"
	sbNode     = "standby_node"
	sbHostname = "standby_hostname"
	sbPID      = "standby_pid"
	sbSince    = "standby_since"
)

// AnnounceStandby records the Locker's holder as a standby of its lock and
// returns the record's path, for WithdrawStandby. A token that may not
// write it gets a *PermissionError; a lock path too long for a record
// under it a *ConfigError.
func (l *Locker) AnnounceStandby(ctx context.Context) (string, error) {
	h := l.cfg.Holder
	path := StandbyPrefixFor(l.cfg.Path) + h.Key()
	if err := ValidatePath(path); err != nil {
		return "", configErrorf("the lock path %s is too long for a standby record under it (%s): step-downs cannot name this standby; "+
			"use a lock path of at most %d characters", l.cfg.Path, path, 128-len(path)+len(l.cfg.Path))
	}
	items := map[string]string{sbSince: time.Now().UTC().Format(time.RFC3339Nano), sbPID: strconv.Itoa(h.PID)}
	for k, v := range map[string]string{sbAlloc: h.AllocID, sbJob: h.JobID, sbGroup: h.Group, sbTask: h.Task,
		sbNode: h.Node, sbHostname: h.Hostname} {
		if v != "" {
			items[k] = v
		}
	}
	if err := l.writeVar(ctx, path, items); err != nil {
		return "", l.standbyError("record standby", path, err)
	}
	return path, nil
}

// standbyDeleter deletes a variable: *api.Variables, and locktest's.
type standbyDeleter interface {
	Delete(path string, w *api.WriteOptions) (*api.WriteMeta, error)
}

// WithdrawStandby deletes the standby record at path (AnnounceStandby).
func (l *Locker) WithdrawStandby(ctx context.Context, path string) error {
	d, ok := l.vars.(standbyDeleter)
	if !ok {
		return errors.New("withdraw standby: this lock API cannot delete variables")
	}
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	if _, err := d.Delete(path, l.writeOptions(rctx)); err != nil && statusCode(err) != http.StatusNotFound {
		return l.standbyError("withdraw standby", path, err)
	}
	return nil
}

// standbyError names the policy for a refusal.
func (l *Locker) standbyError(op, path string, err error) error {
	if statusCode(err) == http.StatusForbidden {
		return &StandbyPermissionError{Op: op, LockPath: l.cfg.Path, Namespace: l.cfg.Namespace, Err: err}
	}
	return l.classify(op, err)
}

// StandbyPermissionError is a refusal of a standby's record: the
// identity may not write or delete it.
type StandbyPermissionError struct {
	Op, LockPath, Namespace string
	Err                     error
}

func (e *StandbyPermissionError) Unwrap() error { return e.Err }

// standbyPolicyHCL is the policy line of the standby records, for a
// message: namespace and lock path.
var standbyPolicyHCL = hclsnippet.Policy(`namespace %q { variables { path "%s/standby/*" { capabilities = ["write", "destroy"] } } }`,
	"default", "nomad/jobs/web/lock")

func (e *StandbyPermissionError) Error() string {
	return fmt.Sprintf("%s %s*: permission denied (HTTP 403): this standby waits unlisted, and lock step-down cannot name it; "+
		"add to the lock policy "+standbyPolicyHCL+" (examples/acl/singleton-lock.policy.hcl)",
		e.Op, StandbyPrefixFor(e.LockPath), nsOr(e.Namespace), e.LockPath)
}

// Standbys lists the standby records of the lock, oldest first. It needs
// list and read on the records; a record that cannot be read is left out.
func (l *Locker) Standbys(ctx context.Context) ([]Standby, error) {
	prefix := StandbyPrefixFor(l.cfg.Path)
	metas, err := l.prefixList(ctx, prefix)
	if err != nil {
		return nil, l.stepDownError(err, prefix+"*", "list")
	}
	var out []Standby
	for _, m := range metas {
		key := strings.TrimPrefix(m.Path, prefix)
		if key == "" || strings.Contains(key, "/") {
			continue
		}
		v, _, err := l.readPath(ctx, m.Path, 0)
		if err != nil {
			if permanent(l.classify("read", err)) {
				continue
			}
			return nil, l.classify("read standby", err)
		}
		if v != nil {
			out = append(out, standbyFromItems(key, m.Path, v.Items))
		}
	}
	slices.SortFunc(out, func(a, b Standby) int { return a.Since.Compare(b.Since) })
	return out, nil
}

func standbyFromItems(key, path string, items map[string]string) Standby {
	s := Standby{Key: key, Path: path, AllocID: items[sbAlloc], JobID: items[sbJob], Group: items[sbGroup],
		Task: items[sbTask], Node: items[sbNode], Hostname: items[sbHostname]}
	s.PID, _ = strconv.Atoi(items[sbPID])
	s.Since, _ = time.Parse(time.RFC3339Nano, items[sbSince])
	return s
}
