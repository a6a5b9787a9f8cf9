# Lets a job's workload identity take the lock that `lock` (or the singleton
# driver) uses. The implicit workload-identity policy only grants read/list on
# nomad/jobs/<job>..., never write, and lock operations need write.
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
