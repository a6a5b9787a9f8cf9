package driver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Whatever a message carries, what leaves the supervisor is bounded: the
// status stays readable by the plugin (a status over its read cap would
// leave the watchdog on stale deadlines), and neither the events file nor
// the task events (stored in Nomad's Raft log) take more than
// maxEventMessage per message, cut at a rune and marked as cut.
func TestEventMessagesAreBounded(t *testing.T) {
	dir, err := securefs.OpenPrivate(filepath.Join(t.TempDir(), "state"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	huge := "LB add failed: " + strings.Repeat("é", maxFileSize/2)
	p := &publisher{dir: dir, path: "nomad/jobs/x/lock", log: hclog.NewNullLogger()}
	p.observe(shim.Event{State: shim.StateStopping, Message: huge, Fence: 3})
	p.observe(shim.Event{State: shim.StateStopping, Message: huge + "!", Fence: 3, Notice: true})
	p.note(huge)
	// A waiter's event names the holder from the lock's Items, which any
	// token with write on the path can set.
	p.observe(shim.Event{State: shim.StateWaiting, Message: huge, Holder: lockclient.Holder{AllocID: huge}})

	var st supervisorStatus
	if err := readJSON(dir, statusFile, &st); err != nil {
		t.Fatalf("the plugin cannot read the status: %v", err)
	}
	evs, err := (&eventTail{dir: dir}).read()
	if err != nil || len(evs) != 4 {
		t.Fatalf("events %d (%v), want 4", len(evs), err)
	}
	if h := evs[3].Holder; len(h) > maxHolderID || !strings.HasPrefix(h, "LB add failed") {
		t.Errorf("holder annotation of %d bytes: %.60q", len(h), h)
	}
	d := &Driver{ctx: context.Background(), logger: hclog.NewNullLogger()}
	d.emitEvent(&drivers.TaskConfig{ID: "a1/t", Name: "t", AllocID: "a1"}, huge, nil)

	msgs := []string{st.Message, d.pending[0].Message}
	for _, ev := range evs {
		msgs = append(msgs, ev.Message)
	}
	for i, m := range msgs {
		if len(m) > maxEventMessage || !utf8.ValidString(m) || !strings.HasPrefix(m, "LB add failed: éé") ||
			!strings.Contains(m, "…(cut from ") {
			t.Errorf("message %d: %d bytes, valid UTF-8 %v, start %.40q, end %q", i, len(m), utf8.ValidString(m), m, m[max(0, len(m)-40):])
		}
	}
}

// TestEventsDocumented: every kind of event the plugin words itself is
// listed in docs/troubleshooting.md, each rendering matching how a row of
// its tables says it begins, with what it means and what to do.
func TestEventsDocumented(t *testing.T) {
	refused := errors.New("dial tcp 10.0.0.9:8080: connect: connection refused")
	cfg := lbhook.Config{URI: "http://lb.example:8080/baragon/v2/request", ServiceID: "web"}
	leftToExpire := fmt.Errorf("release nomad/jobs/web/lock: %w",
		lockclient.Timing{TTL: 15 * time.Second, LockDelay: 5 * time.Second}.MayRelease(time.Now().Add(-time.Minute), time.Now()))
	examples := map[string][]string{
		"warden-killed":      {wardenKilledMessage([]string{"api"}, false), wardenKilledMessage([]string{"api", "db"}, true)},
		"warden-kill-failed": {wardenKillFailedMessage([]string{"api"}, refused)},
		"gate-not-restarted": {gateNotRestartedMessage()},
		"gate-waiting":       {gateWaitingMessage("nomad/jobs/web/lock")},
		"on-lock-waiting":    {onLockWaitingMessage("nomad/jobs/web/lock")},
		"superseded-start":   {supersededStartMessage()},
		"no-cgroup":          {noCgroupMessage()},
		"watchdog": {watchdogMessage(watchdogUnresponsive(3 * time.Second)),
			watchdogMessage(watchdogStillRunning(3 * time.Second))},
		"watchdog-gate": {watchdogGateMessage(nil, watchdogUnresponsive(3*time.Second)),
			watchdogGateMessage(refused, watchdogStillRunning(3*time.Second))},
		"crash-released": {crashReleasedMessage(whoseCrashed, 7, ""), crashReleasedMessage(whoseNotProven, 7, ""),
			crashReleasedMessage(whoseIdentityRejected, 7, ", with the plugin's release_token_file")},
		"crash-not-released": {crashNotReleasedMessage(whoseCrashed, refused, 0),
			crashNotReleasedMessage(whoseCrashed, refused, 35*time.Second)},
		"crash-left-to-expire":    {crashLeftToExpireMessage(whoseCrashed, 7, leftToExpire)},
		"crash-gate-lock-kept":    {crashGateLockKeptMessage(whoseCrashed, 35*time.Second)},
		"crash-lb-removed":        {crashLBRemovedMessage("10.0.0.1:8080", lbhook.BaragonResponse{LoadBalancerState: lbhook.StateSuccess})},
		"crash-lb-remove-failed":  {crashLBRemoveFailedMessage(refused, cfg, "10.0.0.1:8080")},
		"crash-lb-remove-skipped": {crashLBRemoveSkippedMessage("10.0.0.1:8080", "web")},
		"oom-killed":              {oomKilledMessage()},
		"lease-mode":              {leaseModeMessage(lockclient.DefaultHeartbeat)},
		"lease-takeover":          {leaseTakeoverMessage(9 * time.Second)},
		"lease-no-takeover":       {leaseNoTakeoverMessage("the lock is no longer in the heartbeat's epoch 7 (index 9)")},
		"lease-standby-off":       {leaseStandbyOffMessage(errNoReleaseToken)},
	}
	for _, p := range events.CheckPackage("../docs/troubleshooting.md", "driver", examples) {
		t.Error(p)
	}
}
