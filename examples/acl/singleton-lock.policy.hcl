# Lets a job's workload identity take the lock that `lock` (or the singleton
# driver) uses. Lock operations need write. The implicit workload-identity
# policy grants only read/list, and only on the exact paths nomad/jobs/<job>,
# nomad/jobs/<job>/<group> and nomad/jobs/<job>/<group>/<task>: not on the lock
# path below them, so without this policy even the first read gets a 403.
#
# Apply it to the job (replace web with your job ID; add -group/-task to narrow):
#
#   nomad acl policy apply -namespace default -job web singleton-lock-web singleton-lock.policy.hcl
#
namespace "default" {
  variables {
    # One lock per job under nomad/jobs/<job>/. "read" lets holders watch the
    # lock for an instant loss notice and lets standbys report who holds it.
    path "nomad/jobs/web/*" {
      capabilities = ["write", "read"]
    }
  }
}
