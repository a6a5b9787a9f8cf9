# Lets an operator's token run `lock step-down` on one lock (docs/cli.md):
# ask its holder to hand the lock over to a waiting standby.
#
# A holder acts only on a request from a token that could have released
# the lock itself, and proves it by the lock ID (docs/cli.md, "Who may ask:
# the proof"). Nomad shows that ID to a management token, and to a token
# with write on the lock path in the answer to a check-and-set write that
# conflicts (docs/security.md). So this policy gives the power to release
# the lock: give it to operators only, never to a job's workload identity.
#
#   * the lock: write (the ID, by a check-and-set that never lands) and
#     read (who holds it, and the new holder afterwards);
#   * <lock>/step-down: write, where the request goes;
#   * <lock>/standby/*: list and read, the records of the waiting standbys;
#   * read-job: to leave out the records of standbys whose allocation is
#     gone or stopped (without it, they are taken as they are);
#   * alloc-lifecycle: a gate steps down by a restart of its whole
#     allocation, which Nomad allows only with it. Leave it out where no
#     gate is stepped down: lock step-down then refuses a gate (exit 77).
#
# Replace the path and the namespace with yours (a driver task's default
# lock path is nomad/jobs/<job>/<group>/<task>/lock); to cover every lock
# of a job, end the paths in a glob, e.g. "nomad/jobs/web/*".
#
#   nomad acl policy apply singleton-step-down-web singleton-step-down.policy.hcl
#   nomad acl token create -name ops-web -policy singleton-step-down-web
#
namespace "default" {
  capabilities = ["read-job", "alloc-lifecycle"]

  variables {
    path "nomad/jobs/web/lock" {
      capabilities = ["write", "read"]
    }
    path "nomad/jobs/web/lock/step-down" {
      capabilities = ["write"]
    }
    path "nomad/jobs/web/lock/standby/*" {
      capabilities = ["list", "read"]
    }
  }
}
