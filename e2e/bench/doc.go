// Package bench is `make bench`: side-by-side benchmarks of the `lock`
// binary and the `singleton` task driver against `nomad var lock`, on a real
// Nomad agent built from the pinned module.
//
// The scenarios (TestBench in bench_test.go) run each variant
//
//	(a) `nomad var lock` under raw_exec (the anchor every ratio refers to),
//	(b) `lock` under raw_exec (or plain `lock` processes / lockclient
//	    goroutines where the scenario says so),
//	(c) the `singleton` driver,
//	(d) in the handover and crash scenarios only: a `singleton` gate
//	    (config { gate = true }) holding the lock for a docker task of its
//	    group, on the harness's private dockerd (harness.StartDocker; the
//	    package's TestMain stops it),
//
// and, in the semaphore scenario, (b) and (c) beside the same supervisors
// holding one slot of a semaphore of 2 (`lock -n 2`, lock { holders = 2 }):
// a slot's handover and crash takeover against the single lock's, in the
// same run; in the handover scenario, (b), (c) and (d) also hand over by a
// switchover (`lock step-down`), beside their graceful handover;
//
// several times, and this package turns what they measured into a report: a
// table of median, min and max with the ratio to the anchor and the goals met
// or not (printed to stdout), docs/benchmarks.md with the machine and the
// exact command, and two pictures drawn with gonum.org/v1/plot: a timeline
// of who held the lock and whose workload ran across a handover and a crash,
// and a bar chart of the ratios.
//
// Why a test binary: the e2e harness (e2e/harness) is built on testing.TB:
// t.Cleanup orders the teardown of agents, jobs and processes, t.TempDir
// holds records, and t.Fatalf ends a broken run without leaking processes.
// Reusing it means running as a test. `make bench` compiles the test binary
// (go test -c) and runs it without -test.v, so stdout shows progress lines and
// the table and nothing else; harness logs appear only for a failed run.
// TestBench skips unless BENCH=1, so `go test ./...` in e2e/ (make test,
// make e2e) compiles it but does not run it; CI (.ci/run) then runs the
// short smoke mode, `make bench QUICK=1`. gonum.org/v1/plot is a requirement of the e2e
// module (e2e/go.mod) alone: the product does not link it.
//
// Configuration comes from the environment, which the GNUmakefile fills in
// from its variables (see Config and FromEnv):
//
//	make bench                          # RUNS=5 SCALE=100,500,1000, ~20 min on 2 cores
//	make bench RUNS=7 SCALE=100,500     # more runs, fewer scale points
//	make bench HOLD=30s                 # a longer scale window
//	make bench SCENARIOS=leasecost LEASE_COST=10,50,100 MERGE=1 # lease mode's server cost, 3 servers
//	make bench QUICK=1                  # smoke: one run each, N=10, short windows, < 2 min
//	make bench SCENARIOS=handover,crash # a subset (the doc then says so)
//	make bench SCENARIOS=haproxy MERGE=1 # re-measure one section of docs/benchmarks.md in place
//	make bench SCENARIOS=semaphore MERGE=1 # the semaphore's section (added if missing)
//	make bench SCENARIOS=update MERGE=1 # rolling updates: (a), (c) with update_grace = 0s, (c)
//	make bench SCENARIOS=nodedeath RUNS=3 MERGE=1 # the holder's node dies: (a), (c), (c) in lease mode (both profiles)
//	make bench SCENARIOS=metrics MERGE=1 # what the plugin's metrics_addr costs: (c) without and with it, in the same run
//
// Less common knobs are plain environment variables: BENCH_SCALE_PROCS_MAX
// (largest N run as `lock` processes, default 100), BENCH_SCALE_ANCHOR_MAX
// (largest N run as `nomad var lock` processes, default 100),
// BENCH_FOOTPRINT_HOLD and BENCH_OUT (see Config).
//
// Where it is fair, the variants of a scenario run concurrently (crash
// takeover, footprint, LB: they wait on timers, or measure memory); where
// sub-second timing matters they run one after another (handover, start,
// scale, and the handover seen by a client through a real HAProxy, which
// needs haproxy installed: `make bench` installs it where it may, and the
// report says so when it could not). A Monitor notes when someone else's builds, tests or Nomad agents
// shared the machine, and the report lists those stretches.
//
// The pure parts (statistics, goals, the Markdown and text tables, the
// pictures, the monitor) live in non-test files and have unit tests of
// their own.
package bench
