# The gate with an exec-driver app: a worker that must never run twice (it
# owns the files in its data volume), with a warm standby. The "gate" task
# holds the lock for its allocation; Nomad starts "worker" in the holder's
# allocation alone, and stops it, and waits for it, before the gate releases.
# See examples/gate-docker.nomad.hcl for the whole story, and docs/gate.md
# for the rule and its bound.
#
# The client needs two host volumes: the worker's binary, and its data.
#
#   client {
#     host_volume "worker-bin"  { path = "/opt/worker"     read_only = true }
#     host_volume "worker-data" { path = "/srv/worker-data" }
#   }
#
#   nomad acl policy apply -namespace default -job worker singleton-gate-worker acl/singleton-gate.policy.hcl   # with ACLs
#   nomad job run examples/gate-exec.nomad.hcl
variable "command" {
  description = "The worker's binary, in the worker-bin volume."
  type        = string
  default     = "/opt/worker/worker"
}

variable "args" {
  description = "The worker's arguments."
  type        = list(string)
  default     = ["--data", "/data"]
}

job "worker" {
  group "worker" {
    count = 2

    network {
      port "http" {}
    }

    # A standby never runs its worker, so a rolling deployment could not
    # become healthy: replace the whole group at once on updates.
    update {
      max_parallel = 0
    }

    volume "bin" {
      type      = "host"
      source    = "worker-bin"
      read_only = true
    }

    volume "data" {
      type   = "host"
      source = "worker-data"
    }

    task "gate" {
      driver = "singleton"

      lifecycle {
        hook    = "prestart"
        sidecar = true
      }

      restart {
        attempts = 0
        mode     = "fail"
      }

      identity {
        env = true
      }

      config {
        gate = true
        lock {
          ttl   = "10s"
          delay = "1s"
        }
      }

      resources {
        cpu    = 20
        memory = 32
      }
    }

    task "worker" {
      driver = "exec"

      volume_mount {
        volume      = "bin"
        destination = "/opt/worker"
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      config {
        command = var.command
        args    = var.args
      }

      kill_timeout = "5s"

      service {
        provider = "nomad"
        name     = "worker"
        port     = "http"
        address  = "127.0.0.1"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
