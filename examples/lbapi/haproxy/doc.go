// Package haproxy lets the reference LB API (package lbapi) drive a real
// HAProxy: it speaks HAProxy's Runtime API over the admin stats socket
// (Client: add, enable, drain and delete dynamic servers; read back
// `show servers state`), renders the small configuration the LB API needs
// (Config: one frontend, one backend per LB service, the admin socket), and
// runs HAProxy as a child process for tests and demos (Process).
//
// It targets HAProxy 2.6 (Debian bookworm's package), where `add server` and
// `del server` need no experimental mode. A backend must use a dynamic
// load-balancing algorithm (roundrobin here); a server added at run time
// starts in maintenance and needs `enable server` (in 2.6.12 the `enabled`
// keyword of `add server` reports the server up but leaves it out of the
// load-balancing tree, so every request gets a 503); and only a server in
// maintenance can be deleted.
//
// Dynamic servers live only in the running process: a restarted HAProxy has
// none, and the LB API puts them back (lbapi's reconcile).
package haproxy
