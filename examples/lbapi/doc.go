// Package lbapi is the reference LB API: a server that keeps Baragon's
// contract (docs/lb-contract.md) for everything our client (lbhook) sends
// and reads, so that the e2e tests and bench (over real HTTP), the lbhook
// unit tests, the demo and users without Baragon have a faithful peer. It
// shares no code with lbhook: a server written independently from the
// contract is what catches a client that drifts from it.
//
// It implements POST, GET and DELETE on the request collection and GET
// /state/{serviceId}, under the fixed base path /baragon/v2, with Baragon's
// JSON (nulls included), status codes, auth filter, field validation,
// idempotent enqueue, asynchronous worker (global queue order, one in-flight
// batch per service, at most 10 requests per run), validation messages,
// commit semantics, cancel, and per-service response history. Load balancer
// agents are simulated per group: they apply at once unless told to fail
// (Server.SetApplyFailure, Server.SetAgents).
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
// Faults (latency, 5xx answers, dropped connections, garbage bodies, each
// before or after the request takes effect) can be injected at run time
// (Server.SetFaults); their sequence is reproducible. For tests,
// Server.Request and Server.Requests report each stored request
// (RequestRecord): its body as stored, its state, and when it was enqueued
// and reached a final state, read from Options.Clock. Pause, Resume and
// Step (with Options.ManualWorker) hold or drive the worker.
//
// What it deliberately does not implement, because neither our client nor
// a test, the demo or the docs reach it:
//   - the actions DELETE, RELOAD, REVERT, GET_RENDERED_CONFIG and
//     PURGE_CACHE, replaceUpstreams and replaceServiceId: such a request is
//     refused before queueing (200 FAILED, not stored, the message naming
//     what is not implemented), where Baragon would carry it out or refuse
//     it with its own message;
//   - the bare-string forms of an UpstreamInfo (400, as JSON that does not
//     map onto a request);
//   - the queue listing (GET /request) and the per-service history
//     (GET /request/history/{serviceId});
//   - Baragon's configuration beyond the groups, auth keys and worker
//     period: the base path, batch sizes and the history kept (the newest
//     1000 per service) are fixed, and history is never purged by age;
//   - rendered configurations, templates, edge caches and DNS
//     pre-resolution: options, templateName, edgeCacheDomains and
//     resolvedUpstream are stored and echoed, never acted on.
//
// Server is an http.Handler, so tests can mount it on httptest.NewServer;
// Start listens on its own. cmd/lbapi runs it as a program.
package lbapi
