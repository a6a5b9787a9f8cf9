package lbapi

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// This file is BaragonRequestWorker (docs/lb-contract.md#queueing,
// #validation-while-pending and #outcome) with simulated agents. One tick is
// one run of the worker; it holds Server.mu throughout, so DELETE and POST see
// a tick as atomic (Baragon's DELETE synchronizes for the same reason).

// transition is a request and the state a tick computed for it.
type transition struct {
	a    *activeRequest
	next internalState
}

// tick runs the worker once.
func (s *Server) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()

	queued := s.hydrate()
	var inFlight []*activeRequest
	inProgress := map[string]bool{}
	for _, a := range queued {
		if a.state.inFlight() || hasInProgressAttempt(a) {
			inFlight = append(inFlight, a)
			inProgress[a.queued.ServiceID] = true
		}
	}
	// A service with a request in flight starts nothing new.
	rest := slices.DeleteFunc(slices.Clone(queued), func(a *activeRequest) bool {
		return inProgress[a.queued.ServiceID]
	})
	s.applyResults(s.handleQueued(inFlight))

	added := len(inFlight)
	for added < maxRequestsPerPoll && len(rest) > 0 {
		nonServiceChanges, serviceChanges := s.collect(added, rest)

		var batch []*activeRequest
		for _, a := range nonServiceChanges {
			if !inProgress[a.queued.ServiceID] {
				setNoValidateIfRemovesOnly(a)
				batch = append(batch, a)
			}
		}
		sortQueued(batch)
		added += len(batch)
		s.applyResults(s.handleQueued(batch))
		rest = without(rest, nonServiceChanges)
		markInProgress(inProgress, batch)

		var changes []*activeRequest
		for _, a := range serviceChanges {
			if !inProgress[a.queued.ServiceID] {
				changes = append(changes, a)
			}
		}
		sortQueued(changes)
		added += len(changes)
		s.applyResults(s.handleQueued(changes))
		rest = without(rest, serviceChanges)
		markInProgress(inProgress, changes)
	}
}

// hydrate returns the active requests in queue order.
func (s *Server) hydrate() []*activeRequest {
	out := make([]*activeRequest, 0, len(s.st.queue))
	for _, q := range s.st.queue {
		if a, ok := s.st.active[q.RequestID]; ok {
			out = append(out, a)
		}
	}
	return out
}

// hasInProgressAttempt reports a retry in progress: SEND_APPLY_REQUESTS with agent answers is a retry in
// progress, so it still counts as in flight.
func hasInProgressAttempt(a *activeRequest) bool {
	return a.state == stateSendApplyRequests && len(a.agents) > 0
}

// collect is BaragonRequestWorker.collectRequests: requests that leave their
// service unchanged are gathered freely; the first one that changes a
// service is a batch boundary for that service.
func (s *Server) collect(added int, queued []*activeRequest) (nonServiceChanges, serviceChanges []*activeRequest) {
	boundary := map[string]bool{}
	for _, a := range queued {
		if added >= maxRequestsPerPoll {
			return
		}
		if boundary[a.queued.ServiceID] {
			continue
		}
		if !s.st.serviceUnchanged(a.req) {
			serviceChanges = append(serviceChanges, a)
			boundary[a.queued.ServiceID] = true
		} else {
			nonServiceChanges = append(nonServiceChanges, a)
		}
		added++
	}
	return
}

// setNoValidateIfRemovesOnly is the worker's adjustment of a request that
// only removes upstreams. It changes the stored body, so an identical
// re-POST while the request is active gets "already enqueued with different
// parameters" (docs/lb-contract.md#idempotent-post).
func setNoValidateIfRemovesOnly(a *activeRequest) {
	r := &a.req
	if !r.NoValidate && len(r.Remove) > 0 && len(r.Add) == 0 && len(r.Replace) == 0 {
		r.NoValidate = true
	}
}

// sortQueued is queuedRequestComparator: noValidate+noReload first, then
// noValidate or noReload, then queue order.
func sortQueued(list []*activeRequest) {
	rank := func(r request) int {
		switch {
		case r.NoValidate && r.NoReload:
			return 0
		case r.NoValidate || r.NoReload:
			return 1
		}
		return 2
	}
	sort.SliceStable(list, func(i, j int) bool {
		ri, rj := rank(list[i].req), rank(list[j].req)
		if ri != rj {
			return ri < rj
		}
		return list[i].queued.Index < list[j].queued.Index
	})
}

