package shim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Defaults. Where they differ from `nomad var lock` the README says why.
const (
	DefaultTTL         = 15 * time.Second
	DefaultLockDelay   = 5 * time.Second
	DefaultKillTimeout = 4 * time.Second
	DefaultKillSignal  = syscall.SIGTERM
	DefaultMaxBackoff  = 5 * time.Second
)

// Config is one supervised run. It comes from flags, an HCL file, or the
// driver's task config, and is validated by Validate before anything starts.
type Config struct {
	Path      string
	Namespace string
	Address   string // NOMAD_ADDR override for use outside a task
	// RootSecretsDir, when set, is the task's secrets dir for a caller that
	// runs as root beside a task it does not trust (the driver's
	// supervisor): only its Task API socket, served by root, and no token
	// file read through a symlink (lockclient.DiscoverRootEndpoint).
	RootSecretsDir string

	TTL         time.Duration
	LockDelay   time.Duration
	Renew       time.Duration // 0: TTL/2
	Wait        time.Duration // 0: wait forever
	EarlyReturn bool
	MaxRetry    int
	Backoff     time.Duration // cap of the error backoff

	Command []string // argv; with Shell, joined and run by $SHELL -c
	Shell   bool

	// KillSignal goes to the workload's process group on loss and on stop.
	// When unset, a SIGTERM or SIGINT received by the supervisor is passed on as is.
	KillSignal    syscall.Signal
	KillSignalSet bool
	KillTimeout   time.Duration

	Verbose bool

	// LB registers the instance with a load balancer; nil for none.
	LB *LoadBalancer

	// Gate holds the lock for the other tasks of the allocation (the
	// driver's `gate = true`); nil for none. A gate's Command may be empty.
	Gate *Gate
	// UpstreamPort is a Nomad port label (-upstream-port, lock.upstream_port)
	// whose host:port, Upstream, is recorded as the holder's upstream in the
	// lock's Items without any LB request of our own: for `lock lb add` in a
	// lifecycle task, whose next holder then swaps this upstream out of the
	// LB (even if we die without a REMOVE). With LB set, LB.Upstream is
	// recorded instead.
	UpstreamPort string
	Upstream     string

	// The -config file's load_balancer and health_check blocks, before
	// flags are laid over them and ports resolved.
	fileLB     LBSpec
	fileHealth HealthSpec
}

// DefaultConfig is the configuration before flags and files apply.
func DefaultConfig() Config {
	return Config{
		TTL:         DefaultTTL,
		LockDelay:   DefaultLockDelay,
		Backoff:     DefaultMaxBackoff,
		KillSignal:  DefaultKillSignal,
		KillTimeout: DefaultKillTimeout,
	}
}

// Timing is the lease timing this config asks for.
func (c Config) Timing() lockclient.Timing {
	return lockclient.Timing{TTL: c.TTL, LockDelay: c.LockDelay, RenewInterval: c.Renew, MaxBackoff: c.Backoff}
}

// Validate checks everything that can be checked without Nomad.
func (c Config) Validate() error {
	errs := c.lockErrors()
	if (len(c.Command) == 0 && c.Gate == nil) || (len(c.Command) > 0 && c.Command[0] == "") {
		errs = append(errs, errors.New("missing command: give it after the lock path, or as command in -config"))
	}
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("wait %s must not be negative (0 waits forever)", c.Wait))
	}
	if c.KillTimeout < 0 {
		errs = append(errs, fmt.Errorf("kill timeout %s must not be negative", c.KillTimeout))
	}
	if c.MaxRetry < 0 {
		errs = append(errs, fmt.Errorf("max-retry %d must not be negative (0 retries until -wait ends)", c.MaxRetry))
	}
	if c.LB != nil {
		if err := c.LB.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("load balancer: %w", err))
		}
	}
	if c.KillSignal == syscall.SIGKILL || c.KillSignal == syscall.SIGSTOP {
		errs = append(errs, fmt.Errorf("kill signal %s cannot be handled by the workload; use SIGTERM, SIGINT or another catchable signal", c.KillSignal))
	}
	return errors.Join(errs...)
}

// validateLock checks what a command that runs nothing under the lock needs
// (`lock lb add` waits for the lock's holder): its path and lease timing.
func (c Config) validateLock() error { return errors.Join(c.lockErrors()...) }

// lockErrors are what is wrong with the lock path and the lease timing.
func (c Config) lockErrors() []error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("missing lock path: give it as the first argument or as lock.path in -config"))
	} else if err := lockclient.ValidatePath(c.Path); err != nil {
		errs = append(errs, err)
	}
	if err := c.Timing().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// ParseDuration sets *dst from v, a Go duration such as "10s", for the
// setting named field (as the user wrote it, with its file or block). An
// empty v leaves *dst as it is, so the default stands. The error names the
// setting and shows the form to use, with example.
func ParseDuration(field, v, example string, dst *time.Duration) error {
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%s = %q is not a duration: use a number with a unit, e.g. %q", field, v, example)
	}
	*dst = d
	return nil
}

