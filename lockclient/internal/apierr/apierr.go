// Package apierr reads Nomad API errors the way lockclient and its
// allocation reader both do: the HTTP status, the server's message, and the
// Task API's answer to an identity it cannot authenticate.
package apierr

import (
	"cmp"
	"errors"
	"strings"
)

// StatusCode is the HTTP status of a Nomad API error, or 0 for transport
// errors. It reads any error with an HTTP status, as
// api.UnexpectedResponseError (value or pointer) has, so a fake API can
// answer with one.
func StatusCode(err error) int {
	var sc interface {
		HasStatusCode() bool
		StatusCode() int
	}
	if errors.As(err, &sc) && sc.HasStatusCode() {
		return sc.StatusCode()
	}
	return 0
}

// Body is the server's message for an API error, for error text.
func Body(err error) string {
	var b interface{ Body() string }
	if errors.As(err, &b) {
		return strings.TrimSpace(b.Body())
	}
	return err.Error()
}

// IdentityRejected recognises the Task API's answer when it cannot
// authenticate the workload identity: 500 "Server error authenticating
// request". Its WhoAmI failed: the allocation is gone (a purged job), or
// the servers could not be asked. Only an answer that lasts tells the two
// apart.
func IdentityRejected(err error) bool {
	return err != nil && strings.Contains(Body(err), "error authenticating request")
}

// PolicyTarget is the namespace and job an ACL fix names: "default" and
// "<job>" where unknown.
func PolicyTarget(namespace, jobID string) (ns, job string) {
	return cmp.Or(namespace, "default"), cmp.Or(jobID, "<job>")
}
