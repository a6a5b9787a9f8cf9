package shim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"
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
	// Region and TLS reach Nomad outside a task, as Nomad's CLI flags
	// -region, -ca-cert, -ca-path, -client-cert, -client-key,
	// -tls-server-name and -tls-skip-verify do: each one given overrides its
	// NOMAD_* variable. The Task API socket uses neither.
	Region string
	TLS    api.TLSConfig
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

	// Mode is ModeLock (or "") or ModeLease; LeaseProfile and the Lease*
	// durations shape lease mode (see Heartbeat; 0 takes the profile's).
	Mode           string
	LeaseProfile   string
	LeaseInterval  time.Duration
	LeaseFence     time.Duration
	LeaseKillGrace time.Duration

	// LB registers the instance with a load balancer; nil for none.
	LB *LoadBalancer

	// UpstreamPort is a Nomad port label (-upstream-port, lock.upstream_port)
	// whose host:port, Upstream, is recorded as the holder's upstream in the
	// lock's Items without any LB request of our own: for a `lock lb follow`
	// sidecar, whose next holder's ADD then swaps this upstream out of the
	// LB (even if we die without a REMOVE). With LB set, LB.Upstream is
	// recorded instead.
	UpstreamPort string
	Upstream     string

	// WaitForPolicy makes an HTTP 403 on acquire a wait instead of exit 77
	// (the driver): the supervisor says in a task event which ACL policy
	// to apply, retries with backoff, and takes the lock as soon as the
	// policy is applied, without a restart of the task. Only a stop ends
	// the wait.
	WaitForPolicy bool
	// PluginReleases says that a plugin stands behind the supervisor (the
	// driver's) and releases with its own token what the task's identity
	// no longer can (a purged job): the supervisor leaves that to it.
	PluginReleases bool

	// HTTPAddr is where `lock` serves /metrics and /holder (-http-addr);
	// "" serves nothing.
	HTTPAddr string
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
		Mode:        ModeLock,
		// LeaseProfile: ProfileDefault; Lease*: the profile's.
		LeaseProfile: ProfileDefault,
	}
}

// Timing is the lease timing this config asks for. In lease mode renews
// default to every 2 s at most (they are not Raft writes): the standby's
// bound on the holder's last renew is then tighter (docs/lease.md).
func (c Config) Timing() lockclient.Timing {
	renew := c.Renew
	if renew == 0 && c.Mode == ModeLease {
		renew = min(c.TTL/2, LeaseRenew)
	}
	return lockclient.Timing{TTL: c.TTL, LockDelay: c.LockDelay, RenewInterval: renew, MaxBackoff: c.Backoff}
}

// LeaseMode reports whether the lock is in lease mode (docs/lease.md).
func (c Config) LeaseMode() bool { return c.Mode == ModeLease }

// Lock modes and lease profiles (config.lock.mode, config.lock.lease_profile).
const (
	ModeLock          = "lock"
	ModeLease         = "lease"
	ProfileDefault    = "default"
	ProfileAggressive = "aggressive"
	// LeaseRenew is the longest default renew interval in lease mode.
	LeaseRenew = 2 * time.Second
)

// heartbeat is lease mode's heartbeat for this config: the profile's
// timings with the lease_* settings over them, at the lock's heartbeat and
// escrow paths; a gate's lease_kill_grace is at least GateLeaseKillGrace.
// nil outside lease mode. Spec.Heartbeat is the run's.
func (c Config) heartbeat(gate bool) *lockclient.Heartbeat {
	if c.Mode != ModeLease {
		return nil
	}
	hb := lockclient.DefaultHeartbeat
	if c.LeaseProfile == ProfileAggressive {
		hb = lockclient.AggressiveHeartbeat
	}
	hb.Path, hb.EscrowPath = lockclient.HeartbeatPathFor(c.Path), lockclient.EscrowPathFor(c.Path)
	if c.LeaseInterval != 0 {
		hb.Interval = c.LeaseInterval
	}
	if c.LeaseFence != 0 {
		hb.Fence = c.LeaseFence
	}
	if c.LeaseKillGrace != 0 {
		hb.KillGrace = c.LeaseKillGrace
	}
	if gate {
		// A gate kills its gated tasks without grace, but its kill needs
		// time of its own (GateLeaseKillGrace): a profile's shorter K is
		// raised, and L with it.
		hb.KillGrace = max(hb.KillGrace, GateLeaseKillGrace)
	}
	return &hb
}

