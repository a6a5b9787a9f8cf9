package lbhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
)

// DefaultGroup is the upstream group Baragon assumes when none is given.
const DefaultGroup = "default"

// BaragonRequest is one enqueued change to a service
// (docs/lb-contract.md#baragonrequest). It serializes the way Singularity's
// ObjectMapper does: absent optional values are omitted, lists are always
// present (nil becomes []), booleans are always present.
type BaragonRequest struct {
	LoadBalancerRequestID string         `json:"loadBalancerRequestId"`
	LoadBalancerService   BaragonService `json:"loadBalancerService"`
	AddUpstreams          []UpstreamInfo `json:"addUpstreams"`
	RemoveUpstreams       []UpstreamInfo `json:"removeUpstreams"`
	ReplaceUpstreams      []UpstreamInfo `json:"replaceUpstreams"`
	// ReplaceServiceID is deprecated in Baragon; nil means absent.
	ReplaceServiceID *string `json:"replaceServiceId,omitempty"`
	// Action is omitted when empty, which Baragon reads as UPDATE.
	Action               RequestAction `json:"action,omitempty"`
	NoValidate           bool          `json:"noValidate"`
	NoReload             bool          `json:"noReload"`
	UpstreamUpdateOnly   bool          `json:"upstreamUpdateOnly"`
	NoDuplicateUpstreams bool          `json:"noDuplicateUpstreams"`
	// PurgeCache exists only at Baragon HEAD, not in 0.9.0; nil means absent.
	PurgeCache *bool `json:"purgeCache,omitempty"`
}

// MarshalJSON writes r with every nil list as [] (Singularity never sends
// null lists; Baragon rejects null addUpstreams/removeUpstreams).
func (r BaragonRequest) MarshalJSON() ([]byte, error) {
	type plain BaragonRequest
	r.AddUpstreams = nonNil(r.AddUpstreams)
	r.RemoveUpstreams = nonNil(r.RemoveUpstreams)
	r.ReplaceUpstreams = nonNil(r.ReplaceUpstreams)
	return json.Marshal(plain(r))
}

// BaragonService describes the service a request changes
// (docs/lb-contract.md#baragonservice).
type BaragonService struct {
	ServiceID          string   `json:"serviceId"`
	Owners             []string `json:"owners"`
	ServiceBasePath    string   `json:"serviceBasePath"`
	AdditionalPaths    []string `json:"additionalPaths"`
	LoadBalancerGroups []string `json:"loadBalancerGroups"`
	// Options feeds the LB templates. nil is omitted; an empty map is sent as {}.
	Options map[string]any `json:"options,omitzero"`
	// TemplateName is omitted when empty.
	TemplateName string   `json:"templateName,omitempty"`
	Domains      []string `json:"domains"`
	// EdgeCacheDNS is deprecated (Baragon merges it into EdgeCacheDomains);
	// omitted when empty.
	EdgeCacheDNS          string   `json:"edgeCacheDNS,omitempty"`
	EdgeCacheDomains      []string `json:"edgeCacheDomains"`
	PreResolveUpstreamDNS bool     `json:"preResolveUpstreamDNS"`
}

// MarshalJSON writes s with every nil list as [].
func (s BaragonService) MarshalJSON() ([]byte, error) {
	type plain BaragonService
	s.Owners = nonNil(s.Owners)
	s.AdditionalPaths = nonNil(s.AdditionalPaths)
	s.LoadBalancerGroups = nonNil(s.LoadBalancerGroups)
	s.Domains = nonNil(s.Domains)
	s.EdgeCacheDomains = nonNil(s.EdgeCacheDomains)
	return json.Marshal(plain(s))
}

// UpstreamInfo is one backend of a service
// (docs/lb-contract.md#upstreaminfo).
// Its identity in Baragon is the pair (Upstream, Group).
type UpstreamInfo struct {
	// Upstream is "host:port".
	Upstream string `json:"upstream"`
	// RequestID is the id of the request that registered the upstream.
	// Baragon fills in the request's own id when it is empty.
	RequestID string `json:"requestId,omitempty"`
	// RackID is omitted when empty.
	RackID string `json:"rackId,omitempty"`
	// Group is omitted when empty, which Baragon reads as "default". (An
	// explicit "" would register the upstream under the group "".)
	Group string `json:"group,omitempty"`
	// ResolvedUpstream is filled in by Baragon when it pre-resolves DNS.
	ResolvedUpstream string `json:"resolvedUpstream,omitempty"`
}

