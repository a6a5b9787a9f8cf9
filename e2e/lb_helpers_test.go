package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// Helpers of lb_test.go. Every identifier here starts with lb so that it
// never collides with the other tests' helpers in this package.

const (
	// lbGroup is the load balancer group every LB server here has.
	lbGroup = "web-lb"
	// lbDomain is a domain lbGroup serves.
	lbDomain = "example.com"
	// lbRecheck is the jobs' recheck_interval.
	lbRecheck    = 2 * time.Second
	lbRecheckHCL = "2s"
	// lbWorkerInterval is the reference LB's worker period (Baragon: 1s).
	lbWorkerInterval = 20 * time.Millisecond
)

// lbStartServer starts the reference LB API with the group lbGroup, a fast
// worker and CLOCK_MONOTONIC request stamps, closed at cleanup.
func lbStartServer(t *testing.T) *harness.LB {
	return harness.StartLB(t, lbapi.Options{
		// The domain lets a request name it (testLBBaragonFields).
		Groups:         []lbapi.Group{{Name: lbGroup, Domains: []string{lbDomain}}},
		WorkerInterval: lbWorkerInterval,
	})
}

// lbJob is a singleton job whose workload serves HTTP on its "http" port
// and registers with the LB.
type lbJob struct {
	*drvJob
	lb      *harness.LB
	service string   // LB service id, unique per job
	groups  []string // load balancer groups (default lbGroup)
	// restart is the body of the group's restart block ("" for Nomad's default).
	restart string
	// noReschedule adds reschedule { attempts = 0, unlimited = false }.
	noReschedule bool
	// authkey is stored in the job's variable nomad/jobs/<job> and rendered
	// by a template into secrets/lb.key, which the load_balancer block names
	// as its authkey_file ("" for none): the key is in no jobspec or log.
	authkey string
	// lbExtra is added to the load_balancer block as is.
	lbExtra string
}

func newLBJob(t *testing.T, lb *harness.LB, name string, count int) *lbJob {
	id := "lb-" + name
	return &lbJob{
		drvJob: &drvJob{
			id:     id,
			count:  count,
			marker: fmt.Sprintf("%s-%d", id, time.Now().UnixNano()),
			record: filepath.Join(t.TempDir(), "records.jsonl"),
			driver: harness.PluginDriverName,
		},
		lb:      lb,
		service: fmt.Sprintf("svc-%s-%d", name, time.Now().UnixNano()%1e6),
		groups:  []string{lbGroup},
	}
}

// lbSpec is the data of the jobspec templates' load_balancer block
// (harness/jobs/blocks.tmpl): the LB API, the service and its groups,
// authkey_file if any, and Extra lines added to the block as they are.
type lbSpec struct {
	URI, ServiceID, BasePath, Recheck, AuthkeyFile, Extra string
	Groups                                                []string
}

// basePath is unique per job: two services on one path in one group are a
// base path conflict for Baragon.
func (j *lbJob) basePath() string { return "/" + j.service }

// hcl renders the job with harness/jobs/lb.nomad.hcl.tmpl.
func (j *lbJob) hcl(t *testing.T) string {
	authkeyTemplate, authkeyFile := "", ""
	if j.authkey != "" {
		authkeyTemplate = `{{ with nomadVar "nomad/jobs/` + j.id + `" }}{{ .authkey }}{{ end }}`
		authkeyFile = "secrets/lb.key"
	}
	return harness.Jobspec("lb", struct {
		ID, Group, Restart, Task, Driver, Command, TTL, Delay, AuthkeyTemplate, KillTimeout string
		Count                                                                               int
		NoReschedule                                                                        bool
		Args                                                                                []string
		LB                                                                                  lbSpec
	}{
		ID: j.id, Group: drvGroup, Restart: j.restart, Task: drvTask, Driver: harness.PluginDriverName,
		Command: harness.BuildTestWorkload(t), TTL: drvTTLHCL, Delay: drvDelayHCL,
		AuthkeyTemplate: authkeyTemplate, KillTimeout: drvKillTimeout,
		Count: j.count, NoReschedule: j.noReschedule,
		Args: append([]string{"-record", j.record, "-marker", j.marker, "-http", "127.0.0.1:${NOMAD_PORT_http}"}, j.args...),
		LB: lbSpec{URI: j.lb.URI, ServiceID: j.service, BasePath: j.basePath(), Recheck: lbRecheckHCL, Extra: j.lbExtra,
			Groups: j.groups, AuthkeyFile: authkeyFile},
	})
}

// run registers the job. At cleanup it purges the job and waits until its
// workloads are gone, so their REMOVEs reach the LB before it closes.
func (j *lbJob) run(t *testing.T, a *harness.Agent) {
	t.Helper()
	if j.authkey != "" {
		v := &api.Variable{Path: "nomad/jobs/" + j.id, Items: api.VariableItems{"authkey": j.authkey}}
		if _, _, err := a.API().Variables().Create(v, nil); err != nil {
			t.Fatalf("store the LB auth key: %v", err)
		}
	}
	a.RunJobHCL(t, j.hcl(t))
	t.Cleanup(func() {
		_ = a.Purge(j.id)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if procs, err := harness.FindProcs(j.marker); err == nil && len(procs) == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("workloads of %s still alive 30s after the purge", j.id)
	})
}

