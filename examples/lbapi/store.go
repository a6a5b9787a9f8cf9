package lbapi

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// This file is Baragon's RequestManager and its datastores, in memory. Every
// method expects Server.mu to be held.

// activeRequest is a request in the active area (BaragonRequestDatastore).
type activeRequest struct {
	queued  queuedRequestID
	req     request
	state   internalState
	message *string
	// agents holds the last answer of each agent, by request type then URL
	// (BaragonAgentResponseDatastore.getLastResponses).
	agents map[string]map[string]agentResponse
	// pending holds, by request type, the attempt number of a Backend
	// answer not yet in (it is not in agents until it arrives, as in Baragon).
	pending map[string]int
	// enqueued is the Options.Clock reading when the request was enqueued.
	enqueued int64
}

// storedService is a committed service and its upstreams (BaragonStateDatastore).
type storedService struct {
	svc       service
	upstreams []upstream
}

// historyEntry is one finished response (BaragonResponseHistoryDatastore).
type historyEntry struct {
	id   string
	resp response
	// index is the request's queue index; enqueued and finished are
	// Options.Clock readings (not part of Baragon: for RequestRecord).
	index              int
	enqueued, finished int64
}

// groupState is a configured load balancer group and its simulated agents.
type groupState struct {
	agents    int
	domains   []string
	failApply bool
}

// store is the whole of Baragon's state.
type store struct {
	active       map[string]*activeRequest
	queue        []queuedRequestID // global order, by index
	nextIndex    int
	history      map[string][]historyEntry // serviceId → oldest first
	historyIndex map[string]string         // requestId → serviceId (requestIdMapping)
	services     map[string]*storedService
	basePaths    map[string]map[string]string // group → path → serviceId
	groups       map[string]*groupState
	// clock stamps enqueue and finish times (Options.Clock).
	clock func() int64
}

func newStore(clock func() int64) *store {
	return &store{
		clock:        clock,
		active:       map[string]*activeRequest{},
		history:      map[string][]historyEntry{},
		historyIndex: map[string]string{},
		services:     map[string]*storedService{},
		basePaths:    map[string]map[string]string{},
		groups:       map[string]*groupState{},
	}
}

// response builds the response of an active request
// (RequestManager.getResponseFromActiveRequests): agentResponses is always
// an object there, possibly empty.
func (a *activeRequest) response() response {
	agents := map[string][]agentResponse{}
	for typ, byURL := range a.agents {
		urls := make([]string, 0, len(byURL))
		for u := range byURL {
			urls = append(urls, u)
		}
		sort.Strings(urls)
		for _, u := range urls {
			agents[typ] = append(agents[typ], byURL[u])
		}
	}
	req := a.req
	return response{
		LoadBalancerRequestID: a.req.ID,
		LoadBalancerState:     a.state.public(),
		Message:               a.message,
		AgentResponses:        agents,
		Request:               &req,
	}
}

func (a *activeRequest) setMessage(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	a.message = &msg
}

// getResponse is RequestManager.getResponse(requestId): active first, then
// history through the requestId → serviceId mapping.
func (st *store) getResponse(id string) (response, bool) {
	if a, ok := st.active[id]; ok {
		return a.response(), true
	}
	if svc, ok := st.historyIndex[id]; ok {
		return st.historyResponse(svc, id)
	}
	return response{}, false
}

// getResponseFor is RequestManager.getResponse(serviceId, requestId): active
// first, then the history of that service only.
func (st *store) getResponseFor(serviceID, id string) (response, bool) {
	if a, ok := st.active[id]; ok {
		return a.response(), true
	}
	return st.historyResponse(serviceID, id)
}

func (st *store) historyResponse(serviceID, id string) (response, bool) {
	for _, h := range st.history[serviceID] {
		if h.id == id {
			return h.resp, true
		}
	}
	return response{}, false
}

// enqueue is RequestManager.enqueueRequest
// (docs/lb-contract.md#idempotent-post).
// The returned response is FAILED (and nothing is stored) for the checks
// Baragon turns into exceptions.
func (st *store) enqueue(r request) response {
	svcID := r.Service.ServiceID
	if existing, ok := st.getResponseFor(svcID, r.ID); ok {
		if a, active := st.active[r.ID]; active && !a.req.equal(r) {
			return failureResponse(r.ID, fmt.Sprintf("Request %s is already enqueued with different parameters", r.ID))
		}
		return existing
	}
	if r.NoDuplicateUpstreams {
		if dups := st.duplicateUpstreams(r); len(dups) > 0 {
			return failureResponse(r.ID, "If noDuplicateUpstreams is specified, you cannot have duplicate upstreams. Found these duplicate upstreams: "+javaStrings(dups))
		}
	}
	if msg := r.unsupported(); msg != "" {
		return failureResponse(r.ID, msg)
	}
	q := queuedRequestID{ServiceID: svcID, RequestID: r.ID, Index: st.nextIndex}
	st.nextIndex++
	a := &activeRequest{queued: q, req: r, state: statePending, agents: map[string]map[string]agentResponse{}, enqueued: st.clock()}
	a.setMessage("Queued as %s", q)
	st.active[r.ID] = a
	st.queue = append(st.queue, q)
	return a.response()
}

