// Command lock runs a command only while it holds a Nomad Variable lock.
// See the README for flags and exit codes.
package main

import (
	"os"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func main() {
	shim.MaybeRunGuard(os.Args)
	os.Exit(shim.Main(os.Args[1:], os.Stdout, os.Stderr))
}
