package shim

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
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

// Supervisor runs one workload under one lock: the core of the run's life
// cycle, over a Workload and hooks (Attach builds both from a Spec).
type Supervisor struct {
	Config   Config
	Locker   *lockclient.Locker
	Workload Workload
	// Hooks take part in the phases they implement, in this order (see
	// phases.go).
	Hooks   []Hook
	Logger  hclog.Logger
	Observe func(Event) // optional
	// Stop delivers stop requests; nil means only SIGTERM/SIGINT stop.
	Stop <-chan StopRequest

	// state and message are the last emitted, repeated by renew heartbeats.
	state   State
	message string
}

// Emit publishes ev, a change of state or message (the hooks' Emitter).
func (s *Supervisor) Emit(ev Event) {
	ev.Time = time.Now()
	ev.Path = s.Config.Path
	s.state, s.message = ev.State, ev.Message
	s.observe(ev)
}

// observe passes ev to Observe.
func (s *Supervisor) observe(ev Event) {
	if s.Observe != nil {
		s.Observe(ev)
	}
}

// Notice publishes a notice (see Event.Notice) without changing the
// state or the message that renew heartbeats repeat.
func (s *Supervisor) Notice(ev Event) {
	ev.Time, ev.Path, ev.Notice = time.Now(), s.Config.Path, true
	s.observe(ev)
}

// Run supervises until the workload is gone and the lock released, and
// returns the exit code. sigs delivers the signals the supervisor received.
//
// The life cycle, in order (see phases.go): take the lease (acquire: the
// PreAcquire hooks, then a lease they took over or the wait for the
// lock); the Held hooks; start the workload under the lease (start) and
// hold it (hold) until it exits, the lease is lost, a hook fails the run
// or a stop comes, each of which ends in shutdown: the PreKill hooks, the
// stop, the proof of death, the release as the Release hooks allow. A
// hook's step-down ends the hold the same way, and the run, its workload
// proven dead and the lock released, waits for the lock again, as a
// standby: the workload starts again only once it holds the lock again.
func (s *Supervisor) Run(ctx context.Context, sigs <-chan os.Signal) int {
	if s.Logger == nil {
		s.Logger = hclog.NewNullLogger()
	}
	for {
		lease, code, done := s.acquire(ctx, sigs)
		if done {
			return code
		}
		if err := s.held(ctx, lease); err != nil {
			s.Emit(Event{State: StateLost, Fence: lease.Fence, Message: lockLostMessage(lease.Err())})
			return ExitLost
		}
		r, code, started := s.start(lease)
		if !started {
			return code
		}
		code = r.hold(ctx, sigs)
		if !r.again {
			return r.exitCode(code)
		}
		s.Logger.Info("stepped down: waiting for the lock again")
	}
}

// held runs the Held hooks: an error means the lease ended meanwhile.
func (s *Supervisor) held(ctx context.Context, lease *lockclient.Lease) error {
	for _, h := range hooksOf[HeldHook](s) {
		if err := h.Held(ctx, lease); err != nil {
			return err
		}
	}
	return nil
}

// hooksOf lists the hooks of s that implement T, in order.
func hooksOf[T Hook](s *Supervisor) []T {
	var out []T
	for _, h := range s.Hooks {
		if t, ok := h.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
