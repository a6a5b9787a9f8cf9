// Package haproxy lets the reference LB API (package lbapi) drive a real
// HAProxy: it speaks HAProxy's Runtime API over the admin stats socket
// (Client: point a server slot at an address, make it ready or put it in
// maintenance, read `show servers state` and the slots' loads from
// `show stat`), renders the small configuration the LB API needs (Config:
// one frontend, one backend per LB service with a fixed pool of server
// slots, the admin socket, defaults for a singleton), and runs HAProxy as a
// child process for tests and demos (Process).
//
// It targets HAProxy 2.6 (Debian bookworm's package). Servers are never
// added or deleted at run time: 2.6.12 can crash (a segfault) when
// `del server` removes a dynamic server that a stream still refers to, say
// one being retried or redispatched during a failover under traffic. A
// backend instead declares its slots with `server-template … disabled`;
// an upstream is a slot re-pointed with `set server … addr` and made ready
// with `set server … state ready`, and taken out with `state maint`. A slot
// keeps the configuration's maintenance bit (AdminConfigMaint) once ready,
// and serves: ServerState.Ready allows for it.
//
// Runtime changes live only in the running process: a restarted HAProxy
// has every slot back in maintenance, and the LB API puts the upstreams back
// (lbapi's reconcile).
package haproxy
