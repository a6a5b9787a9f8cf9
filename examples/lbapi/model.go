package lbapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf16"
)

// defaultGroup is UpstreamInfo.DEFAULT_GROUP.
const defaultGroup = "default"

// actionUpdate is the one request action this server carries out (the
// default when absent); the others are refused (request.unsupported).
const actionUpdate = "UPDATE"

// validActions are Baragon's request actions (docs/lb-contract.md#baragonrequest):
// any other value is JSON that does not map onto a request.
var validActions = map[string]bool{
	actionUpdate: true, "DELETE": true, "RELOAD": true, "REVERT": true, "GET_RENDERED_CONFIG": true, "PURGE_CACHE": true,
}

// Bean-validation patterns of Baragon's models. Java's \s is
// [ \t\n\x0B\f\r] (Go's \s lacks \x0B), and @Pattern must match the whole
// value.
var (
	idPattern       = regexp.MustCompile(`^[^ \t\n\x0B\f\r/|]+$`)
	upstreamIDRegex = regexp.MustCompile(`^(?:|[^ \t\n\x0B\f\r/|]+)$`)
	rackGroupRegex  = regexp.MustCompile(`^(?:|[^ \t\n\x0B\f\r|]+)$`)
)

const (
	msgNotNull    = "may not be null"
	msgBadID      = "cannot contain whitespace, '/', or '|'"
	msgGroupsSize = "size must be between 1 and 2147483647"
)

// upstream is Baragon's UpstreamInfo. Absent optional strings are "".
type upstream struct {
	Upstream         string
	RequestID        string
	RackID           string
	Group            string // "default" when absent
	ResolvedUpstream string
}

// upstreamIn is an UpstreamInfo on input. Only the object form is accepted:
// Baragon's bare-string forms are not implemented.
type upstreamIn struct {
	Upstream         *string `json:"upstream"`
	RequestID        *string `json:"requestId"`
	RackID           *string `json:"rackId"`
	Group            *string `json:"group"`
	ResolvedUpstream *string `json:"resolvedUpstream"`
}

// UnmarshalJSON reads the object form. A null element is refused (Baragon
// fails on it).
func (u *upstream) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return errors.New("null upstream")
	}
	var in upstreamIn
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	*u = upstream{
		Upstream:         deref(in.Upstream),
		RequestID:        deref(in.RequestID),
		RackID:           deref(in.RackID),
		Group:            orString(in.Group, defaultGroup),
		ResolvedUpstream: deref(in.ResolvedUpstream),
	}
	return nil
}

// MarshalJSON writes the upstream as Baragon does: absent optionals as null.
func (u upstream) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Upstream         string  `json:"upstream"`
		ResolvedUpstream *string `json:"resolvedUpstream"`
		RequestID        *string `json:"requestId"`
		RackID           *string `json:"rackId"`
		Group            string  `json:"group"`
	}{u.Upstream, nullIfEmpty(u.ResolvedUpstream), nullIfEmpty(u.RequestID), nullIfEmpty(u.RackID), u.Group})
}

// String is UpstreamInfo.toString: the upstream alone.
func (u upstream) String() string { return u.Upstream }

// sameTarget is UpstreamInfo.upstreamAndGroupMatches.
func (u upstream) sameTarget(o upstream) bool {
	return u.Upstream == o.Upstream && u.Group == o.Group
}

// service is Baragon's BaragonService. Sets are kept sorted.
type service struct {
	ServiceID             string
	Owners                []string
	ServiceBasePath       string
	AdditionalPaths       []string
	LoadBalancerGroups    []string
	Options               map[string]any
	TemplateName          *string
	Domains               []string
	EdgeCacheDNS          *string
	EdgeCacheDomains      []string
	PreResolveUpstreamDNS bool
	// idNull and basePathNull record required fields that were null, for
	// validation; a stored service never has them set.
	idNull, basePathNull bool
}

