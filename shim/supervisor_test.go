package shim

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// Tests of Supervisor.Run with a real workload under a real lease, whose
// lock API is in memory (locktest) so that the server's answers are the
// test's to choose. They check what a user would notice: when the workload
// starts, how it is stopped, the exit code, and that the lock is never
// given up while the workload lives.

// ceiling bounds every wait: nothing comes near it when the code is right.
const ceiling = 5 * time.Second

// Workloads. Each reports its start with the fence it was given.
const (
	sleeper = `echo "started fence=$NOMAD_LOCK_FENCE"; exec sleep 30`
	// deaf ignores SIGTERM (an ignored signal stays ignored across exec).
	deaf = `trap '' TERM; echo "started fence=$NOMAD_LOCK_FENCE"; exec sleep 30`
	// leaver exits 3 on SIGUSR1.
	leaver = `trap 'echo "got USR1"; exit 3' USR1; echo "started fence=$NOMAD_LOCK_FENCE"; while :; do sleep 0.02; done`
)

// runRig is a Supervisor running script over a locktest.Server: the run's
// spec and env are the test's to change until run attaches them.
type runRig struct {
	t    *testing.T
	srv  *locktest.Server
	sup  *Supervisor
	spec Spec
	env  Env
	out  *proctest.SyncBuffer
	stop chan StopRequest
	code chan int

	mu       sync.Mutex
	events   []Event
	releases []bool // at each release request: was the workload alive?
}

func newRunRig(t *testing.T, script string, killTimeout time.Duration) *runRig {
	t.Helper()
	r := &runRig{t: t, srv: locktest.New(), out: &proctest.SyncBuffer{}, stop: make(chan StopRequest, 1), code: make(chan int, 1)}
	cfg := lockclient.Config{Path: "locks/web", Timing: locktest.Timing(), Holder: lockclient.Holder{AllocID: "alloc-self"}}
	r.spec = Spec{Config: Config{Path: cfg.Path, Command: []string{"/bin/sh", "-c", script},
		KillSignal: syscall.SIGTERM, KillTimeout: killTimeout}, Holder: cfg.Holder}
	r.sup = &Supervisor{Locker: r.srv.Locker(t, cfg), Observe: r.observe, Stop: r.stop}
	r.env = Env{Process: Process{Stdout: r.out, Stderr: r.out, Env: []string{"PATH=/usr/bin:/bin"}},
		Allocs: r.srv.Allocs(t, allocs.Config{Holder: cfg.Holder})}
	r.watchReleases()
	return r
}

// watchReleases records, at each release request to r.srv, whether the
// workload was alive.
func (r *runRig) watchReleases() {
	r.srv.OnRelease(func() {
		alive := r.workloadAlive()
		r.mu.Lock()
		r.releases = append(r.releases, alive)
		r.mu.Unlock()
	})
}

