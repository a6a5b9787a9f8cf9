# Agent configuration for the singleton driver. Put the plugin binary alone
# in the plugin dir (Nomad launches every binary there as a plugin, so never
# put `lock` in it):
#
#   install -m 0755 bin/plugins/nomad-driver-singleton /opt/nomad/data/plugins/
#
# (the .deb and .rpm put it there: Nomad's default plugin dir for the
# data_dir /opt/nomad/data of Nomad's own packages; see docs/driver.md).
#
# Nomad 1.11 loads a plugin only when a block names its file name.
plugin_dir = "/opt/nomad/data/plugins"

plugin "nomad-driver-singleton" {
  config {
    # Defaults for tasks whose lock block sets no ttl/delay.
    default_ttl   = "15s"
    default_delay = "5s"
    # The plugin's own state: root-owned, 0700, made if missing.
    state_dir = "/var/lib/nomad-driver-singleton"
    # Tasks without `user` run as this user. A task that would run as root
    # is refused unless allow_root = true: leave it off unless everyone who
    # may submit jobs may have root on this client.
    default_user = "nobody"
    allow_root   = false
    # Further host IDs a task user must not map to.
    # denied_host_uids = "1-999"
    # Under ACLs: a token the plugin releases with when `nomad job stop
    # -purge` has taken the task's own identity (root-owned, 0600; see
    # examples/acl/singleton-release.policy.hcl).
    # release_token_file = "/etc/nomad.d/singleton-release.token"
  }
}

client {
  options {
    # Needed on machines where AWS_CA_BUNDLE is set.
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
