# The sidecar pattern, for an app that cannot be wrapped: a leader task holds
# the lock and a poststart sidecar runs the app only in the allocation whose
# leader holds it.
#
# A singleton task counts as running while it waits for the lock, so a
# poststart sidecar starts in every allocation. The leader's workload runs
# only while the lock is held, so it is what marks the allocation as the
# holder: it writes the fencing token into the shared alloc dir, and the
# sidecar waits for that file before it execs the app. The alloc dir is new
# for every allocation, so the file is never stale. If the lock is lost the
# leader task ends, and `leader = true` makes Nomad stop the sidecar too.
job "cron-leader" {
  group "leader" {
    count = 2

    disconnect {
      stop_on_client_after = "30s"
    }

    task "leader" {
      driver = "singleton"
      leader = true

      identity {
        env = true
      }

      config {
        command = "/bin/sh"
        args    = ["-c", "echo $NOMAD_LOCK_FENCE > $NOMAD_ALLOC_DIR/leader-fence && exec sleep infinity"]

        lock {
          path  = "nomad/jobs/cron-leader/leader"
          ttl   = "10s"
          delay = "1s"
        }
      }
    }

    task "scheduler" {
      lifecycle {
        hook    = "poststart"
        sidecar = true
      }

      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          until [ -s "$NOMAD_ALLOC_DIR/leader-fence" ]; do sleep 0.2; done
          echo "leading with fence $(cat "$NOMAD_ALLOC_DIR/leader-fence")"
          exec sh -c 'while :; do date; sleep 60; done'
          EOT
        ]
      }
    }
  }
}
