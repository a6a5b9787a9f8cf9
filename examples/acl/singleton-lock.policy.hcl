# Lets a job's workload identity take the lock that `lock` (or the singleton
# driver) uses. Lock operations need write. The implicit workload-identity
# policy grants only read/list, and only on the exact paths nomad/jobs/<job>,
# nomad/jobs/<job>/<group> and nomad/jobs/<job>/<group>/<task>: not on the lock
# path below them, so without this policy even the first read gets a 403.
#
# Grant write on the lock path alone, not on nomad/jobs/<job>/*: Nomad 1.11
# shows the lock ID of a variable to any token with read and write on it (in
# the 409 of a conflicting check-and-set write), and that ID releases the
# lock. The driver's default path is nomad/jobs/<job>/<group>/<task>/lock;
# `lock` uses the path you give it.
#
# Apply it to the job (replace the path and web with yours; add -group/-task
# to narrow it to the one task that takes the lock):
#
#   nomad acl policy apply -namespace default -job web singleton-lock-web singleton-lock.policy.hcl
#
namespace "default" {
  variables {
    # "read" lets holders watch the lock for an instant loss notice and lets
    # standbys report who holds it.
    path "nomad/jobs/web/lock" {
      capabilities = ["write", "read"]
    }
    # Step-downs (lock step-down, docs/cli.md): the holder reads the
    # requests, and a standby records itself while it waits. Without
    # them the task holds and waits as before, but cannot be stepped down
    # or named by lock step-down -to.
    path "nomad/jobs/web/lock/step-down" {
      capabilities = ["read"]
    }
    path "nomad/jobs/web/lock/standby/*" {
      capabilities = ["write", "destroy"]
    }
  }
}
