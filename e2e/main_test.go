package e2e

import (
	"os"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestMain stops the test binary's private Docker engine (harness.StartDocker)
// once every test has run.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
