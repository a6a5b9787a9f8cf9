# The gate: a docker app that runs in one allocation at a time, with warm
# standbys, and no `lock` in its image.
#
# The "gate" task (driver = "singleton", config { gate = true }) holds the lock
# for its allocation. It is a prestart sidecar, and the driver reports it
# running only once the lock is held, so Nomad starts the group's other tasks
# (here the docker task "api") in the lock holder's allocation alone. Standbys
# show "Gate waiting for lock ..." in `nomad alloc status`, their "api" stays
# pending, and its service is registered by the holder alone.
#
# When the holder's allocation is stopped, Nomad kills "api" first and waits
# for it, then stops the gate, which releases: the next standby starts its
# "api" at once. In every other case (the gate's lock lost, its supervisor
# killed, a gated task that fails for good) the gate fails, Nomad kills "api",
# and the lock is left to expire on the server (2×TTL + delay), which the gate
# checks at start to outlast api's kill_timeout. docs/gate.md has the rule
# and its bound.
#
# With ACLs, the identity needs write on the lock path and read-job on the
# namespace (acl/singleton-gate.policy.hcl):
#
#   nomad acl policy apply -namespace default -job web singleton-gate-web acl/singleton-gate.policy.hcl
#   nomad job run examples/gate-docker.nomad.hcl
variable "image" {
  description = "The app's image."
  type        = string
  default     = "registry.example.com/web:1.0"
}

variable "command" {
  description = "The app's command in the image."
  type        = string
  default     = "/app/server"
}

variable "args" {
  description = "The app's arguments ($${...} is left for Nomad to interpolate)."
  type        = list(string)
  default     = ["--listen", "127.0.0.1:$${NOMAD_PORT_http}"]
}

variable "volumes" {
  description = "Bind mounts for the app (the docker plugin must allow them)."
  type        = list(string)
  default     = []
}

job "web" {
  group "web" {
    # One holder and one warm standby.
    count = 2

    network {
      port "http" {}
    }

    # With standbys, a rolling deployment cannot become healthy (a standby
    # never runs its app): update the whole group at once instead. With
    # count = 1 a normal rolling update works (docs/gate.md, Deployments).
    update {
      max_parallel = 0
    }

    task "gate" {
      driver = "singleton"

      lifecycle {
        hook    = "prestart"
        sidecar = true
      }

      # A gate that stops must fail for good, so that Nomad kills the tasks it
      # gates: the driver refuses any other restart policy.
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
          # path defaults to nomad/jobs/<job>/<group>/<task>/lock
          ttl   = "10s"
          delay = "1s"
        }
      }

      resources {
        cpu    = 20
        memory = 32
      }
    }

    task "api" {
      driver = "docker"

      config {
        image        = var.image
        network_mode = "host"
        command      = var.command
        args         = var.args
        volumes      = var.volumes
        # docker-init as PID 1 passes SIGTERM on to the app.
        init = true
      }

      # At most ttl + delay - 2s: it must be over before the lock can expire
      # on the server after a loss (the gate checks it).
      kill_timeout = "5s"

      # Restarts in place keep the lock: the gate is untouched. The delay
      # must exceed the group's shutdown_delay + 7s: when the gate loses the
      # lock it kills this task itself, and Nomad must not restart it before
      # its own kill of the allocation begins (the gate checks it).
      restart {
        attempts = 3
        interval = "5m"
        delay    = "10s"
        mode     = "fail"
      }

      service {
        provider = "nomad"
        name     = "web"
        port     = "http"
        address  = "127.0.0.1"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
