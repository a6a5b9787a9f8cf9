package shim

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Defaults. Where they differ from `nomad var lock` docs/cli.md says why.
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
	// Holders, above 0, makes Path the prefix of a semaphore of that many
	// slots (lockclient.Config.Holders); AllocIndex is the holder's
	// allocation index, whose slot (AllocIndex mod Holders) it tries first.
	Holders    int
	AllocIndex int
	Address    string // NOMAD_ADDR override for use outside a task
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
	// UpdateGrace is how long a standby of an older job version gives way
	// to a newer one before it takes a lock that came free; 0: the default;
	// DurationOff (update_grace = 0): the rule is off, and a standby takes a
	// free lock at once, as before the rule.
	UpdateGrace time.Duration

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
	// WatchAlloc ends the wait for the lock when the run's allocation is
	// being stopped (the driver's start = "on_lock"); nil for none. A gate
	// watches its allocation anyway.
	WatchAlloc *AllocWatch
	// UpstreamPort is a Nomad port label (-upstream-port, lock.upstream_port)
	// whose host:port, Upstream, is recorded as the holder's upstream in the
	// lock's Items without any LB request of our own: for a `lock lb follow`
	// sidecar, whose next holder's ADD then swaps this upstream out of the
	// LB (even if we die without a REMOVE). With LB set, LB.Upstream is
	// recorded instead.
	UpstreamPort string
	Upstream     string
}

// DefaultConfig is the configuration before flags and files apply.
func DefaultConfig() Config {
	return Config{
		TTL:         DefaultTTL,
		LockDelay:   DefaultLockDelay,
		Backoff:     DefaultMaxBackoff,
		KillSignal:  DefaultKillSignal,
		KillTimeout: DefaultKillTimeout,
		UpdateGrace: DefaultUpdateGrace,
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

// ValidateLock checks what a command that runs nothing under the lock needs
// (`lock lb follow` follows the lock's holder, `lock status` reads it): its
// path and lease timing.
func (c Config) ValidateLock() error { return errors.Join(c.lockErrors()...) }

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
	switch {
	case c.Holders < 0 || c.Holders > lockclient.MaxHolders:
		errs = append(errs, fmt.Errorf("holders %d is out of range: a semaphore has 1 to %d holders (0: a single lock)",
			c.Holders, lockclient.MaxHolders))
	case c.Holders > 0 && c.Path != "":
		if err := lockclient.ValidatePath(lockclient.SlotPath(c.Path, c.Holders-1)); err != nil {
			errs = append(errs, fmt.Errorf("holders %d: the slot paths: %w", c.Holders, err))
		}
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
