# The token the singleton driver's plugin releases with when a task's own
# workload identity no longer can: `nomad job stop -purge` removes the
# allocation from the servers at once, and its identity with it, so under
# ACLs neither the task nor the plugin can release with it, and the next
# holder would wait for the server's expiry (2×TTL + delay).
#
# The plugin uses this token only after it has proven every process of the
# task dead, and only to release a lock its own supervisor holds: a release
# takes the lock ID, which only the holder knows. Grant write alone: Nomad
# 1.11 shows a variable's lock ID to a token with read and write on it.
#
# Narrow the path to where your jobs' locks live. The driver's default lock
# path is nomad/jobs/<job>/<group>/<task>/lock; the glob below covers it for
# every job.
#
#   nomad acl policy apply singleton-release singleton-release.policy.hcl
#   nomad acl token create -name singleton-release -policy singleton-release -json | jq -r .SecretID > /etc/nomad.d/singleton-release.token
#   chown root:root /etc/nomad.d/singleton-release.token && chmod 0600 /etc/nomad.d/singleton-release.token
#
# then, in the plugin's config: release_token_file = "/etc/nomad.d/singleton-release.token"
#
namespace "*" {
  variables {
    path "nomad/jobs/*/lock" {
      capabilities = ["write"]
    }
  }
}
