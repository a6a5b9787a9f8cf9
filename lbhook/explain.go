package lbhook

import (
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Diagnosis is what an operator needs to read about a failed LB request:
// what happened, in the LB's own words where it gave any, and what to fix,
// naming the field of the load_balancer block.
type Diagnosis struct {
	// Cause is the state and the LB's message, or the HTTP or transport
	// failure of a call that got no usable answer. Never the auth key.
	Cause string
	// Fix names what to change or check.
	Fix string
	// Unreachable is set when the LB API gave no usable answer at all
	// (transport error, timeout, 5xx, unreadable answer).
	Unreachable bool
}

// String is "<cause>; <fix>".
func (d Diagnosis) String() string {
	if d.Fix == "" {
		return d.Cause
	}
	return d.Cause + "; " + d.Fix
}

// Diagnose explains an error of Run, Hook.Add, Hook.ReAdd or Hook.Remove
// (or a *CallError) for a client with this configuration.
func Diagnose(err error, cfg Config) Diagnosis {
	uri := redactedURI(cfg.URI)
	var oe *OutcomeError
	var ce *CallError
	switch {
	case errors.As(err, &oe):
		return diagnoseOutcome(oe)
	case errors.As(err, &ce):
		return diagnoseCall(ce, uri)
	case errors.Is(err, ErrNotFinal):
		return Diagnosis{Cause: err.Error(),
			Fix: "the LB API at " + uri + " did not finish the request nor its cancel in time: check the LB's worker and logs"}
	}
	return Diagnosis{Cause: err.Error(), Fix: "check the load_balancer block"}
}

// diagnoseOutcome explains a final state other than SUCCESS from Baragon's
// messages (docs/lb-contract.md#validation-while-pending).
func diagnoseOutcome(oe *OutcomeError) Diagnosis {
	d := Diagnosis{Cause: oe.Error()}
	msg := oe.Message
	switch {
	case strings.Contains(msg, "non-existent load balancer groups"):
		d.Fix = "check load_balancer.groups: the LB has no such group"
	case strings.Contains(msg, "base path conflicts"):
		d.Fix = "check load_balancer.base_path and additional_paths: another service owns that path in the group"
	case strings.Contains(msg, "not enough agents present"):
		d.Fix = "the LB group in load_balancer.groups has too few LB agents: start them, or name another group"
	case strings.Contains(msg, "serve domains"):
		d.Fix = "check load_balancer.domains: no group in load_balancer.groups serves them"
	case strings.Contains(msg, "duplicate upstreams"):
		d.Fix = "another LB service already has this host:port: check load_balancer.service_id, or remove the stale upstream from the other service"
	case strings.Contains(msg, alreadyEnqueued):
		d.Fix = "another request with this id is still running on the LB: wait for it, or check that no second task uses this allocation's ids"
	case oe.State == StateCanceled && oe.Deadline > 0:
		d.Fix = "the LB did not finish within " + oe.Deadline.String() + ": it is slow or stuck; check its worker, or raise load_balancer." + deadlineField(oe)
	case strings.Contains(msg, "status code 401"), strings.Contains(msg, "status code 403"):
		d.Fix = "the LB refused the auth key: check load_balancer.authkey_file (or " + DefaultAuthKeyEnv + ")"
	case strings.Contains(msg, "status code 404"), strings.Contains(msg, "status code 405"):
		d.Fix = "check load_balancer.uri: it must be the LB API's request collection, e.g. http://baragon:8080/baragon/v2/request"
	case strings.Contains(msg, "status code 400"), strings.Contains(msg, "status code 422"):
		d.Fix = "the LB rejected the request: check load_balancer.service_id, base_path, groups, owners and options"
	case strings.Contains(msg, "Apply failed"):
		d.Fix = "the LB's agents could not apply the change (see the message) and reverted it: check the LB agents of load_balancer.groups"
	default:
		d.Fix = "see the LB's message, and check the load_balancer block"
	}
	return d
}

// deadlineField names the deadline a cancelled request of ours ran into.
func deadlineField(oe *OutcomeError) string {
	if strings.Contains(oe.RequestID, "-"+string(KindRemove)+"-") {
		return "remove_deadline"
	}
	return "add_deadline"
}

// diagnoseCall explains an HTTP call that failed.
func diagnoseCall(ce *CallError, uri string) Diagnosis {
	d := Diagnosis{Unreachable: ce.State == StateUnknown}
	switch {
	case ce.StatusCode == 0 && ce.Err != nil:
		d.Cause = "no answer from " + uri + ": " + rootCause(ce.Err)
	case ce.StatusCode != 0:
		d.Cause = ce.Method + " " + uri + " answered HTTP " + strconv.Itoa(ce.StatusCode)
		if ce.Body != "" {
			d.Cause += ": " + ce.Body
		}
		if ce.Err != nil {
			d.Cause += " (" + rootCause(ce.Err) + ")"
		}
	default:
		d.Cause = ce.Error()
	}
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	var dnsErr *net.DNSError
	switch {
	case errors.As(ce.Err, &ue), errors.As(ce.Err, &he), strings.Contains(errText(ce.Err), "x509:"), strings.Contains(errText(ce.Err), "tls:"):
		d.Fix = "the LB's TLS certificate is not trusted: check load_balancer.ca_file and the host in load_balancer.uri"
	case errors.As(ce.Err, &dnsErr):
		d.Fix = "check the host in load_balancer.uri: it does not resolve"
	case ce.StatusCode == 401 || ce.StatusCode == 403:
		d.Fix = "the LB refused the auth key: check load_balancer.authkey_file (or " + DefaultAuthKeyEnv + ")"
	case ce.StatusCode == 404 || ce.StatusCode == 405:
		d.Fix = "check load_balancer.uri: it must be the LB API's request collection, e.g. http://baragon:8080/baragon/v2/request"
	case ce.StatusCode == 400 || ce.StatusCode == 422:
		d.Fix = "the LB rejected the request: check load_balancer.service_id, base_path, groups, owners and options"
	case ce.StatusCode >= 200 && ce.StatusCode <= 299:
		d.Fix = "the answer is not a Baragon response: check that load_balancer.uri is the LB API's request collection"
	case ce.StatusCode >= 500:
		d.Fix = "the LB API at " + uri + " is failing: check its logs"
	default:
		d.Fix = "check load_balancer.uri, and that the LB API at " + uri + " is up"
	}
	return d
}

// rootCause is the innermost useful text of a transport error, without the
// URL that url.Error repeats: "dial tcp 127.0.0.1:8080: connect: connection
// refused", or "timeout after 2s".
func rootCause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return "no answer within load_balancer.request_timeout (" + ue.Err.Error() + ")"
		}
		err = ue.Err
	}
	return clipLB(err.Error())
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// redactedURI is the configured request collection without userinfo.
func redactedURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	return u.Redacted()
}
