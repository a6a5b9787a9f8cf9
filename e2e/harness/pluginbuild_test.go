package harness

import (
	"strings"
	"testing"
)

// A commit the clone does not have (a shallow clone, a typo) fails with the
// way to fetch it, before anything is built.
func TestBuildPluginAtNamesTheFixForAMissingCommit(t *testing.T) {
	const missing = "0123456789abcdef0123456789abcdef01234567"
	_, _, err := buildPluginAt(RepoRoot(t), missing, "0.0.0-test")
	if err == nil {
		t.Fatalf("building the plugin at %s succeeded", missing)
	}
	for _, want := range []string{missing, "git fetch --unshallow", EnvRepoRoot} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %q: %v", want, err)
		}
	}
}
