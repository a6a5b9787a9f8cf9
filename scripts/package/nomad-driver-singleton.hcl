# Installed by the nomad-driver-singleton package: loads the singleton task
# driver from the plugin dir. Nomad's own package runs the agent with
# -config /etc/nomad.d, and its data_dir /opt/nomad/data makes the plugin dir
# /opt/nomad/data/plugins, where the package put the plugin. With another
# data_dir, set plugin_dir = "/opt/nomad/data/plugins" in your agent config
# (lock is in /usr/bin: never in the plugin dir, where Nomad would launch it
# as a plugin). Every setting: docs/driver.md.
plugin "nomad-driver-singleton" {
  config {
    # default_ttl   = "15s"
    # default_delay = "5s"
    # state_dir     = "/var/lib/nomad-driver-singleton"
    # default_user  = "nobody"
    # release_token_file = "/etc/nomad.d/singleton-release.token"
  }
}
