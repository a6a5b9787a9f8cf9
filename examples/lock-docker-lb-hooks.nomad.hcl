# A docker task that holds the lock with `lock` as its entrypoint, and two
# lifecycle tasks that put the one live instance behind the load balancer:
# `lock lb add` (poststart) waits until this allocation holds the lock, checks
# health, and sends one ADD that also removes the previous holder's upstream
# (which the holder's `lock -upstream-port http` recorded in the lock);
# `lock lb remove` (poststop) takes it out again. The image carries `lock` as
# its entrypoint (the seed pattern); the hook tasks run `lock` from the host.
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
      type = "http"
      path = "/healthz"
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
        # next holder's `lock lb add` swaps it out of the LB even when this
        # container dies without running lb-remove (docker kill, OOM, node loss).
        entrypoint = ["/usr/local/bin/lock", "-ttl", "10s", "-delay", "1s", "-upstream-port", "http"]
        args       = ["nomad/jobs/api/lock", "/app/server", "--port", "8080"]
        ports      = ["http"]
      }
    }

    task "lb-add" {
      lifecycle {
        hook = "poststart"
      }
      driver = "raw_exec"
      identity {
        env = true
      }
      config {
        command = "/usr/local/bin/lock"
        args    = ["lb", "add", "-config", "${NOMAD_TASK_DIR}/lb.hcl", "nomad/jobs/api/lock"]
      }
      template {
        destination = "local/lb.hcl"
        data        = local.lb_hcl
      }
    }

    task "lb-remove" {
      lifecycle {
        hook = "poststop"
      }
      driver = "raw_exec"
      identity {
        env = true
      }
      config {
        command = "/usr/local/bin/lock"
        args    = ["lb", "remove", "-config", "${NOMAD_TASK_DIR}/lb.hcl", "nomad/jobs/api/lock"]
      }
      template {
        destination = "local/lb.hcl"
        data        = local.lb_hcl
      }
    }
  }
}
