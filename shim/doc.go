// Package shim is the supervisor: it takes the lease, runs the workload in its
// own process group, forwards signals, stops the workload the moment the lease
// is lost, releases on the way out, and maps every ending to an exit code. The
// `lock` binary and the singleton driver both run it.
//
// It reads no command line and no file: each front end (the lock CLI in
// shim/cmd/lock, the driver's task config) builds a Config from the settings
// declared here (LockSettings; LBSpec and HealthSpec, whose settings,
// LBSettings and HealthSettings, give the driver's schema and the CLI's
// flags), and Config.Validate judges it before anything starts. Every task
// event's text is worded in events.go.
package shim

// Version is set at build time with -ldflags "-X .../shim.Version=...".
var Version = "0.1.0-dev"
