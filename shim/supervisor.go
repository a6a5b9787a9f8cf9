package shim

import (
	"context"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// State is where the supervisor is in its life:
// waiting → holding → stopping → released, with lost as the fault exit.
type State string

const (
	StateWaiting State = "waiting"
	StateHolding State = "holding"
	// StateHealthy and StateRegistered refine holding when a load balancer
	// is configured: the health check passed, then the LB added us.
	StateHealthy    State = "healthy"
	StateRegistered State = "registered"
	StateStopping   State = "stopping"
	StateReleased   State = "released"
	StateLost       State = "lost"
)

// Holds reports whether the supervisor holds the lock and runs the workload.
func (s State) Holds() bool {
	return s == StateHolding || s == StateHealthy || s == StateRegistered
}

// Event is one state change, or a renewal heartbeat (same State and Message,
// later deadlines), for logs, a status file or task events.
type Event struct {
	State   State
	Time    time.Time
	Path    string
	Fence   uint64            // holding and after
	Holder  lockclient.Holder // waiting: who holds the lock now
	Message string
	// Notice marks an event that is no change of state (an LB API that
	// does not answer, a re-add): State and the deadlines are the current
	// ones and Message is the notice. Show each notice once; the state's
	// own message still stands.
	Notice bool

	// Set while the lease is held: the watchdog kills the workload's group
	// if the supervisor has not acted on them.
	FenceDeadline time.Time
	StopDeadline  time.Time
	// LastRenew is when the last renew the server acknowledged (or the
	// acquire) was sent: the plugin, releasing for a crashed supervisor,
	// leaves the lock to expire from its release cutoff on. Like the
	// deadlines it is on CLOCK_BOOTTIME (lockclient.BootNanos).
	LastRenew    time.Time
	WorkloadPID  int
	WorkloadPGID int
}

// StopRequest asks the supervisor to stop the workload with Signal and give
// it Timeout before SIGKILL. The driver sends one for Nomad's StopTask, with
// the task's kill_signal and kill_timeout.
type StopRequest struct {
	Signal  syscall.Signal
	Timeout time.Duration
}

// Exit codes of the supervisor. A workload's own exit code passes through
// unchanged; death by signal N becomes 128+N, as in a shell.
const (
	ExitConfig      = 64  // bad flag, config file, TTL, path or command
	ExitInfra       = 69  // Nomad unreachable or failing, too many API errors (no socket or token is ExitConfig)
	ExitWaitTimeout = 75  // the lock was not acquired within -wait
	ExitLost        = 76  // the lock was lost while held; the workload was stopped
	ExitPermission  = 77  // HTTP 403: the token lacks write on the lock path
	ExitCannotExec  = 126 // the command exists but cannot be executed
	ExitNotFound    = 127 // the command was not found
)

// Supervisor runs one workload under one lock.
type Supervisor struct {
	Config  Config
	Locker  *lockclient.Locker
	Logger  hclog.Logger
	Observe func(Event) // optional

	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Env is the workload's base environment; nil means os.Environ().
	Env []string
	// Dir is the workload's working directory; "" keeps ours.
	Dir string
	// Credential runs the workload as another user; nil keeps ours.
	Credential *syscall.Credential
	// Stop delivers stop requests; nil means only SIGTERM/SIGINT stop.
	Stop <-chan StopRequest
	// Gate and WatchAlloc are the run's (Spec.Gate, Spec.WatchAlloc).
	Gate       *Gate
	WatchAlloc *AllocWatch
	// OnAcquire, if set, runs after the lock is acquired and before the
	// workload starts: the driver records the lease for a crash release.
	OnAcquire func(*lockclient.Lease)
	// OnReleaseTried, if set, runs once the supervisor has tried to release
	// the lock it held, with the release's error: nil when released or
	// already gone. The driver then drops the lease record, so the plugin's
	// crash release is left for supervisors that died holding, unless err
	// wraps lockclient.ErrIdentityRejected: the workload is proven dead but
	// the task's identity no longer authenticates (a purged job), and the
	// plugin may release with the operator's token (release_token_file). A
	// gate that is being stopped but cannot read its allocation for that
	// reason calls it with that error instead of releasing (gateMayRelease):
	// the plugin then asks Nomad with its own token.
	OnReleaseTried func(err error)
	// OnLBPosted runs before the ADD is sent, OnLBRemoved after our REMOVE
	// succeeded: the driver records the registration for a crash REMOVE.
	OnLBPosted  func(lbhook.Config, *lbhook.Hook, lbhook.UpstreamInfo)
	OnLBRemoved func()
	// Getenv reads the task environment (LB auth key); nil means os.Getenv.
	Getenv func(string) string
	// Tree, StartIn, Subreaper and RequireGuard place the workload's
	// process (see Process).
	Tree         Tree
	StartIn      func(start func() error) error
	Subreaper    bool
	RequireGuard bool

	workload Workload
	// hooks is the optional behaviour attached to the run (hooks.go).
	hooks []Hook
	// state and message are the last emitted, repeated by renew heartbeats.
	state   State
	message string
}

func (s *Supervisor) getenv(k string) string {
	if s.Getenv != nil {
		return s.Getenv(k)
	}
	return os.Getenv(k)
}

func (s *Supervisor) emit(ev Event) {
	ev.Time = time.Now()
	ev.Path = s.Config.Path
	s.state, s.message = ev.State, ev.Message
	if s.Observe != nil {
		s.Observe(ev)
	}
}

// notify publishes a notice (see Event.Notice) without changing the
// state or the message that renew heartbeats repeat.
func (s *Supervisor) notify(ev Event) {
	ev.Time, ev.Path, ev.Notice = time.Now(), s.Config.Path, true
	if s.Observe != nil {
		s.Observe(ev)
	}
}

// Run supervises until the workload is gone and the lock released, and
// returns the exit code. sigs delivers the signals the supervisor received.
//
// Its steps, in order: set up (the workload and the hooks the config asks
// for); take the lease (acquire: the hooks' checks first, then an adoption
// or the wait for the lock); the hooks' work once it is held (a gate waits
// for the previous holder's gated tasks); start the workload under the
// lease (start) and hold it (hold) until the workload exits, the lease is
// lost, a hook fails the run or a stop comes, each of which ends in
// shutdown: the PreKill hooks (LB REMOVE), stop, proof of death, release
// as the hooks allow.
func (s *Supervisor) Run(ctx context.Context, sigs <-chan os.Signal) int {
	s.setUp()
	lease, code, done := s.acquire(ctx, sigs)
	if done {
		return code
	}
	if !s.held(lease) {
		s.emit(Event{State: StateLost, Fence: lease.Fence, Message: lockLostMessage(lease.Err())})
		return ExitLost
	}
	r, code, started := s.start(lease)
	if !started {
		return code
	}
	return s.exitCode(r.end, r.hold(ctx, sigs))
}

// setUp readies the supervisor for Run: a logger, the workload, the hooks.
func (s *Supervisor) setUp() {
	if s.Logger == nil {
		s.Logger = hclog.NewNullLogger()
	}
	s.workload = s.newWorkload()
	s.buildHooks()
}

// newWorkload is the run's workload: its command, a gate's gated tasks, or
// both.
func (s *Supervisor) newWorkload() Workload {
	p := Process{Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr, Env: s.Env, Dir: s.Dir, Credential: s.Credential,
		Tree: s.Tree, StartIn: s.StartIn, Subreaper: s.Subreaper, RequireGuard: s.RequireGuard}
	switch g := s.Gate; {
	case g != nil && len(s.Config.Command) > 0:
		g.log = s.Logger
		return pairWorkload{newProcessWorkload(s.Config, p, s.Logger), g}
	case g != nil:
		g.log = s.Logger
		return g
	}
	return newProcessWorkload(s.Config, p, s.Logger)
}

// held runs the hooks' work once the lease is held, before the workload
// starts: false when the lease was lost meanwhile.
func (s *Supervisor) held(lease *lockclient.Lease) bool {
	if s.OnAcquire != nil {
		s.OnAcquire(lease)
	}
	for _, h := range hooksOf[acquiredHook](s) {
		if !h.acquired(lease) {
			return false
		}
	}
	return true
}

// exitCode is the run's exit code once the hold ended with end, as the
// hooks may change it.
func (s *Supervisor) exitCode(end Ending, code int) int {
	for _, h := range hooksOf[exitHook](s) {
		code = h.exitCode(end, code)
	}
	return code
}

func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

func signalName(sig syscall.Signal) string {
	for name, s := range signalsByName {
		if s == sig {
			return name
		}
	}
	return "signal " + strconv.Itoa(int(sig))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
