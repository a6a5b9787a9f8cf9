# Lets a gate (a singleton task with config { gate = true }) take its lock and
# read its own allocation. Beside write on the lock path (see
# singleton-lock.policy.hcl for why on that path alone), a gate needs
# read-job on the namespace: it reads its job at start (to refuse a job it
# cannot gate safely), notices a stop of its allocation while it waits for
# the lock (Nomad cannot stop a task whose driver has not started it), tells
# a stop of its allocation from a restart before it releases, and, after a
# lock released behind its holder's back, waits until Nomad reports the
# previous holder's gated tasks dead.
#
#   nomad acl policy apply -namespace default -job web -group web -task gate singleton-gate-web singleton-gate.policy.hcl
#
namespace "default" {
  capabilities = ["read-job"]

  variables {
    path "nomad/jobs/web/web/gate/lock" {
      capabilities = ["write", "read"]
    }
    # Step-downs (lock step-down, docs/cli.md): the holder reads the
    # requests, and a standby records itself while it waits. Without
    # them the task holds and waits as before, but cannot be stepped down
    # or named by lock step-down -to.
    path "nomad/jobs/web/web/gate/lock/step-down" {
      capabilities = ["read"]
    }
    path "nomad/jobs/web/web/gate/lock/standby/*" {
      capabilities = ["write", "destroy"]
    }
  }
}
