// Package harness runs a real Nomad agent (built from the pinned module into
// bin/nomad) for the end-to-end tests of nomad-driver-singleton, and gives
// those tests the instruments they need to check singleton behaviour.
//
// The pieces:
//
//   - Binaries: RepoRoot, NomadBin, LockBin and BuildTestWorkload locate or
//     build the executables under test. A missing binary fails the test with
//     instructions; nothing is skipped silently.
//   - Agent: StartAgent starts a Nomad cluster on free loopback ports: a
//     single `nomad agent -dev`, or a server process plus one or more client
//     processes with persistent data dirs, so a client can be stopped,
//     restarted or frozen while the server keeps running. With Netns, each
//     client runs in a network namespace of its own, joined to the server
//     by a veth pair on a private bridge, and Member.Partition cuts it off
//     (Heal restores it); cleanup removes the namespaces and the bridge.
//     With Servers > 1 the servers form one Raft cluster: Member.Kill and
//     Start on Agent.Leader force an election.
//     It waits until there is a leader and ready nodes with healthy drivers. Job helpers
//     (RunJobHCL, WaitAllocs, AllocLogs, ...) are thin wrappers over the
//     official api client.
//   - Jobspecs: the jobs the tests build are text/template files in
//     harness/jobs/ (one per kind of job, shared blocks in blocks.tmpl);
//     Jobspec renders one from a struct of values, quoting strings with
//     strconv.Quote, and ParseJobspec checks a rendered jobspec's syntax
//     without an agent. Jobs that users would run too stay in examples/.
//   - Processes: FindProcs scans /proc for processes carrying a marker, and a
//     Sampler records how many of them (and of which allocations) ran at once.
//     StartProcess runs a program outside Nomad (e.g. bin/lock against the
//     agent's NOMAD_ADDR) with its output captured and its exit code as a
//     shell reports it; ReadEnviron and ReadCmdline read a live process.
//     WaitTaskEvent and WaitAllocLog wait for a task's events and logs.
//   - Driver plugin: PluginDir and PluginBin locate bin/plugins/
//     nomad-driver-singleton; SingletonAgentOptions (or PluginDir plus
//     SingletonPluginConfig in AgentOptions.Config) loads it with given lock
//     defaults and waits for the singleton driver to be healthy. PluginProcs
//     and SupervisorProcs find the plugin process of an agent and the
//     per-task supervisors; ProcStatus and ProcStartTicks read /proc.
//   - Load balancer: StartLB runs the reference LB API (examples/lbapi) on a
//     free loopback port in the test process, stamping each request's
//     enqueue and finish with MonoNow (lbapi.RequestRecord), so LB events
//     order exactly against the workload records. FreePort picks a port.
//     StartHAProxyLB puts a real HAProxy behind it (examples/lbapi's HAProxy
//     backend), and Probe is a client loop through HAProxy's frontend whose
//     Summarize counts failed requests and the longest stretch with no
//     backend.
//   - Docker: StartDocker starts the test binary's private dockerd (no
//     bridge, no iptables rules; its own temp dir and containerd) and builds
//     the test image (busybox + bin/lock + testworkload, tagged by content
//     hash); AgentOptions.Docker points an agent's docker plugin at it;
//     Docker.CLI runs the docker CLI against it and TaskContainers finds a
//     task's containers. The package's TestMain must call Main, which stops
//     the engine by PID when the tests are done.
//   - Records: the e2e/testworkload program appends start/stop/signal/exit
//     events with CLOCK_MONOTONIC timestamps to a record file; ReadRecords,
//     Intervals, Overlaps and Handovers turn them into assertions such as
//     "two allocations never ran at the same time" and "handover took 1.2s";
//     FenceViolations checks that NOMAD_LOCK_FENCE strictly increases from
//     one holder to the next, in start order. CheckNoOverlap asserts all of
//     it at once (records, sampler and fences).
//
// Every wait is bounded, every process the harness starts is stopped by PID
// in t.Cleanup (which also stops all jobs first, and kills and reports any
// task process that outlives its agent), and the agent logs are printed when
// a test fails. Set E2E_LOG_DIR to keep the agent logs.
//
// The package is Linux-only: it reads /proc and cgroupfs and uses
// Pdeathsig, SIGSTOP and mount(2).
//
// e2e/ is a Go module of its own (e2e/go.mod), which takes the product
// module from the directory above (a replace directive), so `go test ./...`
// at the repository root neither builds nor runs it. Run the tests with
// `make e2e`, or from e2e/ (`go -C e2e test -run TestLockDev .` from the
// root). The product's internal/ packages stay importable: the e2e module's
// path lies below the directory that holds internal/.
package harness
