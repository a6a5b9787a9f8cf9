// Package lbapi is a reference LB API server that keeps Baragon's contract
// as Singularity relies on it (docs/lb-contract.md), so that tests, demos and
// users without Baragon have a real peer.
//
// It implements the request resource (POST, GET, DELETE, the queue listing
// and the per-service history) and GET /state/{serviceId}, with Baragon's
// JSON (nulls included), status codes, auth filter, idempotent enqueue,
// asynchronous worker (global queue order, one in-flight batch per service),
// validation messages, commit semantics and response history. Load balancer
// agents are simulated per group: they apply instantly unless told to fail.
//
// A real load balancer can stand behind the API instead (Options.Backend):
// HAProxyBackend drives a running HAProxy through its Runtime API (package
// haproxy), as Baragon's agents drive nginx or HAProxy. Each request's
// upstream changes re-point server slots of the service's HAProxy backend
// (never adding or deleting a server, which HAProxy 2.6 cannot do safely
// under traffic); the request reaches SUCCESS only once HAProxy reports the
// change, and a change HAProxy refuses is reverted and ends FAILED with
// HAProxy's error in the message. GET /state reports what HAProxy actually
// serves, repairing it first where it lost changes (a restart puts every
// slot back in maintenance), and a reconcile loop does the same every
// Options.ReconcileInterval.
//
// Faults (latency, 5xx answers, dropped connections, garbage bodies) can be
// injected at run time; their sequence is reproducible from a seed.
//
// For tests, Server.Request and Server.Requests report each stored request
// (RequestRecord): its body as stored, its state, and when it was enqueued
// and reached a final state, read from Options.Clock.
//
// Server is an http.Handler, so tests can mount it on httptest.NewServer;
// Start listens on its own. cmd/lbapi runs it as a program.
//
// The package deliberately shares no code with the lbhook client: a server
// written independently from the contract is what catches a client that
// drifts from it.
package lbapi
