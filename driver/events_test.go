package driver

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
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
