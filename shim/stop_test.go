package shim

import (
	"cmp"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// flusher takes flush to stop after SIGTERM (a database writing its
// buffers), then exits 0; a SIGKILL before then shows as exit 137.
func flusher(flush time.Duration) string {
	return `trap 'echo flushing; sleep ` + flush.String() + `; echo flushed; exit 0' TERM; echo "started fence=$NOMAD_LOCK_FENCE"; while :; do sleep 0.05; done`
}

// The full grace of a graceful stop, with the TTL at Nomad's least (10 s):
// the lease is lost 9 s after its last renew (its fence deadline) and its
// workload must then be gone 19 s after it (2×TTL less the fence margin).
// The stop asks for 25 s and the workload flushes for 21 s, past that cut.
//
// Renews that time out on a loaded machine lose the lease while the lock is
// still ours on the server. The supervisor says so, renews the lock again
// once Nomad answers, and the workload keeps its whole kill_timeout: it
// ends its flush, and the lock is released only then. When the renews keep
// failing, or Nomad says the lock is someone else's, the grace is cut, and
// the events say why. Each case takes 10 to 25 s: the TTL cannot be shorter.
func TestGracefulStopKeepsItsKillTimeout(t *testing.T) {
	const (
		timeout = 25 * time.Second
		flush   = 21 * time.Second
		wait    = 45 * time.Second // bounds every wait: the cases end within 25 s
	)
	lostMsg := func(ev Event) bool { return strings.HasPrefix(ev.Message, "Lock lost while stopping the workload (") }
	for _, tc := range []struct {
		name string
		// fault is applied once the stop is under way; heal, if set, once
		// the loss is reported.
		fault, heal func(*locktest.Server)
		retries     bool // the loss says the lock is renewed again
		code        int
		cutSays     string // the SIGKILL event names the cause ("" for none)
		// timeout and flush, when set, replace the 25 s and 21 s.
		timeout, flush time.Duration
	}{
		{"renews time out, then Nomad answers again: the whole kill_timeout",
			func(s *locktest.Server) { s.FailRenew(errors.New("context deadline exceeded")) },
			func(s *locktest.Server) { s.FailRenew(nil) }, true, 0, "", 0, 0},
		{"renews keep failing: cut at the stop deadline, saying why",
			func(s *locktest.Server) { s.FailRenew(errors.New("context deadline exceeded")) }, nil, true,
			128 + int(syscall.SIGKILL), "no successful renew before the fence deadline", 0, 0},
		{"Nomad says the lock is another's: cut at the fence deadline, saying why",
			func(s *locktest.Server) { s.TakeOver(time.Second) }, nil, false,
			128 + int(syscall.SIGKILL), "the lock is no longer ours", 0, 0},
		{"renews fail, but the kill_timeout ends before the stop deadline: not cut",
			func(s *locktest.Server) { s.FailRenew(errors.New("context deadline exceeded")) }, nil, true,
			0, "", 14 * time.Second, 11 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			timeout, flush := cmp.Or(tc.timeout, timeout), cmp.Or(tc.flush, flush)
			r := newRunRig(t, flusher(flush), time.Second)
			r.run()
			r.holding()
			began := time.Now()
			r.stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: timeout}
			r.waitOutput("flushing")
			tc.fault(r.srv)

			lost := r.eventWithin("the loss reported", wait, lostMsg)
			if got := strings.Contains(lost.Message, "renewing it again"); got != tc.retries {
				t.Errorf("loss event %q: says it renews again %v, want %v", lost.Message, got, tc.retries)
			}
			if notCut := strings.Contains(lost.Message, "its grace is not cut"); notCut != (tc.code == 0 && tc.heal == nil) {
				t.Errorf("loss event %q: says the grace is not cut %v", lost.Message, notCut)
			}
			if tc.heal != nil {
				tc.heal(r.srv)
				r.eventWithin("the lock renewed again", wait, func(ev Event) bool {
					return strings.HasPrefix(ev.Message, "Lock renewed again: it was still ours; the workload keeps its kill_timeout ("+timeout.String())
				})
			}
			code := r.exitWithin(wait)
			took := time.Since(began)
			if code != tc.code {
				t.Errorf("exit %d after %s, want %d; events:\n%sworkload output: %q", code, took.Round(time.Millisecond), tc.code, r.eventLog(), r.out.String())
			}
			if tc.code == 0 && (took < flush || !strings.Contains(r.out.String(), "flushed")) {
				t.Errorf("stopped after %s, output %q: want the whole %s flush", took, r.out.String(), flush)
			}
			if tc.cutSays != "" {
				cut := r.eventWithin("the cut explained", time.Second, func(ev Event) bool {
					return strings.HasPrefix(ev.Message, "Killing the workload with SIGKILL after ")
				})
				if !strings.Contains(cut.Message, "of its kill_timeout ("+timeout.String()+"): the lock was lost (") ||
					!strings.Contains(cut.Message, tc.cutSays) {
					t.Errorf("cut event %q: want it to name the kill_timeout and %q", cut.Message, tc.cutSays)
				}
			}
			r.checkReleasesAfterDeath(0)
		})
	}
}

// eventWithin is event with its own bound, for waits longer than ceiling.
func (r *runRig) eventWithin(what string, bound time.Duration, ok func(Event) bool) Event {
	r.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		if ev, found := r.find(ok); found {
			return ev
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s event within %s; events:\n%sworkload output: %q", what, bound, r.eventLog(), r.out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exitWithin is exit with its own bound.
func (r *runRig) exitWithin(bound time.Duration) int {
	r.t.Helper()
	select {
	case code := <-r.code:
		r.code <- code
		return code
	case <-time.After(bound):
		r.t.Fatalf("Run still going after %s; events:\n%s", bound, r.eventLog())
		return 0
	}
}