// ParseSignal accepts "SIGTERM", "TERM", "sigterm" or a number.
func ParseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig, ok := signalsByName[name]; ok {
		return sig, nil
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	return 0, fmt.Errorf("unknown signal %q: use a name like SIGTERM or SIGINT", s)
}

var signalsByName = map[string]syscall.Signal{
	"SIGABRT": syscall.SIGABRT, "SIGALRM": syscall.SIGALRM, "SIGCONT": syscall.SIGCONT,
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGIO": syscall.SIGIO,
	"SIGKILL": syscall.SIGKILL, "SIGPIPE": syscall.SIGPIPE, "SIGPROF": syscall.SIGPROF,
	"SIGPWR": syscall.SIGPWR, "SIGQUIT": syscall.SIGQUIT, "SIGSTOP": syscall.SIGSTOP,
	"SIGSYS": syscall.SIGSYS, "SIGTERM": syscall.SIGTERM, "SIGTRAP": syscall.SIGTRAP,
	"SIGTSTP": syscall.SIGTSTP, "SIGTTIN": syscall.SIGTTIN, "SIGTTOU": syscall.SIGTTOU,
	"SIGURG": syscall.SIGURG, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGVTALRM": syscall.SIGVTALRM, "SIGWINCH": syscall.SIGWINCH, "SIGXCPU": syscall.SIGXCPU,
	"SIGXFSZ": syscall.SIGXFSZ,
}

// fileConfig is the -config HCL file. Its shape matches the driver's task
// config: command and args at the top, lock settings in a lock block.
type fileConfig struct {
	Command     string      `hcl:"command,optional"`
	Args        []string    `hcl:"args,optional"`
	Shell       *bool       `hcl:"shell,optional"`
	KillSignal  string      `hcl:"kill_signal,optional"`
	KillTimeout string      `hcl:"kill_timeout,optional"`
	Verbose     *bool       `hcl:"verbose,optional"`
	Lock        *fileLock   `hcl:"lock,block"`
	LB          *LBSpec     `hcl:"load_balancer,block"`
	Health      *HealthSpec `hcl:"health_check,block"`
}

type fileLock struct {
	Path        string `hcl:"path,optional"`
	Namespace   string `hcl:"namespace,optional"`
	TTL         string `hcl:"ttl,optional"`
	Delay       string `hcl:"delay,optional"`
	Renew       string `hcl:"renew,optional"`
	Wait        string `hcl:"wait,optional"`
	Backoff     string `hcl:"backoff,optional"`
	MaxRetry    *int   `hcl:"max_retry,optional"`
	EarlyReturn *bool  `hcl:"early_return,optional"`
	// UpstreamPort is Config.UpstreamPort.
	UpstreamPort string `hcl:"upstream_port,optional"`
}

// loadFile applies an HCL config file on top of c.
func loadFile(c *Config, path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read -config file: %w", err)
	}
	return applyHCL(c, src, path)
}

// applyHCL decodes src (named filename in messages) onto c. Unknown keys,
// wrong types and bad durations are errors with file:line.
func applyHCL(c *Config, src []byte, filename string) error {
	file, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return fmt.Errorf("parse %s: %s", filename, diagText(diags))
	}
	var fc fileConfig
	if diags := gohcl.DecodeBody(file.Body, nil, &fc); diags.HasErrors() {
		return fmt.Errorf("decode %s: %s", filename, diagText(diags))
	}
	var errs []error
	dur := func(field, s string, dst *time.Duration) {
		if err := ParseDuration(filename+": "+field, s, "10s", dst); err != nil {
			errs = append(errs, err)
		}
	}
	if fc.Command != "" {
		c.Command = append([]string{fc.Command}, fc.Args...)
	} else if len(fc.Args) > 0 {
		errs = append(errs, fmt.Errorf("%s: args given without command", filename))
	}
	if fc.Shell != nil {
		c.Shell = *fc.Shell
	}
	if fc.Verbose != nil {
		c.Verbose = *fc.Verbose
	}
	if fc.KillSignal != "" {
		sig, err := ParseSignal(fc.KillSignal)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: kill_signal: %w", filename, err))
		}
		c.KillSignal, c.KillSignalSet = sig, true
	}
	dur("kill_timeout", fc.KillTimeout, &c.KillTimeout)
	if fc.LB != nil {
		c.fileLB = *fc.LB
	}
	if fc.Health != nil {
		c.fileHealth = *fc.Health
	}
	if l := fc.Lock; l != nil {
		if l.Path != "" {
			c.Path = l.Path
		}
		if l.Namespace != "" {
			c.Namespace = l.Namespace
		}
		dur("lock.ttl", l.TTL, &c.TTL)
		dur("lock.delay", l.Delay, &c.LockDelay)
		dur("lock.renew", l.Renew, &c.Renew)
		dur("lock.wait", l.Wait, &c.Wait)
		dur("lock.backoff", l.Backoff, &c.Backoff)
		if l.MaxRetry != nil {
			c.MaxRetry = *l.MaxRetry
		}
		if l.UpstreamPort != "" {
			c.UpstreamPort = l.UpstreamPort
		}
		if l.EarlyReturn != nil {
			c.EarlyReturn = *l.EarlyReturn
		}
	}
	return errors.Join(errs...)
}

