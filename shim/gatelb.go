package shim

// A gate with a load_balancer block carries the LB registration of its
// gated task: the port label names the gated task's port (a group network
// port gives every task of the group the same NOMAD_ADDR_<label>), and the
// health check runs against it. Once the gate holds the lock (the gated
// tasks start then), it waits for the check and sends one ADD that also
// removes the previous holder's upstream, recorded in the lock; then it
// re-checks and re-adds as an ordinary holder does.
//
// The REMOVE must come before the gated task is killed, and Nomad tells the
// gate nothing until then: on an allocation stop the client kills the main
// tasks first and stops its sidecars only once they are dead
// (allocrunner.killTasks, Nomad v1.11). So the gate watches its own
// allocation on the servers (blocking queries, with the read-job its
// identity already needs) and sends the REMOVE as soon as the desired
// status turns stop or evict. The client learns of the same change at about
// the same time, so the gated task should have a shutdown_delay: in Nomad
// 1.11.2 TaskRunner.handleKill runs the task's prekill hooks (service
// deregistration), then waits shutdown_delay, and only then sends the kill
// signal; it does so for every kill of the task (an allocation stop, and a
// "sibling failed" kill after the gate failed), and skips the wait only when
// the stop asked for it (-no-shutdown-delay, DesiredTransition
// NoShutdownDelay). A group-level shutdown_delay delays every kill of the
// allocation too, before any task is killed: allocRunner.killTasks first
// runs the allocation's pre-kill hooks, and the group service hook's
// PreKill (preKillLocked) sleeps the group's shutdown_delay, with or
// without services, for an allocation stop and for the "sibling failed"
// kill alike. checkGateJob counts both delays in the bound on the kill
// time of the gated tasks Nomad kills; those the gate kills itself
// (gatekill.go) do not wait for either.
//
// Every other ending REMOVEs too, before the gate exits: a stop by Nomad, a
// signal, a failed ADD (the gate then fails, and Nomad kills the gated
// tasks), and a lost lock, where the REMOVE gets only the time the gated
// tasks can spare (removeBudget): past it, the next holder's ADD swaps the
// upstream out. A gate whose supervisor dies is REMOVEd by the plugin
// (removeAfterCrash), without holding up Nomad's kill of the gated tasks.