func (r *runRig) observe(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

// attach builds the supervisor's workload and hooks from the rig's spec
// and env, as the front ends do.
func (r *runRig) attach() {
	r.t.Helper()
	attached(r.t, r.sup, r.spec, r.env)
}

// attached is sup with its config, workload and hooks from spec and env.
func attached(t *testing.T, sup *Supervisor, spec Spec, env Env) *Supervisor {
	t.Helper()
	sup.Config = spec.Config
	env.Locker, env.Emitter = sup.Locker, sup
	w, hooks, err := Attach(spec, env)
	if err != nil {
		t.Fatal(err)
	}
	sup.Workload, sup.Hooks = w, hooks
	return sup
}

// onHeld is a Held hook of the test's.
type onHeld func(*lockclient.Lease)

func (onHeld) Name() string { return "test" }
func (f onHeld) Held(_ context.Context, l *lockclient.Lease) error {
	f(l)
	return nil
}

// run starts Run; at cleanup a Run still going is stopped with SIGKILL.
func (r *runRig) run() {
	r.attach()
	go func() { r.code <- r.sup.Run(context.Background(), make(chan os.Signal)) }()
	r.t.Cleanup(func() {
		select {
		case code := <-r.code:
			r.code <- code
		default:
			r.stop <- StopRequest{Signal: syscall.SIGKILL}
			select {
			case <-r.code:
			case <-time.After(2 * ceiling):
				r.t.Errorf("Run did not end after a SIGKILL stop request")
			}
		}
	})
}

// exit waits for Run's exit code.
func (r *runRig) exit() int {
	r.t.Helper()
	select {
	case code := <-r.code:
		r.code <- code
		return code
	case <-time.After(ceiling):
		r.t.Fatalf("Run still going after %s; events:\n%s", ceiling, r.eventLog())
		return 0
	}
}

// event waits for an event ok accepts.
func (r *runRig) event(what string, ok func(Event) bool) Event {
	r.t.Helper()
	deadline := time.Now().Add(ceiling)
	for {
		if ev, found := r.find(ok); found {
			return ev
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s event within %s; events:\n%sworkload output: %q", what, ceiling, r.eventLog(), r.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (r *runRig) find(ok func(Event) bool) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.events {
		if ok(ev) {
			return ev, true
		}
	}
	return Event{}, false
}

func (r *runRig) eventLog() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, ev := range r.events {
		fmt.Fprintf(&b, "  %s %s %q\n", ev.Time.Format("15:04:05.000"), ev.State, ev.Message)
	}
	return b.String()
}

func inState(s State) func(Event) bool { return func(ev Event) bool { return ev.State == s } }

// holding waits for the workload to run under the lease and returns its
// PID; it checks that the workload got the fence the server granted.
func (r *runRig) holding() int {
	r.t.Helper()
	ev := r.event("holding", inState(StateHolding))
	fence, _ := r.srv.LastGrant()
	if ev.Fence != fence || fence == 0 {
		r.t.Fatalf("holding fence %d, the server granted %d", ev.Fence, fence)
	}
	want := "started fence=" + strconv.FormatUint(fence, 10)
	r.waitOutput(want)
	return ev.WorkloadPID
}

func (r *runRig) waitOutput(want string) {
	r.t.Helper()
	deadline := time.Now().Add(ceiling)
	for !strings.Contains(r.out.String(), want) {
		if time.Now().After(deadline) {
			r.t.Fatalf("workload output %q lacks %q", r.out.String(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// workloadAlive reports whether the workload's process is alive (not
// gone, not a zombie).
func (r *runRig) workloadAlive() bool {
	ev, ok := r.find(inState(StateHolding))
	if !ok {
		return false
	}
	st, err := procfs.Read(ev.WorkloadPID)
	return err == nil && !st.Gone()
}

// checkReleasesAfterDeath fails if a release request came while the
// workload was alive; want says how many there must be at least.
func (r *runRig) checkReleasesAfterDeath(want int) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.releases) < want {
		r.t.Errorf("%d release requests, want at least %d", len(r.releases), want)
	}
	for i, alive := range r.releases {
		if alive {
			r.t.Errorf("release request %d came while the workload was alive", i+1)
		}
	}
}

// The workload starts only once the lock is ours: not while another holder
// has it, nor during the lock delay after that holder's lock expired; and
// it runs with the fence the server granted.
func TestRunStartsWorkloadOnlyOnceAcquired(t *testing.T) {
	const lockDelay = 300 * time.Millisecond
	tests := []struct {
		name string
		free func(*locktest.Server) // ends the other holder's lock
		// earliest is how long after free the lock may be ours.
		earliest time.Duration
	}{
		{"released by its holder", (*locktest.Server).Free, 0},
		{"expired, after the lock delay", (*locktest.Server).Expire, lockDelay},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunRig(t, sleeper, time.Second)
			r.srv.TakeOver(lockDelay)
			r.run()
			// Until the lock is freed: a report that it is held elsewhere,
			// and no workload.
			first := r.event("waiting on the other holder (or holding)", func(ev Event) bool {
				return ev.State.Holds() || ev.State == StateWaiting && ev.Holder.AllocID == locktest.OtherAlloc &&
					strings.Contains(ev.Message, "held by alloc 0th3r000 on "+locktest.OtherNode)
			})
			if out := r.out.String(); first.State.Holds() || out != "" {
				t.Fatalf("while the lock is held elsewhere: %s event, workload output %q", first.State, out)
			}
			freed := time.Now()
			tc.free(r.srv)
			r.holding()
			if _, at := r.srv.LastGrant(); at.Sub(freed) < tc.earliest {
				t.Errorf("lock granted %s after it was freed, within the lock delay %s", at.Sub(freed), tc.earliest)
			}
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
			if code := r.exit(); code != 128+int(syscall.SIGTERM) {
				t.Errorf("exit %d after a stop, want %d", code, 128+int(syscall.SIGTERM))
			}
		})
	}
}

// A lost lease stops the workload (with the kill signal, then SIGKILL after
// kill_timeout if it stays), Run exits ExitLost, and the lock is given up
// only once the workload is dead: a holder whose renews are refused while
// the server still records it keeps the lock from everyone else until then.
// expiredUnderUs is the server refusing our renews (409 "attempting to
// modify locked variable") because it expired the lock: the variable no
// longer holds it.
func expiredUnderUs(s *locktest.Server) {
	s.FailRenew(locktest.Error(409, "attempting to modify locked variable"))
	s.Expire()
}

func TestRunLeaseLost(t *testing.T) {
	tests := []struct {
		name   string
		script string
		lose   func(*locktest.Server)
		// otherHolds: the lock ends with another holder, not free.
		otherHolds bool
		// killed: the workload stays until SIGKILL, after kill_timeout.
		killed bool
	}{
		{"taken by another holder", sleeper, func(s *locktest.Server) { s.TakeOver(time.Second) }, true, false},
		{"renew refused", sleeper, expiredUnderUs, false, false},
		{"renew refused, kill signal ignored", deaf, expiredUnderUs, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const killTimeout = 200 * time.Millisecond
			r := newRunRig(t, tc.script, killTimeout)
			r.run()
			pid := r.holding()
			tc.lose(r.srv)
			lost := r.event("lost", inState(StateLost))
			if !strings.HasPrefix(lost.Message, "Lock lost: ") {
				t.Errorf("lost event %q", lost.Message)
			}
			if code := r.exit(); code != ExitLost {
				t.Errorf("exit %d, want ExitLost (%d)", code, ExitLost)
			}
			if took := time.Since(lost.Time); tc.killed && took < killTimeout {
				t.Errorf("Run ended %s after the loss: the workload was killed before kill_timeout %s", took, killTimeout)
			}
			if !waitDead(pid, 0) {
				t.Errorf("workload %d alive after Run returned", pid)
			}
			if _, ok := r.find(func(ev Event) bool {
				return ev.State == StateStopping && ev.Message == "Stopping workload with SIGTERM"
			}); !ok {
				t.Errorf("the workload was not sent its kill signal; events:\n%s", r.eventLog())
			}
			r.checkReleasesAfterDeath(1)
			if held := r.srv.Held(); held != tc.otherHolds {
				t.Errorf("lock held at the end: %v, want %v (%s)", held, tc.otherHolds, r.srv)
			}
		})
	}
}

// A new Nomad leader refuses renews (409) until it has restored its lock
// timers, while the variable still holds our lock, unchanged: the holder
// keeps the lock and its workload, and renews again once the leader does.
func TestRunRenewRefusedByNewLeader(t *testing.T) {
	r := newRunRig(t, sleeper, 200*time.Millisecond)
	r.run()
	pid := r.holding()
	waitCalls := func(op string, n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); r.srv.Calls(op) < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d %s requests after 5s, want %d (%s)", r.srv.Calls(op), op, n, r.srv)
			}
		}
	}
	r.srv.FailRenew(locktest.Error(409, "attempting to modify locked variable"))
	waitCalls(locktest.OpRenew, r.srv.Calls(locktest.OpRenew)+3)
	r.srv.FailRenew(nil)
	waitCalls(locktest.OpRenew, r.srv.Calls(locktest.OpRenew)+2)
	if ev, ok := r.find(inState(StateLost)); ok {
		t.Fatalf("lost on a renew the new leader refused: %q; events:\n%s", ev.Message, r.eventLog())
	}
	if !r.workloadAlive() {
		t.Fatalf("workload %d gone; events:\n%s", pid, r.eventLog())
	}
	if !r.srv.Held() {
		t.Fatalf("lock not held: %s", r.srv)
	}
}

