package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

const usageText = `Usage:
  lock [flags] <path> <command> [args...]   run command while holding the lock at <path>
  lock status [-json] [-namespace NS] <path> show who holds the lock at <path>
  lock lb add|remove|state [flags] [<path>]  LB hooks for lifecycle tasks (lock lb -h)
  lock version

Runs <command> (no shell, arguments exact) only while it holds a TTL lock on the
Nomad Variable <path>, taken through the Task API socket. The command runs in its
own process group and is stopped the moment the lock is lost.

Flags (nomad var lock compatible):
  -ttl DURATION        lock TTL, 10s to 24h (default 15s)
  -delay DURATION      lock delay after an unclean loss, > 0 (default 5s; nomad var lock: 15s)
  -shell               run the command with $SHELL -c (default false; nomad var lock: true)
  -verbose             debug logging to stderr
  -early-return        try once; if the lock is held, exit 0 without running the command
  -max-retry N         give up waiting after N consecutive API errors (default 0: until -wait)
  -backoff DURATION    cap of the jittered backoff after API errors (default 5s)
Flags (ours):
  -wait DURATION       give up (exit 75) if not acquired within this time (default 0: forever)
  -renew DURATION      renew interval (default TTL/2)
  -kill-signal SIGNAL  signal for the workload's group on loss or stop (default SIGTERM;
                       a SIGTERM/SIGINT sent to lock is passed on as is unless this is set)
  -kill-timeout DURATION  grace before SIGKILL (default 4s; keep it below the task's kill_timeout)
  -config FILE         HCL file with the same settings; flags override it
  -namespace NS        variable namespace (default: the task's)
  -address URL         Nomad address when not running in a task (default: NOMAD_ADDR)
  -upstream-port LABEL record this Nomad port's host:port as the holder's upstream in
                       the lock, for "lock lb add" lifecycle tasks: the next holder's
                       ADD then removes it from the LB even if this instance dies
Flags (load balancer, optional; the same fields as the load_balancer and
health_check blocks of -config):
  -lb-uri URL          the LB API's request collection, e.g. http://lb:8080/baragon/v2/request
  -lb-service-id ID    -lb-base-path PATH    -lb-groups G1,G2    -lb-owners O1,O2
  -lb-port LABEL       Nomad port label whose host:port is registered
  -lb-option K=V       service option with a string value (repeatable)
  -lb-options-json J   service options as a JSON object: lists, numbers, maps
  -lb-template-name T  -lb-domains D1,D2    -lb-additional-paths P1,P2
  -lb-group G          our upstream's group (default "default")
  -lb-rack-id R        our upstream's rackId
  -lb-request-timeout, -lb-poll-interval, -lb-add-deadline, -lb-remove-deadline,
  -lb-recheck-interval DURATION
  -lb-authkey-file F   auth key file (else $SINGLETON_LB_AUTHKEY); never on the command line
  -lb-ca-file F        CA bundle for an https LB
  -health-type http|tcp, -health-path P, -health-port LABEL,
  -health-interval, -health-timeout, -health-grace DURATION

The token comes from NOMAD_TOKEN or $NOMAD_SECRETS_DIR/nomad_token, never from argv.
The workload gets NOMAD_LOCK_PATH and NOMAD_LOCK_FENCE (a fencing token that grows
with every acquisition).

Exit codes: the command's own code (128+N if killed by signal N); 64 config error;
69 Nomad unreachable or API errors; 74 the LB refused the ADD; 75 wait timeout;
76 lock lost; 77 permission
denied (the message prints the ACL policy to apply); 126/127 command not executable/found.
`

// errHelp means -h or -help was given; usage has been printed.
var errHelp = flag.ErrHelp