// duplicateUpstreams is validateNoDuplicateUpstreams: the added upstream
// strings already registered under another service.
func (st *store) duplicateUpstreams(r request) []string {
	claimed := map[string]bool{}
	for id, s := range st.services {
		if id == r.Service.ServiceID {
			continue
		}
		for _, u := range s.upstreams {
			claimed[u.Upstream] = true
		}
	}
	var dups []string
	for _, u := range r.Add {
		if claimed[u.Upstream] {
			dups = append(dups, u.Upstream)
		}
	}
	return dups
}

// cancel is RequestResource.cancelRequest: a cancellable request (public
// state WAITING) moves to CANCELLED_SEND_REVERT_REQUESTS; the answer is the
// current response, or CANCELED "does not exist".
func (st *store) cancel(id string) response {
	if a, ok := st.active[id]; ok && a.state.cancelable() {
		a.state = stateCancelledSendRevertRequests
	}
	if resp, ok := st.getResponse(id); ok {
		return resp
	}
	return doesNotExistResponse(id)
}

// serviceState is GET /state/{serviceId}.
func (st *store) serviceState(id string) (serviceState, bool) {
	s, ok := st.services[id]
	if !ok {
		return serviceState{}, false
	}
	return serviceState{Service: s.svc, Upstreams: append([]upstream{}, s.upstreams...)}, true
}

// finish is handleResultStates for one request: a final state removes it
// from the queue and the active area and saves it to history.
func (st *store) finish(a *activeRequest) {
	st.queue = slices.DeleteFunc(st.queue, func(q queuedRequestID) bool { return q.RequestID == a.req.ID })
	st.saveHistory(a)
	delete(st.active, a.req.ID)
}

// saveHistory is saveResponseToHistory plus the per-service retention of
// RequestPurgingWorker (maxRequestsPerService), applied at once.
func (st *store) saveHistory(a *activeRequest) {
	svcID := a.req.Service.ServiceID
	resp := a.response()
	h := slices.DeleteFunc(st.history[svcID], func(e historyEntry) bool { return e.id == a.req.ID })
	h = append(h, historyEntry{id: a.req.ID, resp: resp, index: a.queued.Index, enqueued: a.enqueued, finished: st.clock()})
	for len(h) > historyPerService {
		if st.historyIndex[h[0].id] == svcID {
			delete(st.historyIndex, h[0].id)
		}
		h = h[1:]
	}
	st.history[svcID] = h
	st.historyIndex[a.req.ID] = svcID
}

// serviceUnchanged is BaragonStateDatastore.isServiceUnchanged.
func (st *store) serviceUnchanged(r request) bool {
	if r.UpstreamUpdateOnly {
		return true
	}
	cur, ok := st.services[r.Service.ServiceID]
	return ok && cur.svc.equal(*r.Service)
}

// basePathConflicts is RequestManager.getBasePathConflicts (groups have no
// default domain here): group → the other service owning one of our paths.
func (st *store) basePathConflicts(r request) map[string]string {
	conflicts := map[string]string{}
	for _, g := range r.Service.LoadBalancerGroups {
		for _, p := range r.Service.allPaths() {
			owner, ok := st.basePaths[g][p]
			if ok && owner != r.Service.ServiceID {
				conflicts[g] = owner
			}
		}
	}
	return conflicts
}

