# `lock` inside an exec-driver chroot, mounted from a host volume, as in
# Nomad's singleton guide. The client must define the volume:
#
#   client {
#     host_volume "singleton-lock" {
#       path      = "/opt/singleton/bin"   # holds the static `lock` binary
#       read_only = true
#     }
#   }
job "cron-leader" {
  group "leader" {
    count = 2

    volume "lock" {
      type      = "host"
      source    = "singleton-lock"
      read_only = true
    }

    task "leader" {
      driver = "exec"

      identity {
        env = true
      }

      volume_mount {
        volume      = "lock"
        destination = "/opt/singleton"
        read_only   = true
      }

      config {
        # Inside the chroot the socket is /secrets/api.sock (NOMAD_UNIX_ADDR).
        command = "/opt/singleton/lock"
        args    = ["-ttl", "10s", "-delay", "1s", "nomad/jobs/${NOMAD_JOB_ID}/leader", "/bin/sleep", "infinity"]
      }

      kill_timeout = "6s"
    }
  }
}