// serviceIn is a BaragonService on input; pointers tell null from absent.
type serviceIn struct {
	ServiceID             *string        `json:"serviceId"`
	Owners                *[]string      `json:"owners"`
	ServiceBasePath       *string        `json:"serviceBasePath"`
	AdditionalPaths       []string       `json:"additionalPaths"`
	LoadBalancerGroups    *[]string      `json:"loadBalancerGroups"`
	Options               map[string]any `json:"options"`
	TemplateName          *string        `json:"templateName"`
	Domains               []string       `json:"domains"`
	EdgeCacheDNS          *string        `json:"edgeCacheDNS"`
	EdgeCacheDomains      []string       `json:"edgeCacheDomains"`
	PreResolveUpstreamDNS *bool          `json:"preResolveUpstreamDNS"`
}

// serviceOut is the JSON shape of a service (nulls included).
type serviceOut struct {
	ServiceID             *string        `json:"serviceId"`
	Owners                []string       `json:"owners"`
	ServiceBasePath       *string        `json:"serviceBasePath"`
	AdditionalPaths       []string       `json:"additionalPaths"`
	LoadBalancerGroups    []string       `json:"loadBalancerGroups"`
	Options               map[string]any `json:"options"`
	TemplateName          *string        `json:"templateName"`
	Domains               []string       `json:"domains"`
	EdgeCacheDNS          *string        `json:"edgeCacheDNS"`
	EdgeCacheDomains      []string       `json:"edgeCacheDomains"`
	PreResolveUpstreamDNS bool           `json:"preResolveUpstreamDNS"`
}

// MarshalJSON writes the service with nulls, as Dropwizard does.
func (s service) MarshalJSON() ([]byte, error) {
	return json.Marshal(serviceOut{
		ServiceID: &s.ServiceID, Owners: s.Owners, ServiceBasePath: &s.ServiceBasePath,
		AdditionalPaths: s.AdditionalPaths, LoadBalancerGroups: s.LoadBalancerGroups,
		Options: s.Options, TemplateName: s.TemplateName, Domains: s.Domains,
		EdgeCacheDNS: s.EdgeCacheDNS, EdgeCacheDomains: s.EdgeCacheDomains,
		PreResolveUpstreamDNS: s.PreResolveUpstreamDNS,
	})
}

// equal is BaragonService.equals.
func (s service) equal(o service) bool { return reflect.DeepEqual(s, o) }

// allPaths is BaragonService.getAllPaths without a default domain: every
// path, prefixed by each domain when the service has domains.
func (s service) allPaths() []string {
	var out []string
	for _, p := range append(slices.Clone(s.AdditionalPaths), s.ServiceBasePath) {
		if len(s.Domains) == 0 {
			out = append(out, p)
			continue
		}
		for _, d := range s.Domains {
			out = append(out, d+p)
		}
	}
	return out
}

// request is Baragon's BaragonRequest after deserialization (defaults
// applied, upstream request ids filled in). Replace, ReplaceServiceID and an
// action other than UPDATE are kept only to be echoed and refused
// (unsupported).
type request struct {
	ID                   string
	Service              *service
	Add                  []upstream // nil when null (refused by validation)
	Remove               []upstream // nil when null (refused by validation)
	Replace              []upstream
	ReplaceServiceID     *string
	Action               *string // nil when absent (means UPDATE)
	NoValidate           bool
	NoReload             bool
	UpstreamUpdateOnly   bool
	NoDuplicateUpstreams bool
	PurgeCache           bool
	idNull               bool // loadBalancerRequestId was null or absent
}

// requestIn is a BaragonRequest on input; pointers tell null from absent.
type requestIn struct {
	LoadBalancerRequestID *string     `json:"loadBalancerRequestId"`
	LoadBalancerService   *serviceIn  `json:"loadBalancerService"`
	AddUpstreams          *[]upstream `json:"addUpstreams"`
	RemoveUpstreams       *[]upstream `json:"removeUpstreams"`
	ReplaceUpstreams      *[]upstream `json:"replaceUpstreams"`
	ReplaceServiceID      *string     `json:"replaceServiceId"`
	Action                *string     `json:"action"`
	NoValidate            *bool       `json:"noValidate"`
	NoReload              *bool       `json:"noReload"`
	UpstreamUpdateOnly    *bool       `json:"upstreamUpdateOnly"`
	NoDuplicateUpstreams  *bool       `json:"noDuplicateUpstreams"`
	PurgeCache            *bool       `json:"purgeCache"`
}

