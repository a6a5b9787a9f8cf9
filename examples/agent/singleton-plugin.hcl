# Agent configuration for the singleton driver. Put the plugin binary alone
# in the plugin dir (Nomad launches every binary there as a plugin, so never
# put `lock` in it):
#
#   install -m 0755 bin/plugins/nomad-driver-singleton /opt/nomad/plugins/
#
# Nomad 1.11 loads a plugin only when a block names its file name.
plugin_dir = "/opt/nomad/plugins"

plugin "nomad-driver-singleton" {
  config {
    # Task users that map to these host IDs are refused, e.g. to forbid
    # tasks running as root (tasks without `user` run as the agent's user).
    # denied_host_uids = "0"
    # Defaults for tasks whose lock block sets no ttl/delay.
    default_ttl   = "15s"
    default_delay = "5s"
  }
}

client {
  options {
    # Needed on machines where AWS_CA_BUNDLE is set.
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