// GateLeaseKillGrace is a gate's least lease_kill_grace (K). On a heartbeat
// fence a gate freezes and SIGKILLs its gated tasks at once and proves them
// dead (docker pause, kill and inspect; a cgroup's freeze or cgroup.kill):
// well under a second on a healthy node. If its supervisor is stuck, the
// plugin's watchdog does the same 300 ms (its grace for a lease-mode gate)
// past the fence deadline. K covers both.
const GateLeaseKillGrace = 2 * time.Second

// leaseErrors are what is wrong with the lock mode and lease settings.
func (c Config) leaseErrors(gate bool) []error {
	var errs []error
	switch c.Mode {
	case "", ModeLock, ModeLease:
	default:
		errs = append(errs, fmt.Errorf("config.lock.mode = %q: use %q (the Nomad lock alone) or %q (docs/lease.md)", c.Mode, ModeLock, ModeLease))
	}
	switch c.LeaseProfile {
	case "", ProfileDefault, ProfileAggressive:
	default:
		errs = append(errs, fmt.Errorf("config.lock.lease_profile = %q: use %q (takeover after 9s) or %q (after 4s; any heartbeat outage "+
			"longer than 2s, such as a Nomad leader election, fences the holder)", c.LeaseProfile, ProfileDefault, ProfileAggressive))
	}
	if c.Mode != ModeLease {
		if (c.LeaseProfile != "" && c.LeaseProfile != ProfileDefault) || c.LeaseInterval != 0 || c.LeaseFence != 0 || c.LeaseKillGrace != 0 {
			errs = append(errs, errors.New(`config.lock.lease_* settings apply to lease mode only: add mode = "lease" to the lock block, or remove them`))
		}
		return errs
	}
	if c.Holders > 0 {
		errs = append(errs, errors.New(`config.lock.mode = "lease" with holders (a semaphore) is not supported: use a single lock`))
	}
	if gate && c.LeaseKillGrace != 0 && c.LeaseKillGrace < GateLeaseKillGrace {
		errs = append(errs, fmt.Errorf(`config.lock.lease_kill_grace = %s is below a gate's minimum of %s: a gate's kill of its gated tasks, `+
			`or the plugin's watchdog's if the gate is stuck, must fit in it; raise lease_kill_grace or remove it (docs/gate.md)`,
			c.LeaseKillGrace, GateLeaseKillGrace))
	}
	if c.Path != "" && len(errs) == 0 {
		if err := c.heartbeat(gate).Validate(c.Timing()); err != nil {
			errs = append(errs, fmt.Errorf("config.lock: %w", err))
		}
	}
	return errs
}

// Validate checks everything that can be checked without Nomad, for a run
// of lock (Spec.Validate checks a driver's task).
func (c Config) Validate() error { return c.validate(false) }

// validate is Validate for a run that is a gate, or not: a gate needs no
// command of its own.
func (c Config) validate(gate bool) error {
	errs := c.lockErrors(gate)
	if (len(c.Command) == 0 && !gate) || (len(c.Command) > 0 && c.Command[0] == "") {
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
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("http-addr %q: %w; give host:port, e.g. 127.0.0.1:9465", c.HTTPAddr, err))
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
func (c Config) ValidateLock() error { return errors.Join(c.lockErrors(false)...) }

// lockErrors are what is wrong with the lock path and the lease timing.
func (c Config) lockErrors(gate bool) []error {
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
	return append(errs, c.leaseErrors(gate)...)
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

// signalCode is the exit code of a run ended by sig (128 + its number).
func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// signalName names sig as kill_signal would.
func signalName(sig syscall.Signal) string {
	for name, s := range signalsByName {
		if s == sig {
			return name
		}
	}
	return "signal " + strconv.Itoa(int(sig))
}