// requestOut is the JSON shape of a request (nulls included).
type requestOut struct {
	LoadBalancerRequestID string     `json:"loadBalancerRequestId"`
	LoadBalancerService   *service   `json:"loadBalancerService"`
	AddUpstreams          []upstream `json:"addUpstreams"`
	RemoveUpstreams       []upstream `json:"removeUpstreams"`
	ReplaceUpstreams      []upstream `json:"replaceUpstreams"`
	ReplaceServiceID      *string    `json:"replaceServiceId"`
	Action                *string    `json:"action"`
	NoValidate            bool       `json:"noValidate"`
	NoReload              bool       `json:"noReload"`
	UpstreamUpdateOnly    bool       `json:"upstreamUpdateOnly"`
	NoDuplicateUpstreams  bool       `json:"noDuplicateUpstreams"`
	PurgeCache            bool       `json:"purgeCache"`
}

// MarshalJSON writes the request with nulls, as Dropwizard does.
func (r request) MarshalJSON() ([]byte, error) {
	return json.Marshal(requestOut{
		LoadBalancerRequestID: r.ID, LoadBalancerService: r.Service,
		AddUpstreams: r.Add, RemoveUpstreams: r.Remove, ReplaceUpstreams: r.Replace,
		ReplaceServiceID: r.ReplaceServiceID, Action: r.Action,
		NoValidate: r.NoValidate, NoReload: r.NoReload, UpstreamUpdateOnly: r.UpstreamUpdateOnly,
		NoDuplicateUpstreams: r.NoDuplicateUpstreams, PurgeCache: r.PurgeCache,
	})
}

// unsupported names what the request asks for that this server does not
// implement ("" if nothing): an action other than UPDATE, replaceUpstreams
// or replaceServiceId. Such a request is refused before queueing, as
// Baragon refuses a REVERT (docs/lb-contract.md#idempotent-post).
func (r request) unsupported() string {
	const suffix = " is not implemented by this reference LB API (examples/lbapi): it carries out UPDATE requests that add and remove upstreams"
	switch {
	case r.Action != nil && *r.Action != actionUpdate:
		return "action " + *r.Action + suffix
	case len(r.Replace) > 0:
		return "replaceUpstreams" + suffix
	case r.ReplaceServiceID != nil:
		return "replaceServiceId" + suffix
	}
	return ""
}

// equal is BaragonRequest.equals.
func (r request) equal(o request) bool { return reflect.DeepEqual(r, o) }

// errBadJSON is a body Jackson could not map (Dropwizard answers 400).
var errBadJSON = errors.New("unable to process JSON")

// errNullBody is an empty or null body for a @Valid parameter (422).
var errNullBody = errors.New("the request body may not be null")

// decodeRequest parses a POST body like Jackson with BaragonRequest's
// @JsonCreator: unknown properties ignored, numbers kept verbatim (for
// equals), upstream request ids defaulted to the request id.
func decodeRequest(body []byte) (request, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return request{}, errNullBody
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var in *requestIn
	if err := dec.Decode(&in); err != nil {
		return request{}, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	if in == nil {
		return request{}, errNullBody
	}
	if in.Action != nil && !validActions[*in.Action] {
		return request{}, fmt.Errorf("%w: unknown action %q", errBadJSON, *in.Action)
	}
	r := request{
		ID:                   deref(in.LoadBalancerRequestID),
		idNull:               in.LoadBalancerRequestID == nil,
		Service:              buildService(in.LoadBalancerService),
		Replace:              []upstream{},
		ReplaceServiceID:     in.ReplaceServiceID,
		Action:               in.Action,
		NoValidate:           derefBool(in.NoValidate),
		NoReload:             derefBool(in.NoReload),
		UpstreamUpdateOnly:   derefBool(in.UpstreamUpdateOnly),
		NoDuplicateUpstreams: derefBool(in.NoDuplicateUpstreams),
		PurgeCache:           derefBool(in.PurgeCache),
	}
	if in.AddUpstreams != nil {
		r.Add = withRequestID(*in.AddUpstreams, r)
	}
	if in.RemoveUpstreams != nil {
		r.Remove = withRequestID(*in.RemoveUpstreams, r)
	}
	if in.ReplaceUpstreams != nil {
		r.Replace = nonNil(*in.ReplaceUpstreams)
	}
	return r, nil
}

// withRequestID is BaragonRequest.addRequestId: an upstream without a
// request id gets the request's, keeping only upstream, rack and group.
func withRequestID(ups []upstream, r request) []upstream {
	out := make([]upstream, 0, len(ups))
	for _, u := range ups {
		if u.RequestID == "" && !r.idNull {
			u = upstream{Upstream: u.Upstream, RequestID: r.ID, RackID: u.RackID, Group: u.Group}
		}
		out = append(out, u)
	}
	return out
}

// buildService is BaragonService's @JsonCreator: defaults applied, sets
// sorted, edgeCacheDNS merged into edgeCacheDomains.
func buildService(in *serviceIn) *service {
	if in == nil {
		return nil
	}
	s := &service{
		ServiceID:             deref(in.ServiceID),
		ServiceBasePath:       deref(in.ServiceBasePath),
		AdditionalPaths:       nonNil(in.AdditionalPaths),
		Options:               in.Options,
		TemplateName:          in.TemplateName,
		Domains:               sortedSet(in.Domains),
		EdgeCacheDNS:          in.EdgeCacheDNS,
		PreResolveUpstreamDNS: derefBool(in.PreResolveUpstreamDNS),
	}
	if in.Owners != nil {
		s.Owners = nonNil(*in.Owners)
	}
	if in.LoadBalancerGroups != nil {
		s.LoadBalancerGroups = sortedSet(*in.LoadBalancerGroups)
	}
	edge := slices.Clone(in.EdgeCacheDomains)
	if in.EdgeCacheDNS != nil {
		edge = append(edge, *in.EdgeCacheDNS)
	}
	s.EdgeCacheDomains = sortedSet(edge)
	s.idNull = in.ServiceID == nil
	s.basePathNull = in.ServiceBasePath == nil
	return s
}

// validate is the bean validation Dropwizard runs on @Valid BaragonRequest.
// It returns Dropwizard's messages ("<path> <message>"), sorted.
func (r request) validate() []string {
	var v violations
	if r.idNull {
		v.add("loadBalancerRequestId", msgNotNull)
	} else if !idPattern.MatchString(r.ID) {
		v.add("loadBalancerRequestId", msgBadID)
	}
	if r.Service == nil {
		v.add("loadBalancerService", msgNotNull)
	} else {
		r.Service.validate(&v)
	}
	if r.Add == nil {
		v.add("addUpstreams", msgNotNull)
	}
	if r.Remove == nil {
		v.add("removeUpstreams", msgNotNull)
	}
	validateUpstreams(&v, "addUpstreams", r.Add)
	validateUpstreams(&v, "removeUpstreams", r.Remove)
	validateUpstreams(&v, "replaceUpstreams", r.Replace)
	sort.Strings(v)
	return v
}

func (s *service) validate(v *violations) {
	switch {
	case s.idNull:
		v.add("loadBalancerService.serviceId", msgNotNull)
	case !idPattern.MatchString(s.ServiceID):
		v.add("loadBalancerService.serviceId", msgBadID)
	}
	if s.Owners == nil {
		v.add("loadBalancerService.owners", msgNotNull)
	}
	if s.basePathNull {
		v.add("loadBalancerService.serviceBasePath", msgNotNull)
	}
	switch {
	case s.LoadBalancerGroups == nil:
		v.add("loadBalancerService.loadBalancerGroups", msgNotNull)
	case len(s.LoadBalancerGroups) == 0:
		v.add("loadBalancerService.loadBalancerGroups", msgGroupsSize)
	}
}

func validateUpstreams(v *violations, field string, ups []upstream) {
	for i, u := range ups {
		path := fmt.Sprintf("%s[%d].", field, i)
		checkField(v, path+"requestId", u.RequestID, 250, upstreamIDRegex)
		checkField(v, path+"rackId", u.RackID, 100, rackGroupRegex)
		checkField(v, path+"group", u.Group, 100, rackGroupRegex)
	}
}

func checkField(v *violations, path, value string, maxLen int, re *regexp.Regexp) {
	if javaLen(value) > maxLen {
		v.add(path, fmt.Sprintf("size must be between 0 and %d", maxLen))
	}
	if !re.MatchString(value) {
		v.add(path, msgBadID)
	}
}

// violations collects Dropwizard constraint messages.
type violations []string

func (v *violations) add(path, msg string) { *v = append(*v, path+" "+msg) }

// javaLen is String.length(): UTF-16 code units.
func javaLen(s string) int { return len(utf16.Encode([]rune(s))) }

// agentResponse is Baragon's AgentResponse.
type agentResponse struct {
	URL        string  `json:"url"`
	Attempt    int     `json:"attempt"`
	StatusCode *int    `json:"statusCode"`
	Content    *string `json:"content"`
	Exception  *string `json:"exception"`
}

// success reports a 2xx agent answer (toRequestStatus SUCCESS).
func (a agentResponse) success() bool {
	return a.StatusCode != nil && *a.StatusCode >= 200 && *a.StatusCode < 300
}

// response is Baragon's BaragonResponse.
type response struct {
	LoadBalancerRequestID string                     `json:"loadBalancerRequestId"`
	LoadBalancerState     string                     `json:"loadBalancerState"`
	Message               *string                    `json:"message"`
	AgentResponses        map[string][]agentResponse `json:"agentResponses"`
	Request               *request                   `json:"request"`
}

// failureResponse is BaragonResponse.failure.
func failureResponse(id, message string) response {
	return response{LoadBalancerRequestID: id, LoadBalancerState: stateFailed, Message: &message}
}

// doesNotExistResponse is BaragonResponse.requestDoesNotExist.
func doesNotExistResponse(id string) response {
	msg := fmt.Sprintf("Request %s does not exist", id)
	return response{LoadBalancerRequestID: id, LoadBalancerState: stateCanceled, Message: &msg}
}

// queuedRequestID is Baragon's QueuedRequestId.
type queuedRequestID struct {
	ServiceID string `json:"serviceId"`
	RequestID string `json:"requestId"`
	Index     int    `json:"index"`
}

// String is Guava's toStringHelper output used in "Queued as ...".
func (q queuedRequestID) String() string {
	return fmt.Sprintf("QueuedRequestId{serviceId=%s, requestId=%s, index=%d}", q.ServiceID, q.RequestID, q.Index)
}

// serviceState is Baragon's BaragonServiceState.
type serviceState struct {
	Service   service    `json:"service"`
	Upstreams []upstream `json:"upstreams"`
}

// javaList formats like java.util.List.toString: "[a, b]".
func javaList[T fmt.Stringer](items []T) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = it.String()
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// javaStrings formats strings like List.toString.
func javaStrings(items []string) string { return "[" + strings.Join(items, ", ") + "]" }

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func orString(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// firstNonNil is Optional.or(Optional).or("").
func firstNonNil(a, b *string) string {
	if a != nil {
		return *a
	}
	return deref(b)
}

func derefBool(p *bool) bool { return p != nil && *p }

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func sortedSet(in []string) []string {
	out := slices.Clone(nonNil(in))
	sort.Strings(out)
	return slices.Compact(out)
}
