package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// serveHTTP listens on cfg.HTTPAddr and serves, for the run whose metrics
// m counts: /metrics, the run's metrics in Prometheus's text format, and
// /holder, 200 with a small JSON body while this process holds the lock
// and 503 otherwise, for a Nomad check, HAProxy or Consul. The labels name
// the task as its environment does (lock runs inside it); no lock ID or
// token is ever shown.
func serveHTTP(cfg shim.Config, holder lockclient.Holder, m *shim.Metrics, log hclog.Logger) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("-http-addr %s: %w; give a free host:port (a Nomad port: ${NOMAD_ADDR_<label>})", cfg.HTTPAddr, err)
	}
	labels := lockmetrics.Labels{Namespace: cfg.Namespace, Job: holder.JobID, Group: holder.Group, Task: holder.Task,
		AllocID: holder.AllocID, Path: cfg.Path}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		snap := m.Snapshot()
		w.Header().Set("Content-Type", lockmetrics.TextContentType)
		fams := lockmetrics.Gather([]lockmetrics.Task{{Labels: labels, Snap: &snap}}, time.Now())
		if err := lockmetrics.WriteText(w, fams); err != nil {
			log.Debug("write /metrics", "error", err)
		}
	})
	mux.HandleFunc("GET /holder", func(w http.ResponseWriter, r *http.Request) {
		snap := m.Snapshot()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !snap.Held {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(holderBody(cfg.Path, labels, snap))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the -http-addr server stopped", "error", err)
		}
	}()
	log.Info("serving /metrics and /holder", "address", ln.Addr().String())
	return nil
}

// holderState is /holder's body (docs/operations.md).
type holderState struct {
	Held      bool       `json:"held"`
	Path      string     `json:"path"`
	Namespace string     `json:"namespace,omitempty"`
	AllocID   string     `json:"alloc_id,omitempty"`
	Slot      *int       `json:"slot,omitempty"`
	Fence     uint64     `json:"fence,omitempty"`
	HeldSince *time.Time `json:"held_since,omitempty"`
	LastRenew *time.Time `json:"last_renew,omitempty"`
	// WaitingSince: while this process waits for the lock.
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
}

func holderBody(path string, l lockmetrics.Labels, s lockmetrics.Snapshot) holderState {
	b := holderState{Held: s.Held, Path: path, Namespace: l.Namespace, AllocID: l.AllocID}
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	if s.Held {
		b.Fence, b.HeldSince, b.LastRenew = s.Fence, at(s.HeldSince), at(s.LastRenew)
		if n, err := strconv.Atoi(s.Slot); err == nil {
			b.Slot = &n
		}
	}
	b.WaitingSince = at(s.WaitingSince)
	return b
}
