# The lock policy (singleton-lock.policy.hcl) plus read-job on the namespace,
# so that in a rolling update an old-version standby gives way to the new
# version (docs/updates.md): when the lock comes free it reads its own
# allocation and its job's allocations to find a newer version of its group
# on its way to the lock. Without read-job the task takes the lock as before
# (two handovers per update) and says so once in a task event.
#
# read-job lets the task read every job of the namespace, not only its own.
# Apply it to the one task that takes the lock (replace the path, the names
# and web with yours):
#
#   nomad acl policy apply -namespace default -job web -group web -task web singleton-update-web singleton-update.policy.hcl
#
namespace "default" {
  capabilities = ["read-job"]

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
  }
}
