# A docker task that holds the lock with `lock` as its entrypoint, and a
# poststart sidecar, `lock lb follow`, that puts the one live instance behind
# the load balancer: every time this allocation acquires the lock (its first
# start, after a restart of its task, after winning the lock back) the
# sidecar adds its upstream once the health check passes, with the previous
# holder's upstream removed in the same request; when that tenure ends (the
# lock moves on, is released or expires) or the health check fails, it
# removes the upstream; and it removes it when the allocation stops.
#
# Why a sidecar, and not a poststart `lock lb add` with a poststop
# `lock lb remove` (retired: both now exit 64 and name this pattern):
# those run once per allocation, but a docker task's
# tenures are not. After a `docker kill` (or an OOM kill, or a crash) Nomad
# restarts only the task, so the allocation's poststop never runs, and when
# the allocation later wins the lock back its poststart does not run again:
# the LB would list a dead upstream and not the holder. A sidecar lives as
# long as the allocation, across restarts of the main task, and sees each
# tenure in the lock's holder record. It only reads the lock (read on the lock
# path: examples/acl/singleton-lock.policy.hcl applied to the job gives it, or
# singleton-lock-read.policy.hcl applied to this task alone) and only ever
# removes its own allocation's upstream, or the previous holder's as recorded.
# Why the health check: a killed holder keeps its lock until the server
# expires it (2×TTL + delay, about 21 s here), but its sidecar sees the check
# fail and takes it out of the LB within about one check interval.
#
# The image carries `lock` as its entrypoint (the seed pattern); the sidecar
# runs `lock` from the host, where the LB API and its auth key are.
locals {
  lb_hcl = <<-EOT
    load_balancer {
      uri          = "http://baragon.service.consul:8080/baragon/v2/request"
      service_id   = "api"
      base_path    = "/api"
      groups       = ["prod-lb"]
      port         = "http"
      authkey_file = "/etc/singleton/lb-authkey"
    }
    health_check {
      type     = "http"
      path     = "/healthz"
      interval = "1s"
    }
  EOT
}

job "api" {
  group "api" {
    count = 2

    network {
      port "http" {
        to = 8080
      }
    }

    task "api" {
      driver = "docker"

      identity {
        env = true
      }

      config {
        image      = "registry.example.com/api-with-lock:1.0"
        # -upstream-port records this port's host:port in the lock, so that the
        # next holder's ADD swaps it out of the LB whatever became of this
        # container.
        entrypoint = ["/usr/local/bin/lock", "-ttl", "10s", "-delay", "1s", "-upstream-port", "http"]
        args       = ["nomad/jobs/api/lock", "/app/server", "--port", "8080"]
        ports      = ["http"]
      }
    }

    task "lb" {
      lifecycle {
        hook    = "poststart"
        sidecar = true
      }
      driver = "raw_exec"
      identity {
        env = true
      }
      # On its kill signal the sidecar removes its upstream (within the
      # load_balancer's remove_deadline, 10s by default) before it exits.
      kill_timeout = "15s"
      config {
        command = "/usr/local/bin/lock"
        args    = ["lb", "follow", "-config", "${NOMAD_TASK_DIR}/lb.hcl", "nomad/jobs/api/lock"]
      }
      template {
        destination = "local/lb.hcl"
        data        = local.lb_hcl
      }
    }
  }
}
