package lbapi

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Faults describes the faults injected into HTTP answers: what the client's
// reading of outcomes (docs/lb-contract.md#client-reading-of-outcomes) must
// survive. The zero value injects nothing. Each request draws its fault
// from a generator with a fixed seed, so a given arrival order always sees
// the same faults.
type Faults struct {
	// Latency delays every matching request before anything else.
	Latency time.Duration
	// ErrorRate is the fraction of matching requests answered ErrorStatus.
	ErrorRate float64
	// ErrorStatus is the status of injected errors (default 503).
	ErrorStatus int
	// DropRate is the fraction of matching requests whose connection is
	// closed without an answer.
	DropRate float64
	// GarbageRate is the fraction of matching requests answered 200 with a
	// body that is not a valid answer (truncated, HTML, empty, wrong JSON).
	GarbageRate float64
	// AfterHandle applies error, drop and garbage faults after the request
	// took effect (the answer is lost, the state change is not), instead of
	// before it reaches the API.
	AfterHandle bool
}

// validate checks rates, latency and status.
func (f Faults) validate() error {
	var errs []error
	for name, rate := range map[string]float64{"error rate": f.ErrorRate, "drop rate": f.DropRate, "garbage rate": f.GarbageRate} {
		if rate < 0 || rate > 1 {
			errs = append(errs, fmt.Errorf("faults: %s %v is not within [0, 1]", name, rate))
		}
	}
	if f.Latency < 0 {
		errs = append(errs, fmt.Errorf("faults: latency %s is negative", f.Latency))
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		errs = append(errs, fmt.Errorf("faults: error status %d is not 4xx or 5xx", f.ErrorStatus))
	}
	return errors.Join(errs...)
}

// faultKind is what happens to one request.
type faultKind int

const (
	faultNone faultKind = iota
	faultError
	faultDrop
	faultGarbage
)

// garbageBodies are the bodies a garbage fault chooses from when it does
// not truncate a real answer.
var garbageBodies = []string{
	`{"loadBalancerRequestId":"x","loadBalancerState":"SUCC`,
	"<html><body><h1>502 Bad Gateway</h1></body></html>",
	"",
	`{"loadBalancerState":"MAYBE"}`,
	`[]`,
	"null",
}

// fault is the decision for one request.
type fault struct {
	latency time.Duration
	kind    faultKind
	after   bool
	status  int
	garbage int // index in garbageBodies, or -1 to truncate the real answer
}

// injector decides faults under its own lock.
type injector struct {
	mu  sync.Mutex
	cfg Faults
	rng *rand.Rand
}

func newInjector(seed uint64) *injector {
	return &injector{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (in *injector) set(cfg Faults) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.cfg = cfg
}

// decide draws the fault of one request: drop, then error, then garbage,
// each from its own rate.
func (in *injector) decide() fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	c := in.cfg
	f := fault{latency: c.Latency, after: c.AfterHandle, status: c.ErrorStatus}
	if f.status == 0 {
		f.status = http.StatusServiceUnavailable
	}
	switch {
	case in.roll(c.DropRate):
		f.kind = faultDrop
	case in.roll(c.ErrorRate):
		f.kind = faultError
	case in.roll(c.GarbageRate):
		f.kind = faultGarbage
		f.garbage = in.rng.IntN(len(garbageBodies)+1) - 1
	}
	return f
}

// roll draws true with probability rate (and draws nothing for 0).
func (in *injector) roll(rate float64) bool {
	return rate > 0 && in.rng.Float64() < rate
}

// serveWithFaults runs next under the fault drawn for r.
func (s *Server) serveWithFaults(w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	f := s.faults.decide()
	if f.latency > 0 {
		t := time.NewTimer(f.latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if f.kind == faultNone {
		next(w, r)
		return
	}
	var real []byte
	if f.after {
		buf := newBufferedResponse()
		next(buf, r)
		real = buf.body.Bytes()
	}
	s.log.Debug("injecting fault", "method", r.Method, "path", r.URL.Path, "kind", f.kind, "after_handle", f.after)
	switch f.kind {
	case faultError:
		writeJSON(w, f.status, dropwizardError{Code: f.status, Message: "injected fault"})
	case faultDrop:
		dropConnection(w)
	case faultGarbage:
		body := garbageBody(f.garbage, real)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	}
}

// garbageBody is the chosen garbage, or the first half of the real answer.
func garbageBody(i int, real []byte) []byte {
	if i < 0 {
		if len(real) < 2 {
			return []byte(garbageBodies[0])
		}
		return real[:len(real)/2]
	}
	return []byte(garbageBodies[i])
}

// dropConnection closes the client connection without an answer.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	// HTTP/2 or a wrapped writer: abort the handler; net/http resets the
	// stream or closes the connection without logging a stack trace.
	panic(http.ErrAbortHandler)
}

// bufferedResponse captures an answer that a fault will replace.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newBufferedResponse() *bufferedResponse {
	return &bufferedResponse{header: http.Header{}, status: http.StatusOK}
}

// Header returns the captured header.
func (b *bufferedResponse) Header() http.Header { return b.header }

// WriteHeader captures the status.
func (b *bufferedResponse) WriteHeader(status int) { b.status = status }

// Write captures the body.
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }
