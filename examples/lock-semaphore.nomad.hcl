# Four allocations, at most two workers at once: `lock -n 2` holds one of the
# two slots nomad/jobs/<job>/workers/slot-0 and slot-1 and runs the worker only
# while it does. The worker reads its shard from NOMAD_LOCK_SLOT (0 or 1); the
# other two allocations wait and take a slot the moment one is freed.
# See docs/semaphore.md.
#
#   nomad job run -var lock_bin=/usr/local/bin/lock examples/lock-semaphore.nomad.hcl
variable "lock_bin" {
  type    = string
  default = "/usr/local/bin/lock"
}

job "queue" {
  group "workers" {
    count = 4

    disconnect {
      stop_on_client_after = "30s"
    }

    task "worker" {
      driver = "raw_exec"

      identity {
        env = true
      }

      config {
        command = var.lock_bin
        args = [
          "-n", "2", "-ttl", "10s", "-delay", "1s", "-kill-timeout", "4s",
          "nomad/jobs/${NOMAD_JOB_ID}/workers",
          "/bin/sh", "-c", "echo \"shard $NOMAD_LOCK_SLOT of 2 (fence $NOMAD_LOCK_FENCE)\"; exec sleep infinity",
        ]
      }

      kill_timeout = "6s"

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
