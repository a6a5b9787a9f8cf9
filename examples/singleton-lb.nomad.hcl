# The singleton driver with a load balancer: the one live instance is added to
# the LB API (Baragon or examples/lbapi) once its health check passes, in one
# request that also removes the previous holder; it is removed before it gets
# its kill signal.
#
#   go run ./examples/lbapi/cmd/lbapi -listen 127.0.0.1:8080 -groups web-lb &
#   nomad job run examples/singleton-lb.nomad.hcl
job "web-lb" {
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
        command = "/usr/bin/python3"
        args    = ["-m", "http.server", "--bind", "127.0.0.1", "${NOMAD_PORT_http}"]

        lock {
          ttl   = "10s"
          delay = "1s"
        }

        load_balancer {
          uri              = "http://127.0.0.1:8080/baragon/v2/request"
          service_id       = "web"
          base_path        = "/web"
          groups           = ["web-lb"]
          port             = "http"
          owners           = ["team@example.com"]
          add_deadline     = "1m"
          remove_deadline  = "5s"
          recheck_interval = "10s"
          # authkey_file = "secrets/lb.key"   # rendered by a template block; or SINGLETON_LB_AUTHKEY in the task env
        }

        health_check {
          type     = "http"
          path     = "/"
          interval = "500ms"
          timeout  = "1s"
        }
      }

      kill_timeout = "10s"
    }
  }
}
