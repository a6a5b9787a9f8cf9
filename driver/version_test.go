package driver

import (
	"testing"

	"github.com/hashicorp/go-version"
)

// Nomad refuses to start an agent whose plugin reports a version go-version
// cannot parse. The Makefile stamps "<semver>+<commit>"; the default must
// parse too.
func TestPluginVersionParses(t *testing.T) {
	for _, v := range []string{pluginInfo.PluginVersion, "0.1.0-dev+ba9f68b", "0.1.0-dev+ba9f68b-dirty"} {
		if _, err := version.NewVersion(v); err != nil {
			t.Errorf("plugin version %q does not parse: %v", v, err)
		}
	}
}
