# Keep the standbys on other nodes than the holder, so a node failure never
# takes the holder and its standbys down together.
job "primary-db" {
  group "db" {
    count = 3

    # At most one allocation per node.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    # Prefer spreading across datacenters (or racks via a node meta key).
    spread {
      attribute = "${node.datacenter}"
      weight    = 100
    }

    # Only nodes that run the singleton driver.
    constraint {
      attribute = "${attr.driver.singleton}"
      operator  = "is_set"
    }

    disconnect {
      stop_on_client_after = "30s"
    }

    task "postgres" {
      driver = "singleton"

      identity {
        env = true
      }

      config {
        command = "/usr/lib/postgresql/15/bin/postgres"
        args    = ["-D", "/var/lib/postgresql/data"]

        lock {
          ttl   = "10s"
          delay = "1s"
          # On loss postgres gets SIGINT (fast shutdown) and up to 8s.
          kill_signal  = "SIGINT"
          kill_timeout = "8s"
        }
      }

      user         = "postgres"
      kill_signal  = "SIGINT"
      kill_timeout = "30s"
    }
  }
}