// parseRunArgs parses `lock [flags] <path> <command> [args...]`. Flags given
// on the command line override the -config file.
func parseRunArgs(args []string, stderr io.Writer) (shim.Config, error) {
	c := shim.DefaultConfig()
	rf := newRunFlags(stderr)
	if err := rf.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, errHelp
		}
		return c, fmt.Errorf("%w (see lock -h)", err)
	}
	if rf.token != "" {
		return c, errors.New("-token is refused: a token in argv is visible to every user in /proc; " +
			"use NOMAD_TOKEN or `identity { file = true }` (secrets/nomad_token)")
	}

	var file fileBlocks
	if rf.configFile != "" {
		var err error
		if file, err = loadFile(&c, rf.configFile); err != nil {
			return c, err
		}
	}
	if err := rf.apply(&c); err != nil {
		return c, err
	}

	rest := rf.fs.Args()
	if len(rest) > 0 {
		c.Path = rest[0]
		if len(rest) > 1 {
			c.Command = rest[1:]
		}
	}
	lb, err := shim.BuildLoadBalancer(mergeLB(file.lb, rf.lb), mergeHealth(file.health, rf.health), os.Getenv, "")
	if err != nil {
		return c, err
	}
	c.LB = lb
	if err := resolveUpstream(&c, os.Getenv); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// runFlags are the flags of `lock`. The lock settings given are kept as
// written, and laid over the -config file (apply) only where given.
type runFlags struct {
	fs                *flag.FlagSet
	configFile, token string
	lock              shim.LockValues // by setting name
	cli               shim.Config     // -shell, -verbose, -address
	lb                shim.LBSpec
	health            shim.HealthSpec
}

func newRunFlags(stderr io.Writer) *runFlags {
	rf := &runFlags{fs: flag.NewFlagSet("lock", flag.ContinueOnError), lock: shim.LockValues{}}
	fs, cli := rf.fs, &rf.cli
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageText) }

	lbFlags(fs, &rf.lb, &rf.health)
	for _, s := range shim.LockSettings.In(shim.InFlags) {
		fs.Var(&settingFlag{setting: s, vals: rf.lock}, s.Flag(), s.Usage)
	}
	fs.BoolVar(&cli.Shell, "shell", false, "")
	fs.BoolVar(&cli.Verbose, "verbose", false, "")
	fs.StringVar(&rf.configFile, "config", "", "")
	fs.StringVar(&cli.Address, "address", "", "")
	fs.StringVar(&rf.token, "token", "", "")
	return rf
}

// apply sets in c the settings given on the command line.
func (rf *runFlags) apply(c *shim.Config) error {
	rf.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "shell":
			c.Shell = rf.cli.Shell
		case "verbose":
			c.Verbose = rf.cli.Verbose
		case "address":
			c.Address = rf.cli.Address
		}
	})
	return shim.LockSettings.In(shim.InFlags).Apply(c, rf.lock, flagLabel)
}

// flagLabel names a lock setting in errors about its flag.
func flagLabel(s shim.LockSetting) string { return "-" + s.Flag() }

// settingFlag is the flag of one lock setting: it records the value as
// given, in vals. Durations, numbers and booleans are checked here, with
// the flag package's own messages, so that a bad one fails as the flag.
type settingFlag struct {
	setting shim.LockSetting
	vals    shim.LockValues
}

var (
	errParse = errors.New("parse error")
	errRange = errors.New("value out of range")
)

func (f *settingFlag) String() string   { return f.setting.Default }
func (f *settingFlag) IsBoolFlag() bool { return f.setting.Kind() == shim.KindBool }

func (f *settingFlag) Set(v string) error {
	switch f.setting.Kind() {
	case shim.KindDuration:
		if _, err := time.ParseDuration(v); err != nil {
			return errParse
		}
	case shim.KindInt:
		n, err := strconv.ParseInt(v, 0, strconv.IntSize)
		if errors.Is(err, strconv.ErrRange) {
			return errRange
		} else if err != nil {
			return errParse
		}
		v = strconv.Itoa(int(n))
	case shim.KindBool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errParse
		}
		v = strconv.FormatBool(b)
	}
	f.vals[f.setting.Name] = v
	return nil
}

// resolveUpstream sets c.Upstream from c.UpstreamPort and the task environment.
func resolveUpstream(c *shim.Config, getenv func(string) string) error {
	if c.UpstreamPort == "" {
		return nil
	}
	if c.LB != nil {
		return fmt.Errorf("-upstream-port %q: with a load balancer configured, lock records its upstream "+
			"(load_balancer.port %q) itself; drop -upstream-port", c.UpstreamPort, c.LB.PortLabel)
	}
	addr, err := shim.PortAddress(c.UpstreamPort, getenv)
	if err != nil {
		return fmt.Errorf("-upstream-port: %w", err)
	}
	c.Upstream = addr
	return nil
}
