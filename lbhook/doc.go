// Package lbhook is a client for a Baragon-style load-balancer API: it
// registers and deregisters one upstream the way Singularity does, and nothing
// else.
//
// The wire contract is the one in docs/lb-contract.md (Baragon's
// API as Singularity drives it):
//
//   - POST {uri} enqueues a BaragonRequest; GET {uri}/{id} polls it until its
//     state is final (SUCCESS, FAILED, CANCELED, INVALID_REQUEST_NOOP);
//     DELETE {uri}/{id} cancels it; GET {state uri}/{serviceId} reads the
//     service's upstreams, where the state URI is {uri} with every "request"
//     replaced by "state" (Singularity's String.replace, quirk included).
//   - Transport errors, timeouts, 5xx answers and unparseable 2xx bodies count
//     as UNKNOWN, and an UNKNOWN request is re-POSTed with the same id. That is
//     safe because Baragon's POST is idempotent by id: it returns the stored
//     response and never re-executes a finished id.
//   - The auth key travels in the "authkey" query parameter of POST, GET and
//     DELETE. It is read from a file or an environment variable, never from
//     argv, and it never appears in an error or a log line.
//
// Client.Run drives one request to a final state, cancelling it when its
// deadline passes. Hook adds the requests of one allocation on top:
// "<allocID>-ADD-<fence>" adds our upstream and removes the previous holder's
// in one request, "<allocID>-REMOVE-<fence>" removes ours.
package lbhook
