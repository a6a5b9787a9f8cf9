package lbapi

import (
	"encoding/json"
	"sort"
)

// RequestRecord is what the server holds about one stored request, active or
// in history: its state, the request body as stored, and when it was
// enqueued and finished. It is not part of Baragon's API; tests and tools
// read it through Server.Request and Server.Requests to check what a client
// sent and when Baragon would have reported it done.
type RequestRecord struct {
	// ID is the loadBalancerRequestId.
	ID string
	// ServiceID is the request's serviceId.
	ServiceID string
	// State is the public state (WAITING, SUCCESS, ...), as GET reports it.
	State string
	// Message is the response message ("" when null).
	Message string
	// AddUpstreams and RemoveUpstreams are the request's upstreams as
	// "host:port", in request order.
	AddUpstreams, RemoveUpstreams []string
	// Body is the stored BaragonRequest as JSON, exactly as GET returns it
	// under "request".
	Body json.RawMessage
	// Index is the queue index: requests are enqueued in Index order.
	Index int
	// Enqueued is the Options.Clock reading when the request was enqueued.
	Enqueued int64
	// Finished is the Options.Clock reading when it reached a final state
	// (SUCCESS, FAILED, CANCELED, INVALID_REQUEST_NOOP); 0 while active.
	// A GET sees the final state from that instant on.
	Finished int64
}

// Done reports whether the request reached a final state.
func (r RequestRecord) Done() bool { return r.Finished != 0 }

// Request returns the record of a stored request (active or in history).
// A request refused at POST (FAILED and not stored) has none.
func (s *Server) Request(id string) (RequestRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.st.active[id]; ok {
		return newRecord(a.queued.ServiceID, a.queued.Index, a.enqueued, 0, a.response()), true
	}
	if svc, ok := s.st.historyIndex[id]; ok {
		for _, h := range s.st.history[svc] {
			if h.id == id {
				return newRecord(svc, h.index, h.enqueued, h.finished, h.resp), true
			}
		}
	}
	return RequestRecord{}, false
}

// Requests returns the records of every stored request of a service, active
// or in history, in enqueue order.
func (s *Server) Requests(serviceID string) []RequestRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []RequestRecord
	for _, h := range s.st.history[serviceID] {
		out = append(out, newRecord(serviceID, h.index, h.enqueued, h.finished, h.resp))
	}
	for _, a := range s.st.active {
		if a.queued.ServiceID == serviceID {
			out = append(out, newRecord(serviceID, a.queued.Index, a.enqueued, 0, a.response()))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

func newRecord(serviceID string, index int, enqueued, finished int64, resp response) RequestRecord {
	r := RequestRecord{
		ID: resp.LoadBalancerRequestID, ServiceID: serviceID, State: resp.LoadBalancerState,
		Message: deref(resp.Message), Index: index, Enqueued: enqueued, Finished: finished,
	}
	if resp.Request != nil {
		for _, u := range resp.Request.Add {
			r.AddUpstreams = append(r.AddUpstreams, u.Upstream)
		}
		for _, u := range resp.Request.Remove {
			r.RemoveUpstreams = append(r.RemoveUpstreams, u.Upstream)
		}
		if body, err := json.Marshal(resp.Request); err == nil {
			r.Body = body
		}
	}
	return r
}