// GroupOrDefault returns u.Group, or DefaultGroup when it is empty.
func (u UpstreamInfo) GroupOrDefault() string {
	if u.Group == "" {
		return DefaultGroup
	}
	return u.Group
}

// SameTarget reports whether u and o name the same backend in Baragon's
// sense (upstreamAndGroupMatches): same upstream, same group.
func (u UpstreamInfo) SameTarget(o UpstreamInfo) bool {
	return u.Upstream == o.Upstream && u.GroupOrDefault() == o.GroupOrDefault()
}

// String returns the upstream, as Baragon's UpstreamInfo.toString does.
func (u UpstreamInfo) String() string { return u.Upstream }

// UnmarshalJSON accepts the object form and, like Baragon, a bare string.
func (u *UpstreamInfo) UnmarshalJSON(data []byte) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '"' {
		var s string
		if err := json.Unmarshal(trimmed, &s); err != nil {
			return fmt.Errorf("upstream string: %w", err)
		}
		parsed, err := ParseUpstreamString(s)
		if err != nil {
			return err
		}
		*u = parsed
		return nil
	}
	type plain UpstreamInfo
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	*u = UpstreamInfo(p)
	return nil
}

// ParseUpstreamString parses the bare-string forms Baragon accepts for an
// UpstreamInfo (UpstreamInfo.fromString): a string with no "|" that contains
// a "." is the raw upstream; anything else is the ZooKeeper path form
// "base64url(upstream)|requestId|rackId|group|resolvedUpstream", where
// trailing parts may be missing and empty parts mean absent.
func ParseUpstreamString(s string) (UpstreamInfo, error) {
	parts := strings.Split(s, "|")
	if len(parts) == 1 && strings.Contains(parts[0], ".") {
		return UpstreamInfo{Upstream: s}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[0], "="))
	if err != nil {
		return UpstreamInfo{}, fmt.Errorf(
			"upstream %q is neither a host:port containing a dot nor base64url|requestId|rackId|group|resolved: %w",
			s, err)
	}
	u := UpstreamInfo{Upstream: strings.ToValidUTF8(string(raw), "\uFFFD")}
	fields := []*string{&u.RequestID, &u.RackID, &u.Group, &u.ResolvedUpstream}
	for i, dst := range fields {
		if len(parts) > i+1 {
			*dst = parts[i+1]
		}
	}
	return u, nil
}

// AgentResponse is one LB agent's answer to Baragon
// (docs/lb-contract.md#baragonresponse).
type AgentResponse struct {
	URL        string  `json:"url"`
	Attempt    int     `json:"attempt"`
	StatusCode *int    `json:"statusCode,omitempty"`
	Content    *string `json:"content,omitempty"`
	Exception  *string `json:"exception,omitempty"`
}

// BaragonResponse is Baragon's answer to POST, GET and DELETE on a request
// (docs/lb-contract.md#baragonresponse). Baragon writes absent values as null;
// they decode to the zero value here.
type BaragonResponse struct {
	LoadBalancerRequestID string       `json:"loadBalancerRequestId"`
	LoadBalancerState     RequestState `json:"loadBalancerState"`
	Message               string       `json:"message,omitempty"`
	// AgentResponses maps APPLY|REVERT|CANCEL|PURGE_CACHE to agent answers.
	AgentResponses map[string][]AgentResponse `json:"agentResponses,omitempty"`
	// Request is the stored request, as Baragon rewrote it.
	Request *BaragonRequest `json:"request,omitempty"`
}

// BaragonServiceState is the answer of GET /state/{serviceId}.
type BaragonServiceState struct {
	Service   BaragonService `json:"service"`
	Upstreams []UpstreamInfo `json:"upstreams"`
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
