# A singleton with the singleton driver: three allocations, one running
# workload. The other two wait on the lock and take over within a few hundred
# milliseconds of a graceful stop, or within 2*TTL + delay of a crash.
#
#   nomad acl policy apply -namespace default -job web singleton-lock-web acl/singleton-lock.policy.hcl   # with ACLs
#   nomad job run examples/singleton.nomad.hcl
job "web" {
  group "web" {
    count = 3

    # Once the client loses the servers the holder has already fenced itself
    # (TTL - margin); stopping the alloc lets a replacement take over.
    disconnect {
      stop_on_client_after = "30s"
    }

    network {
      port "http" {}
    }

    task "server" {
      driver = "singleton"

      # NOMAD_TOKEN + NOMAD_UNIX_ADDR: the supervisor reaches the Task API with them.
      identity {
        env = true
      }

      config {
        command = "/usr/bin/python3"
        args    = ["-m", "http.server", "--bind", "127.0.0.1", "${NOMAD_PORT_http}"]

        lock {
          # path defaults to nomad/jobs/<job>/<group>/<task>/lock
          ttl   = "10s"
          delay = "1s"
        }
      }

      # Used on `nomad alloc stop`, job updates and drains: the workload gets
      # SIGTERM, up to 10s to exit, then the lock is released at once.
      kill_signal  = "SIGTERM"
      kill_timeout = "10s"

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