// A stop request sends the workload its kill_signal, then SIGKILL once
// kill_timeout has passed, and the lock is released once it is dead; Run
// exits with the workload's status.
func TestRunStopRequest(t *testing.T) {
	tests := []struct {
		name   string
		script string
		stop   StopRequest
		code   int
		output string // the workload printed it on the kill signal
		killed bool   // it had to be SIGKILLed after stop.Timeout
	}{
		{"workload exits on its kill signal", leaver, StopRequest{Signal: syscall.SIGUSR1, Timeout: ceiling}, 3, "got USR1", false},
		{"workload ignores it until SIGKILL", deaf, StopRequest{Signal: syscall.SIGTERM, Timeout: 300 * time.Millisecond}, 128 + int(syscall.SIGKILL), "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunRig(t, tc.script, time.Second)
			r.run()
			pid := r.holding()
			sent := time.Now()
			r.stop <- tc.stop
			code := r.exit()
			took := time.Since(sent)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if tc.output != "" {
				r.waitOutput(tc.output)
			}
			if tc.killed && took < tc.stop.Timeout {
				t.Errorf("killed %s after the stop request, before kill_timeout %s", took, tc.stop.Timeout)
			}
			if !tc.killed && took >= tc.stop.Timeout {
				t.Errorf("stopped after %s: it waited out kill_timeout", took)
			}
			if !waitDead(pid, 0) {
				t.Errorf("workload %d alive after Run returned", pid)
			}
			r.event("released", inState(StateReleased))
			r.checkReleasesAfterDeath(1)
			if r.srv.Held() {
				t.Errorf("lock still held after Run: %s", r.srv)
			}
		})
	}
}