func without(list, remove []*activeRequest) []*activeRequest {
	return slices.DeleteFunc(list, func(a *activeRequest) bool { return slices.Contains(remove, a) })
}

func markInProgress(m map[string]bool, list []*activeRequest) {
	for _, a := range list {
		m[a.queued.ServiceID] = true
	}
}

// handleQueued is handleQueuedRequests: states that need agents are sent in
// one batch (up to maxBatchSize), the others go through handleState.
func (s *Server) handleQueued(list []*activeRequest) []transition {
	var out []transition
	sent := 0
	for _, a := range list {
		if !a.state.requireAgentRequest() {
			out = append(out, transition{a, s.handleState(a)})
			continue
		}
		if sent < maxBatchSize {
			out = append(out, transition{a, s.sendAgentRequests(a)})
			sent++
		}
	}
	return out
}

// applyResults is handleResultStates.
func (s *Server) applyResults(results []transition) {
	for _, t := range results {
		if t.next != t.a.state {
			s.log.Info("request state", "request_id", t.a.req.ID, "from", t.a.state.String(), "to", t.next.String())
			t.a.state = t.next
		}
		if t.a.state.removable() {
			s.st.finish(t.a)
			if s.agent != nil {
				s.agent.forget(t.a.req.ID)
			}
		}
	}
}

// handleState is BaragonRequestWorker.handleState for the states that need
// no agent request.
func (s *Server) handleState(a *activeRequest) internalState {
	switch a.state {
	case statePending:
		return s.handlePending(a)
	case stateCheckApplyResponses:
		return s.handleCheckApply(a)
	case stateFailedCheckRevertResponses, stateCancelledCheckRevertResponses:
		return s.handleCheckRevert(a)
	}
	return a.state
}

// handlePending validates a request
// (docs/lb-contract.md#validation-while-pending).
func (s *Server) handlePending(a *activeRequest) internalState {
	st, r := s.st, a.req
	if conflicts := st.basePathConflicts(r); len(conflicts) > 0 {
		a.setMessage("%s", basePathConflictMessage(conflicts))
		return stateInvalidNoop
	}
	if missing := st.missingGroups(r); len(missing) > 0 {
		a.setMessage("Invalid request due to non-existent load balancer groups: %s", javaStrings(missing))
		return stateInvalidNoop
	}
	for _, g := range r.Service.LoadBalancerGroups {
		if st.groups[g].agents == 0 {
			a.setMessage("Invalid request due to not enough agents present for group: %s", g)
			return stateFailedReverted
		}
	}
	if len(r.Service.Domains) > 0 {
		if notServed := st.domainsNotServed(*r.Service); len(notServed) > 0 {
			a.setMessage("No groups present that serve domains: %s", javaStrings(notServed))
			return stateInvalidNoop
		}
	}
	st.lockBasePaths(r)
	return stateSendApplyRequests
}

// handleCheckApply commits a request every agent applied, or starts the
// revert of one that failed.
func (s *Server) handleCheckApply(a *activeRequest) internalState {
	switch s.agentsStatus(a, typeApply) {
	case agentsFailure:
		a.setMessage("Apply failed (%s), reverting...", buildResponseString(a, typeApply))
		return stateFailedSendRevertRequests
	case agentsSuccess:
		a.setMessage("%s request succeeded! Added upstreams: %s, Removed upstreams: %s",
			actionUpdate, javaList(a.req.Add), javaList(a.req.Remove))
		s.st.commit(a.req)
		return stateCompleted
	}
	return stateCheckApplyResponses
}

// handleCheckRevert is handleCheckRevertResponse (failed apply or cancel).
func (s *Server) handleCheckRevert(a *activeRequest) internalState {
	typ := a.state.requestType()
	switch s.agentsStatus(a, typ) {
	case agentsFailure:
		a.setMessage("Apply failed {%s}, %s failed {%s}", buildResponseString(a, typeApply), typ, buildResponseString(a, typ))
		return failureStateFor[typ]
	case agentsSuccess:
		a.setMessage("Apply failed {%s}, %s OK.", buildResponseString(a, typeApply), typ)
		s.st.revertBasePath(a.req)
		return successStateFor[typ]
	}
	return waitingStateFor[typ]
}

