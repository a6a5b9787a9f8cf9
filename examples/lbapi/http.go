package lbapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
)

// maxBodyBytes bounds a POST body.
const maxBodyBytes = 10 << 20

// dropwizardError is the JSON Dropwizard writes for framework errors.
type dropwizardError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// validationErrors is Dropwizard's 422 body.
type validationErrors struct {
	Errors []string `json:"errors"`
}

// ServeHTTP routes a request (docs/lb-contract.md#endpoints), after any
// injected fault.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serveWithFaults(w, r, s.route)
}

// route dispatches under the base path the endpoints of
// docs/lb-contract.md#endpoints (Baragon's queue listing and history are
// not served):
//
//	POST   /request            enqueue             (auth)
//	GET    /request/{id}       response or 404     (@NoAuth)
//	DELETE /request/{id}       cancel              (auth)
//	GET    /state/{serviceId}  service state / 404 (@NoAuth)
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, BasePath+"/")
	if !ok {
		writeJSON(w, http.StatusNotFound, dropwizardError{http.StatusNotFound, "HTTP 404 Not Found"})
		return
	}
	seg := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	switch {
	case len(seg) == 1 && seg[0] == "request":
		s.methods(w, r, map[string]http.HandlerFunc{http.MethodPost: s.handleEnqueue})
	case len(seg) == 2 && seg[0] == "request" && seg[1] != "":
		id := seg[1]
		s.methods(w, r, map[string]http.HandlerFunc{
			http.MethodGet:    func(w http.ResponseWriter, r *http.Request) { s.handleGet(w, id) },
			http.MethodDelete: func(w http.ResponseWriter, r *http.Request) { s.handleCancel(w, r, id) },
		})
	case len(seg) == 2 && seg[0] == "state" && seg[1] != "":
		svc := seg[1]
		s.methods(w, r, map[string]http.HandlerFunc{
			http.MethodGet: func(w http.ResponseWriter, r *http.Request) { s.handleServiceState(w, r, svc) },
		})
	default:
		writeJSON(w, http.StatusNotFound, dropwizardError{http.StatusNotFound, "HTTP 404 Not Found"})
	}
}

func (s *Server) methods(w http.ResponseWriter, r *http.Request, handlers map[string]http.HandlerFunc) {
	h, ok := handlers[r.Method]
	if !ok {
		writeJSON(w, http.StatusMethodNotAllowed, dropwizardError{http.StatusMethodNotAllowed, "HTTP 405 Method Not Allowed"})
		return
	}
	h(w, r)
}

// handleEnqueue is POST /request: 415 for a non-JSON body (resource
// matching), 403 for a bad key (auth filter), 400 for JSON Jackson cannot
// map, 422 for bean-validation failures, else 200 with a BaragonResponse
// (docs/lb-contract.md#post-answers).
func (s *Server) handleEnqueue(w http.ResponseWriter, r *http.Request) {
	if !isJSON(r.Header.Get("Content-Type")) {
		writeJSON(w, http.StatusUnsupportedMediaType, dropwizardError{http.StatusUnsupportedMediaType, "HTTP 415 Unsupported Media Type"})
		return
	}
	if !s.authorized(r) {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil || len(body) > maxBodyBytes {
		writeJSON(w, http.StatusBadRequest, dropwizardError{http.StatusBadRequest, "Unable to process JSON"})
		return
	}
	req, err := decodeRequest(body)
	switch {
	case errors.Is(err, errNullBody):
		writeJSON(w, http.StatusUnprocessableEntity, validationErrors{[]string{"The request body may not be null"}})
		return
	case err != nil:
		s.log.Debug("unprocessable JSON", "error", err)
		writeJSON(w, http.StatusBadRequest, dropwizardError{http.StatusBadRequest, "Unable to process JSON"})
		return
	}
	if v := req.validate(); len(v) > 0 {
		writeJSON(w, http.StatusUnprocessableEntity, validationErrors{v})
		return
	}
	s.mu.Lock()
	resp := s.st.enqueue(req)
	s.mu.Unlock()
	s.log.Info("received request", "request_id", req.ID, "service_id", req.Service.ServiceID, "state", resp.LoadBalancerState)
	writeJSON(w, http.StatusOK, resp)
}

// handleGet is GET /request/{id}: 200, or 404 with an empty body (Guava
// Optional absent).
func (s *Server) handleGet(w http.ResponseWriter, id string) {
	s.mu.Lock()
	resp, ok := s.st.getResponse(id)
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// handleCancel is DELETE /request/{id}: always 200 once authorized.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, id string) {
	if !s.authorized(r) {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	s.mu.Lock()
	resp := s.st.cancel(id)
	s.mu.Unlock()
	s.log.Info("cancel", "request_id", id, "state", resp.LoadBalancerState)
	writeJSON(w, http.StatusOK, resp)
}

// handleServiceState is GET /state/{serviceId}: 200, or 404 with an empty
// body. For a service of a Backend's groups, the upstreams are those the
// backend actually serves, read (and, where they differ from the API's
// state, repaired) first; 503 if the backend cannot be read.
func (s *Server) handleServiceState(w http.ResponseWriter, r *http.Request, serviceID string) {
	s.mu.Lock()
	st, ok := s.st.serviceState(serviceID)
	backend := ok && s.agent != nil && s.agent.serves(st.Service.LoadBalancerGroups)
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if backend {
		ctx, cancel := context.WithTimeout(r.Context(), backendTimeout)
		defer cancel()
		serving, err := s.agent.observe(ctx, serviceID)
		if err != nil {
			s.log.Warn("GET /state: cannot read the load balancer", "service_id", serviceID, "error", err)
			writeJSON(w, http.StatusServiceUnavailable, dropwizardError{http.StatusServiceUnavailable, "load balancer unavailable: " + err.Error()})
			return
		}
		st.Upstreams = slices.DeleteFunc(st.Upstreams, func(u upstream) bool { return !slices.Contains(serving, targetOf(u)) })
	}
	writeJSON(w, http.StatusOK, st)
}

// isJSON accepts application/json with any parameters, as @Consumes does.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// writeJSON writes v without HTML escaping (Jackson does not escape).
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, `{"code":500,"message":"There was an error processing your request."}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(bytes.TrimRight(buf.Bytes(), "\n"))
}
