// Command lock runs a command only while it holds a Nomad Variable lock.
// It is package shim's supervisor behind a command line: this package parses
// the flags and the -config file, prints the help, and holds the status and
// lb subcommands. See docs/cli.md for flags and exit codes.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

func main() {
	shim.MaybeRunGuard(os.Args, nil)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the lock command. It returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return runStatus(args[1:], stdout, stderr)
		case "list":
			return runList(args[1:], stdout, stderr)
		case "step-down":
			return runStepDown(args[1:], stdout, stderr)
		case "lb":
			return runLB(args[1:], stdout, stderr)
		case "version", "-version", "--version":
			fmt.Fprintln(stdout, "lock", shim.Version)
			return 0
		}
	}
	cfg, err := parseRunArgs(args, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return shim.ExitConfig
	}
	return supervise(cfg, stderr)
}

// supervise runs cfg's command under the lock, with every signal lock gets
// but its own passed on to the workload.
func supervise(cfg shim.Config, stderr io.Writer) int {
	log := newLogger(stderr, cfg.Verbose)
	cfg.AllocIndex, _ = strconv.Atoi(os.Getenv("NOMAD_ALLOC_INDEX"))
	spec := shim.Spec{Version: shim.SpecVersion, Config: cfg, Holder: lockclient.HolderFromEnv(os.Getenv)}
	locker, err := shim.NewLocker(spec, log)
	if err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return shim.ExitConfig
	}

	if hb := spec.Heartbeat(); hb != nil {
		log.Info("lease mode: heartbeat every "+hb.Interval.String()+"; this holder fences itself "+hb.Fence.String()+
			" after its last acknowledged heartbeat and its workload is SIGKILLed "+hb.KillGrace.String()+" later; "+
			"only the plugin of a node where a singleton task waits for this lock takes a dead holder's lock over (after L = "+
			hb.Takeover().String()+"), any other standby waits for the server's expiry (docs/cli.md)",
			"lock", cfg.Path)
	}

	var metrics *shim.Metrics
	if cfg.HTTPAddr != "" {
		metrics = shim.NewMetrics(nil)
		served := cfg
		served.Namespace = cmp.Or(cfg.Namespace, os.Getenv("NOMAD_NAMESPACE"), "default")
		if err := serveHTTP(served, locker.Config().Holder, metrics, log); err != nil {
			fmt.Fprintf(stderr, "lock: %v\n", err)
			return shim.ExitConfig
		}
	}

	sigs := make(chan os.Signal, 16)
	forwardable := make(chan os.Signal, 16)
	signal.Notify(sigs)
	go func() {
		for sig := range sigs {
			switch sig {
			case syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPIPE:
				continue // ours, not the workload's
			}
			forwardable <- sig
		}
	}()

	sup := &shim.Supervisor{
		Config: cfg, Locker: locker, Logger: log,
		Observe: func(ev shim.Event) {
			if ev.Notice {
				log.Warn(ev.Message)
				return
			}
			log.Debug("state", "state", ev.State, "message", ev.Message)
		},
	}
	sup.Workload, sup.Hooks, err = shim.Attach(spec, shim.Env{Locker: locker, Emitter: sup, Logger: log, Metrics: metrics,
		Process: shim.Process{
			Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
			// Daemons the workload starts stay lock's descendants, and are
			// proven dead before the release.
			Subreaper: true,
			// Lease mode: a standby may take the lock over L after the last
			// heartbeat, so the workload must be dead by D + K even if lock
			// itself is stuck: only the process-group guard ensures that.
			RequireGuard: cfg.Mode == shim.ModeLease,
		}})
	if err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return shim.ExitConfig
	}
	return sup.Run(context.Background(), forwardable)
}

func newLogger(w io.Writer, verbose bool) hclog.Logger {
	level := hclog.Info
	if verbose {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{Name: "lock", Output: w, Level: level})
}
