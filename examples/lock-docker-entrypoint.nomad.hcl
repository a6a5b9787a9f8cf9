# The seed pattern: bake the static `lock` binary into the image and make it the
# entrypoint, so the container's real process runs only while it holds the lock.
#
#   FROM postgres:17
#   COPY lock /usr/local/bin/lock
#   ENTRYPOINT ["/usr/local/bin/lock", "-ttl", "10s", "-delay", "1s", "-kill-signal", "SIGINT", "-kill-timeout", "25s"]
#
# The Task API socket is mounted at /secrets/api.sock in the container.
job "primary-db" {
  group "db" {
    count = 2

    disconnect {
      stop_on_client_after = "30s"
    }

    task "postgres" {
      driver = "docker"

      identity {
        env = true
      }

      config {
        image = "registry.example.com/postgres-with-lock:17"
        args  = ["nomad/jobs/${NOMAD_JOB_ID}/primary", "docker-entrypoint.sh", "postgres"]
      }

      # Above lock's -kill-timeout (25s), so lock releases before Docker kills it.
      kill_signal  = "SIGINT"
      kill_timeout = "30s"
    }
  }
}
