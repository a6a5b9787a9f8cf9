# Three allocations, one workload: `lock` holds nomad/jobs/<job>/lock and runs
# the command only while it holds it. The other two wait on a blocking query and
# take over within milliseconds of a graceful stop.
#
#   nomad job run -var lock_bin=/usr/local/bin/lock examples/lock-raw-exec.nomad.hcl
variable "lock_bin" {
  type    = string
  default = "/usr/local/bin/lock"
}

job "web" {
  group "web" {
    count = 3

    # Stop the alloc if its client loses the servers: the holder has already
    # fenced itself by then (TTL - margin), so a replacement can take over.
    disconnect {
      stop_on_client_after = "30s"
    }

    task "web" {
      driver = "raw_exec"

      # NOMAD_TOKEN + NOMAD_UNIX_ADDR for the Task API socket.
      identity {
        env = true
      }

      config {
        command = var.lock_bin
        args = [
          "-ttl", "10s", "-delay", "1s", "-kill-timeout", "4s",
          "nomad/jobs/${NOMAD_JOB_ID}/lock",
          "/usr/bin/python3", "-m", "http.server", "${NOMAD_PORT_http}",
        ]
      }

      # Keep above -kill-timeout so the lock is released before Nomad kills `lock`.
      kill_timeout = "6s"

      resources {
        cpu    = 100
        memory = 64
      }
    }

    network {
      port "http" {}
    }
  }
}
