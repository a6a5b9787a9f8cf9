package lockclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/hclsnippet"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/apierr"
)

var (
	// ErrIdentityRejected means the Task API could not authenticate the
	// workload identity: its allocation is gone from the servers (a
	// purged job), or, for a while, the servers could not be asked.
	ErrIdentityRejected = errors.New("the workload identity no longer authenticates")
	// ErrLost is wrapped by every error that ends a lease without a release:
	// renew answered 409 or 404, or the fence deadline passed.
	ErrLost = errors.New("lock lost")
	// ErrWaitTimeout means the lock was not acquired within the configured wait.
	ErrWaitTimeout = errors.New("timed out waiting for the lock")
	// ErrNotAcquired means a single try (early return) found the lock held.
	ErrNotAcquired = errors.New("lock is held by another holder")
	// ErrTooManyErrors means the acquire loop hit MaxRetry consecutive API errors.
	ErrTooManyErrors = errors.New("too many consecutive Nomad API errors")
	// ErrReleased is returned by Lease.Err after a clean release.
	ErrReleased = errors.New("lock released")
)

// ConfigError is an invalid setting found before any request is sent, or a
// 400 from Nomad. The message says which setting to change.
type ConfigError struct {
	Msg string
	Err error // a sentinel the message stands for, if any
}

func (e *ConfigError) Error() string { return e.Msg }
func (e *ConfigError) Unwrap() error { return e.Err }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// PermissionError is an HTTP 403 on a lock operation. Its message carries the
// ACL policy that fixes it.
type PermissionError struct {
	Op, Path, Namespace, JobID string
	Err                        error
}

func (e *PermissionError) Unwrap() error { return e.Err }

func (e *PermissionError) Error() string {
	ns, job := apierr.PolicyTarget(e.Namespace, e.JobID)
	return fmt.Sprintf(`%s %s: permission denied (HTTP 403).
The token needs the "write" capability on the variable path; the implicit workload-identity policy never grants it.
Save this as singleton-lock.policy.hcl:

namespace %q {
  variables {
    path %q {
      capabilities = ["write", "read"]
    }
  }
}

and attach it to the job's workload identity:

  nomad acl policy apply -namespace %s -job %s singleton-lock-%s singleton-lock.policy.hcl`,
		e.Op, e.Path, ns, e.Path, ns, job, job)
}

// lockPolicyHCL is the lock policy on one line (ACL policies are HCL 1,
// which allows nested blocks on one line), for a task event: namespace and
// path.
var lockPolicyHCL = hclsnippet.Policy(`namespace %q { variables { path %q { capabilities = ["write", "read"] } } }`,
	"default", "nomad/jobs/web/lock")

// Fix is the fix for e on one line, for a task event: the policy (with the
// path filled in) and the command that attaches it to the job.
func (e *PermissionError) Fix() string {
	ns, job := apierr.PolicyTarget(e.Namespace, e.JobID)
	return fmt.Sprintf(`the job's workload identity needs "write" on %s: apply `+
		lockPolicyHCL+` `+
		`(examples/acl/singleton-lock.policy.hcl) with `+
		"`nomad acl policy apply -namespace %s -job %s singleton-lock-%s singleton-lock.policy.hcl`",
		e.Path, ns, e.Path, ns, job, job)
}

// LostError says why a lease ended without a release. It wraps ErrLost.
type LostError struct {
	Reason string
	// Cause is the reason in a word (a metric's label); "" where none
	// applies (a lease that could not be adopted).
	Cause LostCause
}

func (e *LostError) Error() string { return "lock lost: " + e.Reason }
func (e *LostError) Unwrap() error { return ErrLost }

// validPath mirrors Nomad's variable path rule (nomad/structs/variables.go).
var validPath = regexp.MustCompile(`^[a-zA-Z0-9-_~/]{1,128}$`)

// ValidatePath checks a variable path before any request, with the fix in the message.
func ValidatePath(path string) error {
	if !validPath.MatchString(path) {
		return configErrorf("invalid lock path %q: use 1-128 characters from a-z A-Z 0-9 - _ ~ /", path)
	}
	if strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") || strings.Contains(path, "//") {
		return configErrorf("invalid lock path %q: no leading, trailing or double slashes", path)
	}
	parts := strings.Split(path, "/")
	if parts[0] == "nomad" && (len(parts) < 3 || parts[1] != "jobs") {
		return configErrorf("invalid lock path %q: paths under nomad/ must be below nomad/jobs/, "+
			"e.g. nomad/jobs/<job>/lock", path)
	}
	return nil
}

// statusCode, responseBody and identityRejected read an API error (see
// package apierr).
var (
	statusCode       = apierr.StatusCode
	responseBody     = apierr.Body
	identityRejected = apierr.IdentityRejected
)

// permanent reports whether retrying err cannot help: bad input or no permission.
func permanent(err error) bool {
	switch statusCode(err) {
	case http.StatusBadRequest, http.StatusForbidden, http.StatusUnauthorized:
		return true
	}
	var ce *ConfigError
	var pe *PermissionError
	return errors.As(err, &ce) || errors.As(err, &pe)
}

// classify turns a failed lock operation into the error value callers switch on.
func (c *Locker) classify(op string, err error) error {
	switch statusCode(err) {
	case http.StatusForbidden:
		return &PermissionError{Op: op, Path: c.policyPath(), Namespace: c.cfg.Namespace, JobID: c.cfg.Holder.JobID, Err: err}
	case http.StatusUnauthorized:
		return fmt.Errorf("%s %s: token rejected (HTTP 401): add `identity { env = true }` to the task: %w", op, c.cfg.Path, err)
	case http.StatusBadRequest:
		return configErrorf("%s %s: Nomad rejected the request: %s", op, c.cfg.Path, responseBody(err))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: no answer within %s from %s: %w", op, c.cfg.Path, c.cfg.RequestTimeout, c.cfg.Endpoint, err)
	}
	return fmt.Errorf("%s %s: %w", op, c.cfg.Path, err)
}
