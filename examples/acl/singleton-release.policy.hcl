# The token the singleton driver's plugin releases with when a task's own
# workload identity no longer can: `nomad job stop -purge` removes the
# allocation from the servers at once, and its identity with it, so under
# ACLs neither the task nor the plugin can release with it, and the next
# holder would wait for the server's expiry (2×TTL + delay).
#
# The plugin uses this token only after it has proven every process of the
# task dead, and only to release a lock its own supervisor holds, with the
# lock ID its supervisor recorded. It needs write to release; read, because
# for a gate it first marks the release clean in the variable's Items and
# keeps the other Items (the holder and its upstream); and read-job, to ask
# whether a gate's allocation is stopped. Nomad 1.11 shows a variable's lock
# ID to a token with read and write on it, so this token can release any
# lock below the path: keep it where only root reads it, as the plugin
# requires (a root-owned 0600 file).
#
# Narrow the paths to where your jobs' locks live. The driver's default lock
# path is nomad/jobs/<job>/<group>/<task>/lock, and a semaphore's slots
# (lock.holders) are <path>/slot-<i> below it; the globs below cover both
# for every job (in Nomad's ACL globs a * spans slashes too, but the rest of
# the pattern must match to the path's end). Give a lock.path that does not
# end in /lock a line of its own, and its slots another (<path>/slot-*).
# Nothing here reaches the other variables jobs keep below nomad/jobs/.
#
#   nomad acl policy apply singleton-release singleton-release.policy.hcl
#   nomad acl token create -name singleton-release -policy singleton-release -json | jq -r .SecretID > /etc/nomad.d/singleton-release.token
#   chown root:root /etc/nomad.d/singleton-release.token && chmod 0600 /etc/nomad.d/singleton-release.token
#
# then, in the plugin's config: release_token_file = "/etc/nomad.d/singleton-release.token"
#
# Lease mode (docs/lease.md) adds two paths: the standby's plugin reads the
# heartbeats and seals a dead holder's (write), and reads the lock ID the
# holder escrowed under singleton/escrow/ (read), to release the lock for it.
#
namespace "*" {
  # A gate's lock covers its gated tasks: the plugin releases it only once
  # Nomad says the allocation is stopped or gone, which takes read-job.
  capabilities = ["read-job"]

  variables {
    path "nomad/jobs/*/lock" {
      capabilities = ["write", "read"]
    }
    # a semaphore's slots (lock.holders)
    path "nomad/jobs/*/lock/slot-*" {
      capabilities = ["write", "read"]
    }
    # lease mode: the heartbeats, and the escrowed lock IDs
    path "nomad/jobs/*/lock/lease" {
      capabilities = ["write", "read"]
    }
    path "singleton/escrow/*" {
      capabilities = ["read"]
    }
  }
}
