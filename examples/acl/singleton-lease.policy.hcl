# Lease mode (config { lock { mode = "lease" } }, docs/lease.md): the lock
# policy (singleton-lock.policy.hcl) plus the task's two lease-mode
# variables:
#
#   * the heartbeat, <lock path>/lease: write and read (the holder writes it
#     by check-and-set, and reads it after a conflict);
#   * the escrow, singleton/escrow/<lock path>: write ONLY. The holder
#     escrows its lock ID there for a standby's plugin, which reads it with
#     the operator's release token. Nomad's variable capabilities are
#     independent: without "read" the workload cannot read the ID back.
#     Never add "read" here: that ID releases the lock.
#
# Apply it to the one task that takes the lock (replace web and the path
# with yours; the driver's default lock path is
# nomad/jobs/<job>/<group>/<task>/lock):
#
#   nomad acl policy apply -namespace default -job web -group web -task web singleton-lease-web singleton-lease.policy.hcl
#
namespace "default" {
  variables {
    path "nomad/jobs/web/web/web/lock" {
      capabilities = ["write", "read"]
    }
    # Step-downs (lock step-down, docs/cli.md): the holder reads the
    # requests, and a standby records itself while it waits. Without
    # them the task holds and waits as before, but cannot be stepped down
    # or named by lock step-down -to.
    path "nomad/jobs/web/web/web/lock/step-down" {
      capabilities = ["read"]
    }
    path "nomad/jobs/web/web/web/lock/standby/*" {
      capabilities = ["write", "destroy"]
    }
    path "nomad/jobs/web/web/web/lock/lease" {
      capabilities = ["write", "read"]
    }
    path "singleton/escrow/nomad/jobs/web/web/web/lock" {
      capabilities = ["write"]
    }
  }
}
