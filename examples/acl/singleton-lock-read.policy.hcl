# Lets a `lock lb follow` sidecar read the lock it follows, and nothing more.
# The sidecar only reads the holder record (blocking queries); it never
# writes the variable. The implicit workload-identity policy reads only the
# exact paths nomad/jobs/<job>, nomad/jobs/<job>/<group> and
# nomad/jobs/<job>/<group>/<task>, not a lock path below them.
#
# singleton-lock.policy.hcl applied to the whole job (-job web) already
# gives every task of it read (and write) on the lock path; for least
# privilege apply that one to the task that takes the lock alone, and this
# one to the sidecar alone (replace the path, web and the names with yours):
#
#   nomad acl policy apply -namespace default -job web -group web -task web singleton-lock-web singleton-lock.policy.hcl
#   nomad acl policy apply -namespace default -job web -group web -task lb singleton-lock-read-web singleton-lock-read.policy.hcl
#
namespace "default" {
  variables {
    path "nomad/jobs/web/lock" {
      capabilities = ["read"]
    }
  }
}