// basePathConflictMessage is BaragonRequestWorker.getBasePathConflictMessage.
func basePathConflictMessage(conflicts map[string]string) string {
	groups := make([]string, 0, len(conflicts))
	for g := range conflicts {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	msg := "Invalid request due to base path conflicts: ["
	for _, g := range groups {
		msg = fmt.Sprintf("%s %s on group %s,", msg, conflicts[g], g)
	}
	return msg[:len(msg)-1] + " ]"
}

// missingGroups is RequestManager.getMissingLoadBalancerGroups.
func (st *store) missingGroups(r request) []string {
	var missing []string
	for _, g := range r.Service.LoadBalancerGroups {
		if _, ok := st.groups[g]; !ok {
			missing = append(missing, g)
		}
	}
	return missing
}

// domainsNotServed is BaragonRequestWorker.getDomainsNotServed.
func (st *store) domainsNotServed(s service) []string {
	served := map[string]bool{}
	for _, g := range s.LoadBalancerGroups {
		if gs, ok := st.groups[g]; ok {
			for _, d := range gs.domains {
				served[d] = true
			}
		}
	}
	var out []string
	for _, d := range s.Domains {
		if !served[d] {
			out = append(out, d)
		}
	}
	return out
}

func (st *store) setBasePath(group, path, serviceID string) {
	if st.basePaths[group] == nil {
		st.basePaths[group] = map[string]string{}
	}
	st.basePaths[group][path] = serviceID
}

// clearBasePathIfOwner clears a path only when serviceID owns it.
func (st *store) clearBasePathIfOwner(group, path, serviceID string) {
	if st.basePaths[group][path] == serviceID {
		delete(st.basePaths[group], path)
	}
}

// lockBasePaths is RequestManager.lockBasePaths(request).
func (st *store) lockBasePaths(r request) {
	for _, g := range r.Service.LoadBalancerGroups {
		for _, p := range r.Service.allPaths() {
			st.setBasePath(g, p, r.Service.ServiceID)
		}
	}
}

// revertBasePath is RequestManager.revertBasePath without replaceServiceId.
// Baragon clears the request's paths unconditionally when the service was
// never committed; we clear only paths the service itself owns, so that
// cancelling a request that never got past PENDING cannot free another
// service's path.
func (st *store) revertBasePath(r request) {
	if _, committed := st.services[r.Service.ServiceID]; committed {
		return
	}
	for _, g := range r.Service.LoadBalancerGroups {
		for _, p := range r.Service.allPaths() {
			st.clearBasePathIfOwner(g, p, r.Service.ServiceID)
		}
	}
}

// commit is RequestManager.commitRequest for an UPDATE
// (docs/lb-contract.md#commit).
func (st *store) commit(r request) {
	var orig *service
	if s, ok := st.services[r.Service.ServiceID]; ok {
		c := s.svc
		orig = &c
	}
	st.updateService(r)
	st.clearChangedBasePaths(r, orig)
	st.clearBasePathsFromUnusedLbs(r, orig)
	st.clearBasePathsWithNoUpstreams(r)
}

// updateService is BaragonStateDatastore.updateService: store the service
// (unless unchanged), then remove and add upstreams. A
// removed upstream matches by (upstream, group), and a missing one is not an
// error; an added upstream replaces any with the same (upstream, group).
func (st *store) updateService(r request) {
	id := r.Service.ServiceID
	cur, ok := st.services[id]
	switch {
	case !ok:
		cur = &storedService{svc: *r.Service}
		st.services[id] = cur
	case !st.serviceUnchanged(r):
		cur.svc = *r.Service
	}
	for _, rm := range r.Remove {
		cur.upstreams = slices.DeleteFunc(cur.upstreams, rm.sameTarget)
	}
	for _, add := range r.Add {
		cur.upstreams = slices.DeleteFunc(cur.upstreams, add.sameTarget)
		cur.upstreams = append(cur.upstreams, add)
	}
	sortUpstreams(cur.upstreams)
}

func sortUpstreams(ups []upstream) {
	sort.SliceStable(ups, func(i, j int) bool {
		a, b := ups[i], ups[j]
		if a.Upstream != b.Upstream {
			return a.Upstream < b.Upstream
		}
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		return a.RequestID < b.RequestID
	})
}

// clearChangedBasePaths frees the original service's paths that the new
// definition dropped.
func (st *store) clearChangedBasePaths(r request, orig *service) {
	if orig == nil {
		return
	}
	newPaths := r.Service.allPaths()
	for _, g := range orig.LoadBalancerGroups {
		for _, p := range orig.allPaths() {
			if !slices.Contains(newPaths, p) {
				st.clearBasePathIfOwner(g, p, orig.ServiceID)
			}
		}
	}
}

// clearBasePathsFromUnusedLbs frees the original service's paths in groups
// the new definition left.
func (st *store) clearBasePathsFromUnusedLbs(r request, orig *service) {
	if orig == nil {
		return
	}
	for _, g := range orig.LoadBalancerGroups {
		if slices.Contains(r.Service.LoadBalancerGroups, g) {
			continue
		}
		for _, p := range orig.allPaths() {
			st.clearBasePathIfOwner(g, p, orig.ServiceID)
		}
	}
}

// clearBasePathsWithNoUpstreams frees the service's paths once it has no
// upstream left.
func (st *store) clearBasePathsWithNoUpstreams(r request) {
	if s, ok := st.services[r.Service.ServiceID]; ok && len(s.upstreams) > 0 {
		return
	}
	for _, g := range r.Service.LoadBalancerGroups {
		for _, p := range r.Service.allPaths() {
			st.clearBasePathIfOwner(g, p, r.Service.ServiceID)
		}
	}
}

// upstreamStrings lists a service's upstreams as "host:port" (group order).
func (st *store) upstreamStrings(serviceID string) []string {
	s, ok := st.services[serviceID]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(s.upstreams))
	for _, u := range s.upstreams {
		out = append(out, u.Upstream)
	}
	return out
}

// agentURL is the URL of simulated agent i of a group for request id,
// in BaragonConfiguration's "%s/request/%s" format.
func agentURL(group string, i int, id string) string {
	return fmt.Sprintf("http://%s-agent-%d:8882/baragon-agent/v2/request/%s", strings.ToLower(group), i, id)
}