func diagText(diags hcl.Diagnostics) string {
	var parts []string
	for _, d := range diags {
		msg := d.Summary
		if d.Detail != "" {
			msg += ": " + d.Detail
		}
		if d.Subject != nil {
			msg = d.Subject.String() + ": " + msg
		}
		parts = append(parts, msg)
	}
	return strings.Join(parts, "; ")
}

// errHelp means -h or -help was given; usage has been printed.
var errHelp = flag.ErrHelp

// parseRunArgs parses `lock [flags] <path> <command> [args...]`. Flags given
// on the command line override the -config file.
func parseRunArgs(args []string, stderr io.Writer) (Config, error) {
	c := DefaultConfig()
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

	if rf.configFile != "" {
		if err := loadFile(&c, rf.configFile); err != nil {
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
	lb, err := BuildLoadBalancer(mergeLB(c.fileLB, rf.lb), mergeHealth(c.fileHealth, rf.health), os.Getenv, "")
	if err != nil {
		return c, err
	}
	c.LB = lb
	if err := c.resolveUpstream(os.Getenv); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// runFlags are the flags of `lock`: the lock settings are parsed into cli,
// and laid over the -config file (apply) only where given.
type runFlags struct {
	fs                            *flag.FlagSet
	configFile, killSignal, token string
	cli                           Config
	lb                            LBSpec
	health                        HealthSpec
}

func newRunFlags(stderr io.Writer) *runFlags {
	rf := &runFlags{fs: flag.NewFlagSet("lock", flag.ContinueOnError)}
	fs, cli := rf.fs, &rf.cli
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageText) }

	lbFlags(fs, &rf.lb, &rf.health)
	fs.DurationVar(&cli.TTL, "ttl", DefaultTTL, "")
	fs.DurationVar(&cli.LockDelay, "delay", DefaultLockDelay, "")
	fs.DurationVar(&cli.Renew, "renew", 0, "")
	fs.DurationVar(&cli.Wait, "wait", 0, "")
	fs.BoolVar(&cli.EarlyReturn, "early-return", false, "")
	fs.StringVar(&cli.UpstreamPort, "upstream-port", "", "")
	fs.IntVar(&cli.MaxRetry, "max-retry", 0, "")
	fs.DurationVar(&cli.Backoff, "backoff", DefaultMaxBackoff, "")
	fs.BoolVar(&cli.Shell, "shell", false, "")
	fs.BoolVar(&cli.Verbose, "verbose", false, "")
	fs.StringVar(&rf.killSignal, "kill-signal", "", "")
	fs.DurationVar(&cli.KillTimeout, "kill-timeout", DefaultKillTimeout, "")
	fs.StringVar(&rf.configFile, "config", "", "")
	fs.StringVar(&cli.Namespace, "namespace", "", "")
	fs.StringVar(&cli.Address, "address", "", "")
	fs.StringVar(&rf.token, "token", "", "")
	return rf
}

// apply sets in c the lock settings given on the command line.
func (rf *runFlags) apply(c *Config) error {
	cli := rf.cli
	var flagErr error
	rf.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "ttl":
			c.TTL = cli.TTL
		case "delay":
			c.LockDelay = cli.LockDelay
		case "renew":
			c.Renew = cli.Renew
		case "wait":
			c.Wait = cli.Wait
		case "early-return":
			c.EarlyReturn = cli.EarlyReturn
		case "upstream-port":
			c.UpstreamPort = cli.UpstreamPort
		case "max-retry":
			c.MaxRetry = cli.MaxRetry
		case "backoff":
			c.Backoff = cli.Backoff
		case "shell":
			c.Shell = cli.Shell
		case "verbose":
			c.Verbose = cli.Verbose
		case "kill-timeout":
			c.KillTimeout = cli.KillTimeout
		case "namespace":
			c.Namespace = cli.Namespace
		case "address":
			c.Address = cli.Address
		case "kill-signal":
			sig, err := ParseSignal(rf.killSignal)
			if err != nil {
				flagErr = fmt.Errorf("-kill-signal: %w", err)
			}
			c.KillSignal, c.KillSignalSet = sig, true
		}
	})
	return flagErr
}

// resolveUpstream sets Upstream from UpstreamPort and the task environment.
func (c *Config) resolveUpstream(getenv func(string) string) error {
	if c.UpstreamPort == "" {
		return nil
	}
	if c.LB != nil {
		return fmt.Errorf("-upstream-port %q: with a load balancer configured, lock records its upstream "+
			"(load_balancer.port %q) itself; drop -upstream-port", c.UpstreamPort, c.LB.PortLabel)
	}
	addr, err := PortAddress(c.UpstreamPort, getenv)
	if err != nil {
		return fmt.Errorf("-upstream-port: %w", err)
	}
	c.Upstream = addr
	return nil
}