// A release the server refuses or cannot answer is reported in an event,
// and Run still ends in bounded time: the lock is left to expire.
func TestRunReleaseFailure(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"release answered 5xx", locktest.Error(500, "rpc error: no leader")},
		{"release refused", locktest.Error(403, "Permission denied")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunRig(t, sleeper, time.Second)
			r.srv.FailRelease(tc.err)
			r.run()
			pid := r.holding()
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
			if code := r.exit(); code != 128+int(syscall.SIGTERM) {
				t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
			}
			if !waitDead(pid, 0) {
				t.Errorf("workload %d alive after Run returned", pid)
			}
			ev, ok := r.find(func(ev Event) bool {
				return ev.State == StateStopping && strings.Contains(ev.Message, "not released")
			})
			if !ok {
				t.Fatalf("the failed release was not reported; events:\n%s", r.eventLog())
			}
			if !strings.Contains(ev.Message, "expires on the server") {
				t.Errorf("the release failure does not say the lock expires by itself: %q", ev.Message)
			}
			if _, ok := r.find(inState(StateReleased)); ok {
				t.Errorf("a released event after a failed release; events:\n%s", r.eventLog())
			}
			r.checkReleasesAfterDeath(1)
		})
	}
}

// With WaitForPolicy (the driver), a lock denied by ACLs (HTTP 403) is a
// wait: an event names the policy to apply, and the lock is taken as soon
// as the server grants it, without a restart. Without it (`lock`), 77.
func TestRunLockDeniedWaitsForPolicy(t *testing.T) {
	t.Run("driver waits", func(t *testing.T) {
		r := newRunRig(t, sleeper, time.Second)
		r.spec.WaitForPolicy = true
		r.srv.FailAcquire(locktest.Error(403, "Permission denied"))
		r.run()
		ev := r.event("denied", func(ev Event) bool {
			return ev.State == StateWaiting && strings.Contains(ev.Message, "Lock denied (HTTP 403)")
		})
		for _, want := range []string{`path "locks/web"`, `capabilities = ["write", "read"]`, "nomad acl policy apply -namespace default -job "} {
			if !strings.Contains(ev.Message, want) {
				t.Errorf("the denied event does not name the fix (%q): %q", want, ev.Message)
			}
		}
		r.srv.FailAcquire(nil)
		r.holding()
		r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		r.exit()
	})
	t.Run("stop ends the wait", func(t *testing.T) {
		r := newRunRig(t, sleeper, time.Second)
		r.spec.WaitForPolicy = true
		r.srv.FailAcquire(locktest.Error(403, "Permission denied"))
		r.run()
		r.event("denied", func(ev Event) bool { return strings.Contains(ev.Message, "Lock denied (HTTP 403)") })
		r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
		if code := r.exit(); code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
		}
	})
	t.Run("lock exits 77", func(t *testing.T) {
		r := newRunRig(t, sleeper, time.Second)
		r.srv.FailAcquire(locktest.Error(403, "Permission denied"))
		r.run()
		if code := r.exit(); code != ExitPermission {
			t.Errorf("exit %d, want %d", code, ExitPermission)
		}
	})
}

// A lease lost between the acquire and the workload's start (lease mode's
// first heartbeat, or a hook, can outlast the fence) never starts the
// workload: Run exits ExitLost with a lost event, and nothing ran.
func TestRunNeverStartsOnALostLease(t *testing.T) {
	r := newRunRig(t, sleeper, ceiling)
	r.env.Hooks = []Hook{onHeld(func(l *lockclient.Lease) {
		expiredUnderUs(r.srv)
		select {
		case <-l.Lost():
		case <-time.After(ceiling):
			t.Errorf("the lease was not lost within %s of the expiry", ceiling)
		}
	})}
	r.run()
	if code := r.exit(); code != ExitLost {
		t.Errorf("Run = %d, want ExitLost (%d); events:\n%s", code, ExitLost, r.eventLog())
	}
	r.event("lost", inState(StateLost))
	if _, ok := r.find(inState(StateHolding)); ok || strings.Contains(r.out.String(), "started") {
		t.Fatalf("the workload started on a lost lease; output %q, events:\n%s", r.out.String(), r.eventLog())
	}
}
