// Command nomad-driver-singleton is the `singleton` Nomad task driver plugin.
// The same binary is also each task's supervisor and exec helper (hidden
// subcommands), so plugin and supervisor versions never skew.
package main

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/driver"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func main() {
	shim.MaybeRunGuard(os.Args, driver.OpenGuardTree)
	driver.MaybeRunSupervisor(os.Args)
	driver.MaybeRunExec(os.Args)
	plugins.ServeCtx(func(ctx context.Context, log hclog.Logger) any {
		return driver.New(ctx, log)
	})
}
