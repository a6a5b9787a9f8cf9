package shim

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// A release after which Nomad may start a gated task again is not marked
// clean: a task pending a restart that Nomad scheduled before the gate's
// own kill (it crashed on its own), or pending its first start. A restart
// scheduled by the gate's own kill is not such a task: Nomad's kill of the
// failing allocation cancels it first (the static restart rule), and the
// warden kills it should it start. Under load the servers learn of that
// restart before the release decides, and taking it for an earlier one
// made every crash takeover wait for Nomad's report (10 s instead of
// 0.3 s in TestGateKill/supervisor_docker).
func TestGatedPendingTellsTheKillsOwnRestarts(t *testing.T) {
	killed := time.Unix(1000, 0)
	restarting := func(at time.Time) *api.TaskState {
		return &api.TaskState{State: "pending", Events: []*api.TaskEvent{
			{Type: api.TaskStarted, Time: at.Add(-time.Minute).UnixNano()},
			{Type: api.TaskTerminated, Time: at.UnixNano()},
			{Type: api.TaskRestarting, Time: at.UnixNano()},
		}}
	}
	alloc := &api.Allocation{ClientStatus: api.AllocClientStatusRunning, TaskStates: map[string]*api.TaskState{
		"gate":        {State: "running"},
		"crashed":     restarting(killed.Add(-5 * time.Second)),
		"killed":      restarting(killed.Add(200 * time.Millisecond)),
		"first-start": {State: "pending", Events: []*api.TaskEvent{{Type: api.TaskReceived, Time: killed.Add(-time.Second).UnixNano()}}},
		"running":     {State: "running"},
	}}
	for _, tc := range []struct {
		name     string
		killedAt time.Time
		want     []string
	}{
		{"no kill of ours", time.Time{}, []string{"crashed", "first-start", "killed"}},
		{"after our kill", killed, []string{"crashed", "first-start"}},
	} {
		if got := GatedPending(alloc, "gate", tc.killedAt); !slices.Equal(got, tc.want) {
			t.Errorf("%s: GatedPending = %v, want %v", tc.name, got, tc.want)
		}
	}
}
