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
	if err := rf.conn.refuseToken(); err != nil {
		return c, err
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
	fs         *flag.FlagSet
	configFile string
	lock       shim.LockValues // by setting name
	cli        shim.Config     // -shell, -verbose
	conn       *connFlags
	lb         shim.LBSpec
	health     shim.HealthSpec
}

func newRunFlags(stderr io.Writer) *runFlags {
	rf := &runFlags{fs: flag.NewFlagSet("lock", flag.ContinueOnError), lock: shim.LockValues{}}
	fs, cli := rf.fs, &rf.cli
	fs.SetOutput(stderr)
	fs.Usage = helpFor(fs, stderr, runHelpHead, runHelpTail)

	lbFlags(fs, &rf.lb, &rf.health)
	for _, s := range shim.LockSettings.In(shim.InFlags) {
		fs.Var(&settingFlag{setting: s, vals: rf.lock}, s.Flag(), s.Usage)
	}
	fs.BoolVar(&cli.Shell, "shell", false, "run the command with $SHELL -c; nomad var lock's default is true")
	fs.BoolVar(&cli.Verbose, "verbose", false, verboseUsage)
	fs.StringVar(&rf.configFile, "config", "", "HCL `file` with the settings of the flags (see docs/cli.md); flags override it")
	rf.conn = newConnFlags(fs)
	return rf
}

// connFlags are the flags of Nomad's CLI that say how to reach Nomad
// (Nomad's command/meta.go, FlagSetClient), with the same names and
// meaning, for every subcommand that talks to Nomad. Each one given
// overrides its NOMAD_* variable, as in Nomad's CLI; none is used through
// the Task API socket. -token is declared to be refused.
type connFlags struct {
	conn  shim.Config // Address, Region, TLS
	token string
	color bool // -no-color, -force-color: lock prints no color
}

func newConnFlags(fs *flag.FlagSet) *connFlags {
	f := &connFlags{}
	c := &f.conn
	fs.StringVar(&c.Address, "address", "", addressUsage)
	fs.StringVar(&c.Region, "region", "", "the Nomad `region` to send requests to (default: NOMAD_REGION, else the agent's)")
	fs.StringVar(&c.TLS.CACert, "ca-cert", "", "PEM `file` of the CA to verify the Nomad server's certificate with (default: NOMAD_CACERT)")
	fs.StringVar(&c.TLS.CAPath, "ca-path", "", "`directory` of PEM CA certificates to verify the Nomad server's certificate with; "+
		"-ca-cert wins if both are given (default: NOMAD_CAPATH)")
	fs.StringVar(&c.TLS.ClientCert, "client-cert", "", "PEM client certificate `file` for mutual TLS with the Nomad server, "+
		"with -client-key (default: NOMAD_CLIENT_CERT)")
	fs.StringVar(&c.TLS.ClientKey, "client-key", "", "unencrypted PEM private key `file` of -client-cert (default: NOMAD_CLIENT_KEY)")
	fs.StringVar(&c.TLS.TLSServerName, "tls-server-name", "", "the server `name` to send (SNI) and to verify the certificate "+
		"against (default: NOMAD_TLS_SERVER_NAME)")
	fs.BoolVar(&c.TLS.Insecure, "tls-skip-verify", false, "do not verify the Nomad server's certificate: not recommended "+
		"(also when NOMAD_SKIP_VERIFY is true)")
	fs.BoolVar(&c.TLS.Insecure, "insecure", false, "the old name of -tls-skip-verify")
	fs.BoolVar(&f.color, "no-color", false, "taken as nomad var lock takes it; lock prints no color")
	fs.BoolVar(&f.color, "force-color", false, "taken as nomad var lock takes it; lock prints no color")
	fs.StringVar(&f.token, "token", "", "refused: a `token` in argv is visible to every user in /proc; "+
		"use NOMAD_TOKEN or $NOMAD_SECRETS_DIR/nomad_token")
	return f
}

// refuseToken fails if -token was given.
func (f *connFlags) refuseToken() error {
	if f.token != "" {
		return errors.New("-token is refused: a token in argv is visible to every user in /proc; " +
			"use NOMAD_TOKEN or `identity { file = true }` (secrets/nomad_token)")
	}
	return nil
}

// apply sets in c how to reach Nomad, as the flags say.
func (f *connFlags) apply(c *shim.Config) {
	c.Address, c.Region, c.TLS = f.conn.Address, f.conn.Region, f.conn.TLS
}

// apply sets in c the settings given on the command line.
func (rf *runFlags) apply(c *shim.Config) error {
	rf.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "shell":
			c.Shell = rf.cli.Shell
		case "verbose":
			c.Verbose = rf.cli.Verbose
		}
	})
	rf.conn.apply(c)
	return shim.LockSettings.In(shim.InFlags).Apply(c, rf.lock, flagLabel)
}

// Usages of the flags that lock's subcommands share.
const (
	addressUsage = "Nomad `URL` when not running in a task (default: NOMAD_ADDR)"
	verboseUsage = "debug logging to stderr"
)

// settingUsage is the usage of the lock setting name, for a subcommand
// that takes it too.
func settingUsage(name string) string {
	for _, s := range shim.LockSettings {
		if s.Name == name {
			return s.Usage
		}
	}
	panic("no lock setting " + name)
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

// argName names the flag's argument in the help, by its kind.
func (f *settingFlag) argName() string {
	switch f.setting.Kind() {
	case shim.KindDuration:
		return "DURATION"
	case shim.KindSignal:
		return "SIGNAL"
	case shim.KindInt:
		return "N"
	case shim.KindBool:
		return ""
	}
	return "VALUE"
}

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