// addID and removeID are the request ids the driver must use (DESIGN.md).
func lbAddID(allocID string, fence uint64) string { return fmt.Sprintf("%s-ADD-%d", allocID, fence) }
func lbRemoveID(allocID string, fence uint64) string {
	return fmt.Sprintf("%s-REMOVE-%d", allocID, fence)
}

// lbUpstreamOf is the host:port of the alloc's "http" port, as Nomad
// allocated it.
func lbUpstreamOf(t *testing.T, a *harness.Agent, allocID string) string {
	t.Helper()
	al, _, err := a.API().Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatalf("alloc %s: %v", drvShort(allocID), err)
	}
	if al.AllocatedResources != nil {
		for _, p := range al.AllocatedResources.Shared.Ports {
			if p.Label == "http" {
				return fmt.Sprintf("%s:%d", p.HostIP, p.Value)
			}
		}
	}
	t.Fatalf("alloc %s has no allocated port \"http\": %+v", drvShort(allocID), al.AllocatedResources)
	return ""
}

// lbWaitDone waits until the LB holds request id in a final state.
func lbWaitDone(t *testing.T, lb *harness.LB, id string, timeout time.Duration) lbapi.RequestRecord {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if rec, ok := lb.Request(id); ok && rec.Done() {
			return rec
		}
		if time.Now().After(deadline) {
			rec, ok := lb.Request(id)
			t.Fatalf("LB request %s not final within %s (known %v: %+v)", id, timeout, ok, rec)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lbWaitSuccess waits for request id to end SUCCESS.
func lbWaitSuccess(t *testing.T, lb *harness.LB, id string, timeout time.Duration) lbapi.RequestRecord {
	t.Helper()
	rec := lbWaitDone(t, lb, id, timeout)
	if rec.State != "SUCCESS" {
		t.Fatalf("LB request %s ended %s: %s", id, rec.State, rec.Message)
	}
	return rec
}

// lbWaitUpstreams waits until the service's upstreams are exactly want.
func lbWaitUpstreams(t *testing.T, lb *harness.LB, service string, timeout time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := lb.Upstreams(service)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("LB service %s has upstreams %q after %s, want exactly %q; requests:\n%s",
				service, got, timeout, want, lbFormatRequests(lb.Requests(service)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lbCheckUpstreams asserts the service's upstreams are exactly want.
func lbCheckUpstreams(t *testing.T, lb *harness.LB, service string, want ...string) {
	t.Helper()
	if got := lb.Upstreams(service); !slices.Equal(got, want) {
		t.Errorf("LB service %s has upstreams %q, want exactly %q; requests:\n%s",
			service, got, want, lbFormatRequests(lb.Requests(service)))
	}
}

// lbHTTPState reads GET /state/{service} the way a Baragon consumer does.
func lbHTTPState(t *testing.T, lb *harness.LB, service string) (svc json.RawMessage, upstreams []json.RawMessage, names []string) {
	t.Helper()
	url := strings.Replace(lb.URI, "/request", "/state", 1) + "/" + service
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	var st struct {
		Service   json.RawMessage   `json:"service"`
		Upstreams []json.RawMessage `json:"upstreams"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
	for _, u := range st.Upstreams {
		var x struct {
			Upstream string `json:"upstream"`
		}
		_ = json.Unmarshal(u, &x)
		names = append(names, x.Upstream)
	}
	return st.Service, st.Upstreams, names
}

// lbRequestsWithPrefix lists the service's requests whose id starts with prefix.
func lbRequestsWithPrefix(lb *harness.LB, service, prefix string) []lbapi.RequestRecord {
	var out []lbapi.RequestRecord
	for _, r := range lb.Requests(service) {
		if strings.HasPrefix(r.ID, prefix) {
			out = append(out, r)
		}
	}
	return out
}

func lbFormatRequests(recs []lbapi.RequestRecord) string {
	if len(recs) == 0 {
		return "  (none)"
	}
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "  #%d %s %s add=%q remove=%q enqueued=%d finished=%d: %s\n",
			r.Index, r.ID, r.State, r.AddUpstreams, r.RemoveUpstreams, r.Enqueued, r.Finished, r.Message)
	}
	return b.String()
}

// lbStateSampler polls a service's upstreams every few milliseconds and
// remembers every moment it saw more than one, and when it last saw each
// upstream (CLOCK_MONOTONIC, as the workloads' records and the LB's
// request stamps).
type lbStateSampler struct {
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	samples  int
	max      int
	multi    []string // "<mono>: [a b]"
	lastSeen map[string]int64
}

func lbSampleState(t *testing.T, lb *harness.LB, service string) *lbStateSampler {
	s := &lbStateSampler{stop: make(chan struct{}), done: make(chan struct{}), lastSeen: map[string]int64{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			now := harness.MonoNow()
			ups := lb.Upstreams(service)
			s.mu.Lock()
			s.samples++
			s.max = max(s.max, len(ups))
			if len(ups) > 1 && len(s.multi) < 10 {
				s.multi = append(s.multi, fmt.Sprintf("%d: %q", now, ups))
			}
			for _, u := range ups {
				s.lastSeen[u] = now
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

func (s *lbStateSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// check stops the sampler and fails the test if it ever saw two upstreams.
// seen is the last moment the sampler saw upstream listed (0: never).
func (s *lbStateSampler) seen(upstream string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSeen[upstream]
}

func (s *lbStateSampler) check(t *testing.T, what string) {
	t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("LB state sampler (%s): %d samples, at most %d upstream(s) at once", what, s.samples, s.max)
	if s.samples < 10 {
		t.Errorf("LB state sampler (%s): only %d samples", what, s.samples)
	}
	if s.max > 1 {
		t.Errorf("LB state (%s) held %d upstreams at once: %s", what, s.max, strings.Join(s.multi, "; "))
	}
}

// lbHolder waits for the job's first workload and the other allocs to wait
// for it; it returns the holder's start record.
func (j *lbJob) lbHolder(t *testing.T, a *harness.Agent) harness.Record {
	t.Helper()
	a.WaitAllocs(t, j.id, j.count, api.AllocClientStatusRunning, 60*time.Second)
	first := j.waitStart(t, 60*time.Second, nil)
	for _, id := range drvRunning(t, a, j.id) {
		if id != first.AllocID {
			drvWaitEvent(t, a, id, 30*time.Second, "Waiting for lock", "held by alloc "+drvShort(first.AllocID))
		}
	}
	return first
}

// lbRegisteredHolder runs a count=2 LB job and waits until its holder's
// ADD has succeeded and the service holds exactly its upstream. It returns
// the job, the holder's start record, its fence and its upstream.
func lbRegisteredHolder(t *testing.T, a *harness.Agent, lb *harness.LB, name string) (*lbJob, harness.Record, uint64, string) {
	t.Helper()
	j := newLBJob(t, lb, name, 2)
	j.run(t, a)
	first := j.lbHolder(t, a)
	fence := drvFence(t, first)
	up := lbUpstreamOf(t, a, first.AllocID)
	lbWaitSuccess(t, lb, lbAddID(first.AllocID, fence), 30*time.Second)
	lbWaitUpstreams(t, lb, j.service, 5*time.Second, up)
	return j, first, fence, up
}

// lbWaitLogCount waits until the task's stderr holds sub at least n times.
func lbWaitLogCount(t *testing.T, a *harness.Agent, allocID, sub string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		logs := a.AllocLogs(t, allocID, drvTask, "stderr")
		if strings.Count(logs, sub) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alloc %s: %q not %d times in stderr within %s:\n%s", drvShort(allocID), sub, n, timeout, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lbMonoDur is the duration between two CLOCK_MONOTONIC readings.
func lbMonoDur(from, to int64) time.Duration { return time.Duration(to - from) }

// lbCollectEvents polls the task's events until the allocation reaches
// client status final, and returns every event seen, oldest first. Nomad
// keeps only a task's last 10 events; polling keeps the ones it drops.
func lbCollectEvents(t *testing.T, a *harness.Agent, jobID, final string, timeout time.Duration) (string, []*api.TaskEvent) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var allocID string
	var all []*api.TaskEvent
	seen := map[string]bool{}
	for {
		if allocID == "" {
			if allocs, err := a.Allocs(jobID); err == nil && len(allocs) > 0 {
				allocID = allocs[0].ID
			}
		}
		status := ""
		if allocID != "" {
			al, _, err := a.API().Allocations().Info(allocID, nil)
			if err == nil {
				status = al.ClientStatus
			}
			for _, ev := range drvEvents(t, a, allocID) {
				key := fmt.Sprintf("%d %s %s", ev.Time, ev.Type, drvEventText(ev))
				if !seen[key] {
					seen[key] = true
					all = append(all, ev)
				}
			}
		}
		if status == final {
			slices.SortStableFunc(all, func(x, y *api.TaskEvent) int { return int(x.Time - y.Time) })
			return allocID, all
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: alloc %q not %s within %s (status %q); events:\n%s", jobID, allocID, final, timeout, status, drvFormatEvents(all))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lbOperatorPost sends a request as an operator would, straight to the LB
// API under its own id, adding and removing the given upstreams of the
// stored service svc, and waits for it to succeed.
func lbOperatorPost(t *testing.T, lb *harness.LB, id string, svc json.RawMessage, add, remove []any) lbapi.RequestRecord {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"loadBalancerRequestId": id, "loadBalancerService": svc,
		"addUpstreams": add, "removeUpstreams": remove, "replaceUpstreams": []any{},
		"action": "UPDATE", "noValidate": false, "noReload": false, "upstreamUpdateOnly": false,
		"noDuplicateUpstreams": false,
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(lb.URI, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: HTTP %d", id, resp.StatusCode)
	}
	return lbWaitSuccess(t, lb, id, 10*time.Second)
}
