package bench

import (
	"os"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
)

// TestMain stops the test binary's private Docker engine (harness.StartDocker,
// for the gate variant) once the bench is done.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
