package shim

import "github.com/nomad-driver-singleton/nomad-driver-singleton/internal/hclsnippet"

// The HCL that the gate's refusals and lock's messages tell a user to add,
// declared once and registered, so that the root module's TestHCLSnippets
// parses and validates each in a task, as the user would paste it. HCL
// takes one argument in a one-line block: a block with two is written on
// several lines.
var (
	gateLifecycleHCL = hclsnippet.Task("lifecycle {\n  hook    = \"prestart\"\n  sidecar = true\n}")
	gateRestartHCL   = hclsnippet.Task("restart {\n  attempts = 0\n  mode     = \"fail\"\n}")

	// LBFollowLifecycleHCL makes a task a poststart sidecar, as `lock lb
	// follow` must be.
	LBFollowLifecycleHCL = hclsnippet.Task("lifecycle {\n  hook    = \"poststart\"\n  sidecar = true\n}")
)
