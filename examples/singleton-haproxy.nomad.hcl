# The singleton behind a real load balancer: three allocations of a small
# HTTP server (examples/whoami, which answers with its alloc ID), one of them
# holding the lock. The holder is added to the LB API once healthy; the LB
# API (examples/lbapi with -haproxy-socket) points one of the server slots of
# HAProxy's backend "web" at it, and takes it out before the holder is
# stopped. `make demo` runs all of it; by hand:
#
#   haproxy -db -f haproxy.cfg &                       # as below
#   bin/lbapi -listen 127.0.0.1:8080 -groups web-lb -haproxy-socket /run/lbapi/admin.sock &
#   nomad job run -var whoami=$PWD/bin/whoami examples/singleton-haproxy.nomad.hcl
#   curl http://127.0.0.1:<frontend port>/web/      # "alloc <holder> fence N"
#
# haproxy.cfg for a singleton (what scripts/demo.sh writes and
# examples/lbapi/haproxy.Config renders):
#
#   global
#       stats socket /run/lbapi/admin.sock level admin mode 600
#   defaults
#       mode http
#       option redispatch 1      # a retry goes to another server: the successor
#       retries 3                # a request caught on a dead holder is retried
#       timeout connect 1s       # also the pause before a retry
#       timeout queue 5s
#       timeout client 30s
#       timeout server 30s       # how long a hung holder can keep a slot busy
#       timeout http-keep-alive 5s
#   frontend lbapi
#       bind 127.0.0.1:8000
#       default_backend web
#   backend web
#       balance roundrobin
#       # Fixed slots, re-pointed at run time: HAProxy 2.6 can crash deleting
#       # a server that a stream still refers to, so none is ever deleted.
#       server-template slot 1-8 127.0.0.1:1 disabled
variable "whoami" {
  type        = string
  description = "absolute path of the whoami binary (make build puts it in bin/; install it there or pass -var)"
  default     = "/usr/local/bin/whoami"
}

variable "lb_uri" {
  type    = string
  default = "http://127.0.0.1:8080/baragon/v2/request"
}

job "web" {
  group "web" {
    count = 3

    network {
      port "http" {}
    }

    task "server" {
      driver = "singleton"

      identity {
        env = true
      }

      config {
        command = var.whoami
        args    = ["-listen", "127.0.0.1:${NOMAD_PORT_http}"]

        lock {
          ttl   = "10s"
          delay = "1s"
        }

        load_balancer {
          uri              = var.lb_uri
          service_id       = "web"
          base_path        = "/web"
          groups           = ["web-lb"]
          port             = "http"
          owners           = ["team@example.com"]
          remove_deadline  = "5s"
          recheck_interval = "5s"
        }

        health_check {
          type     = "http"
          path     = "/healthz"
          interval = "200ms"
          timeout  = "1s"
        }
      }

      # whoami finishes the requests in flight on SIGTERM.
      kill_signal  = "SIGTERM"
      kill_timeout = "5s"

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
