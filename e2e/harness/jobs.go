package harness

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// RunJobHCL parses a jobspec with the agent (POST /v1/jobs/parse) and
// registers it. It returns the job ID. Cleanup stops and purges every job on
// the agent, so tests need not.
func (a *Agent) RunJobHCL(t testing.TB, hcl string) string {
	t.Helper()
	return a.RunJobHCLVars(t, hcl, "")
}

// RunJobHCLVars is RunJobHCL for a jobspec with variable blocks: vars is
// the content of a variables file (`key = value` lines), as `nomad job run
// -var-file` takes it.
func (a *Agent) RunJobHCLVars(t testing.TB, hcl, vars string) string {
	t.Helper()
	job, err := a.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Variables: vars, Canonicalize: true})
	if err != nil {
		t.Fatalf("harness: parse jobspec: %v\n%s\nvariables:\n%s", err, hcl, vars)
	}
	resp, _, err := a.api.Jobs().Register(job, nil)
	if err != nil {
		t.Fatalf("harness: register job %s: %v", *job.ID, err)
	}
	if resp.Warnings != "" {
		t.Logf("harness: job %s registered with warnings: %s", *job.ID, resp.Warnings)
	}
	return *job.ID
}

// Allocs lists the job's allocations (all versions), newest first.
func (a *Agent) Allocs(jobID string) ([]*api.AllocationListStub, error) {
	allocs, _, err := a.api.Jobs().Allocations(jobID, true, nil)
	if err != nil {
		return nil, err
	}
	sort.Slice(allocs, func(i, j int) bool { return allocs[i].CreateIndex > allocs[j].CreateIndex })
	return allocs, nil
}

// WaitAllocs waits until exactly n of the job's allocations have client
// status status (api.AllocClientStatusRunning, ...Complete, ...Failed, ...)
// and returns those. On timeout the test fails with every allocation's state,
// recent task events and the job's placement failures.
func (a *Agent) WaitAllocs(t testing.TB, jobID string, n int, status string, timeout time.Duration) []*api.AllocationListStub {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		allocs, err := a.Allocs(jobID)
		lastErr = err
		if err == nil {
			var match []*api.AllocationListStub
			for _, al := range allocs {
				if al.ClientStatus == status {
					match = append(match, al)
				}
			}
			if len(match) == n {
				return match
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: job %s: wanted %d allocations %q within %s (last error: %v)\n%s",
				jobID, n, status, timeout, lastErr, a.describeJob(jobID))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// describeJob renders allocation states, recent task events and placement
// failures for a failure message.
func (a *Agent) describeJob(jobID string) string {
	var b strings.Builder
	allocs, err := a.Allocs(jobID)
	if err != nil {
		fmt.Fprintf(&b, "  allocations: %v\n", err)
	}
	if len(allocs) == 0 && err == nil {
		b.WriteString("  no allocations\n")
	}
	for _, al := range allocs {
		fmt.Fprintf(&b, "  alloc %s client=%s desired=%s\n", short(al.ID), al.ClientStatus, al.DesiredStatus)
		for _, task := range slices.Sorted(maps.Keys(al.TaskStates)) {
			ts := al.TaskStates[task]
			fmt.Fprintf(&b, "    task %s state=%s failed=%t restarts=%d\n", task, ts.State, ts.Failed, ts.Restarts)
			events := ts.Events
			if len(events) > 6 {
				events = events[len(events)-6:]
			}
			for _, ev := range events {
				fmt.Fprintf(&b, "      %s %s: %s\n", time.Unix(0, ev.Time).Format("15:04:05.000"), ev.Type, ev.DisplayMessage)
			}
		}
	}
	if evals, _, err := a.api.Jobs().Evaluations(jobID, nil); err == nil {
		for _, ev := range evals {
			for tg, m := range ev.FailedTGAllocs {
				fmt.Fprintf(&b, "  eval %s: group %s not placed: filtered=%v exhausted=%v constraints=%v\n",
					short(ev.ID), tg, m.NodesFiltered, m.NodesExhausted, m.ConstraintFiltered)
			}
		}
	}
	return b.String()
}

// StopAlloc asks Nomad to stop one allocation. For service jobs the
// scheduler then places a replacement.
func (a *Agent) StopAlloc(allocID string) error {
	_, err := a.api.Allocations().Stop(&api.Allocation{ID: allocID}, nil)
	return err
}

// AllocLogs returns everything the task has written to stream ("stdout" or
// "stderr") so far. It does not follow; it fails the test on error or after
// 30s.
func (a *Agent) AllocLogs(t testing.TB, allocID, task, stream string) string {
	t.Helper()
	alloc, _, err := a.api.Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("harness: alloc %s: %v", allocID, err)
	}
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := a.api.AllocFS().Logs(alloc, false, task, stream, api.OriginStart, 0, cancel, nil)
	var buf bytes.Buffer
	timeout := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return buf.String()
			}
			buf.Write(f.Data)
		case err := <-errs:
			t.Fatalf("harness: %s logs of %s/%s: %v", stream, short(allocID), task, err)
		case <-timeout:
			t.Fatalf("harness: %s logs of %s/%s: no end of stream after 30s", stream, short(allocID), task)
		}
	}
}

// TaskEvents returns the task's events, oldest first.
func (a *Agent) TaskEvents(allocID, task string) ([]*api.TaskEvent, error) {
	alloc, _, err := a.api.Allocations().Info(allocID, nil)
	if err != nil {
		return nil, err
	}
	ts := alloc.TaskStates[task]
	if ts == nil {
		return nil, fmt.Errorf("allocation %s has no task %q (yet)", short(allocID), task)
	}
	return ts.Events, nil
}

// Purge stops the job and removes it from the state store.
func (a *Agent) Purge(jobID string) error {
	_, _, err := a.api.Jobs().Deregister(jobID, true, nil)
	return err
}

// HCLList renders Go strings as an HCL list of string literals, for task args.
func HCLList(items ...string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}