// sendAgentRequests is AgentManager.sendRequests for one request: every
// agent of every group answers at once (200, or 500 for an APPLY in a group
// told to fail), and the request waits for the next tick to read them.
func (s *Server) sendAgentRequests(a *activeRequest) internalState {
	typ := a.state.requestType()
	if a.agents[typ] == nil {
		a.agents[typ] = map[string]agentResponse{}
	}
	backend := false
	for _, g := range a.req.Service.LoadBalancerGroups {
		gs, ok := s.st.groups[g]
		if !ok {
			continue
		}
		if s.agent != nil && s.agent.groups[g] {
			backend = true
			continue
		}
		for i := 1; i <= gs.agents; i++ {
			url := agentURL(g, i, a.req.ID)
			attempt := 0
			if prev, ok := a.agents[typ][url]; ok {
				attempt = prev.Attempt + 1
			}
			a.agents[typ][url] = simulatedAgentAnswer(url, attempt, typ == typeApply && gs.failApply)
		}
	}
	if backend {
		s.sendBackendRequest(a, typ)
	}
	return waitingStateFor[typ]
}

// sendBackendRequest hands an agent request to the Backend, which serves
// every backend group at once. Its answer arrives on the agent's goroutine
// and is recorded for the next tick to read; until then the request waits.
func (s *Server) sendBackendRequest(a *activeRequest, typ string) {
	url := backendURL(s.agent.b, a.req.ID)
	attempt := 0
	if prev, ok := a.agents[typ][url]; ok {
		attempt = prev.Attempt + 1
	}
	if a.pending == nil {
		a.pending = map[string]int{}
	}
	a.pending[typ] = attempt
	id := a.req.ID
	s.agent.apply(typ, a.req, func(status int, content string) {
		ans := agentResponse{URL: url, Attempt: attempt, StatusCode: &status}
		if content != "" {
			ans.Content = &content
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		cur, ok := s.st.active[id]
		if !ok {
			return
		}
		if p, waiting := cur.pending[typ]; !waiting || p != attempt {
			return
		}
		delete(cur.pending, typ)
		if cur.agents[typ] == nil {
			cur.agents[typ] = map[string]agentResponse{}
		}
		cur.agents[typ][url] = ans
	})
}

// simulatedAgentAnswer is one agent's answer: 200, or 500 when failing.
func simulatedAgentAnswer(url string, attempt int, fail bool) agentResponse {
	status := 200
	var content *string
	if fail {
		status = 500
		msg := "simulated agent failure"
		content = &msg
	}
	return agentResponse{URL: url, Attempt: attempt, StatusCode: &status, Content: content}
}

// agentsStatus is AgentManager.getRequestsStatus over the simulated agents:
// no answer at all counts as a failure (the group lost its agents).
func (s *Server) agentsStatus(a *activeRequest, typ string) agentStatus {
	if _, waiting := a.pending[typ]; waiting {
		return agentsWaiting
	}
	answers := a.agents[typ]
	if len(answers) == 0 {
		return agentsFailure
	}
	for _, r := range answers {
		if !r.success() {
			return agentsFailure
		}
	}
	return agentsSuccess
}

// buildResponseString is BaragonRequestWorker.buildResponseString.
func buildResponseString(a *activeRequest, typ string) string {
	answers := a.agents[typ]
	if len(answers) == 0 {
		return "No agent responses"
	}
	seen := map[string]bool{}
	var msgs []string
	for _, r := range answers {
		var m string
		if r.success() {
			m = r.URL + " - SUCCESS"
		} else {
			code := 0
			if r.StatusCode != nil {
				code = *r.StatusCode
			}
			m = fmt.Sprintf("(%d) - %s", code, firstNonNil(r.Content, r.Exception))
		}
		if !seen[m] {
			seen[m] = true
			msgs = append(msgs, m)
		}
	}
	sort.Strings(msgs)
	return strings.Join(msgs, ", ")
}
