package driver

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/promtooltest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// metricsTask is a task the plugin tracks for its metrics, with a private
// state dir; its environment claims another job and allocation.
func metricsTask(t *testing.T, m *pluginMetrics) *taskHandle {
	t.Helper()
	path := filepath.Join(t.TempDir(), "task")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	dir, err := securefs.OpenPrivate(path, false)
	if err != nil {
		t.Skipf("no private state dir here: %v", err)
	}
	t.Cleanup(func() { dir.Close() })
	cfg := &drivers.TaskConfig{ID: "alloc-1/web", AllocID: "alloc-1", JobID: "web-periodic-123", ParentJobID: "web",
		TaskGroupName: "g", Name: "web", Namespace: "prod",
		Env: map[string]string{"NOMAD_JOB_ID": "evil", "NOMAD_ALLOC_ID": "evil", "NOMAD_NAMESPACE": "evil"}}
	h := &taskHandle{cfg: cfg, dir: dir, done: make(chan struct{}), logger: hclog.NewNullLogger()}
	m.track(h, supervisorSpec{Run: shim.Spec{Config: shim.Config{Path: "nomad/jobs/web/lock"}}})
	return h
}

// The plugin counts the task events it words itself (crash releases, lease
// takeovers, watchdog kills), not the supervisor's that it relays, and
// labels the task from Nomad's task config, never from its environment.
func TestPluginMetricsCountTheEventsTheyWord(t *testing.T) {
	m := &pluginMetrics{}
	h := metricsTask(t, m)
	for _, msg := range []string{
		crashReleasedMessage(whoseCrashed, 12, ""),
		crashReleasedMessage(whoseIdentityRejected, 13, ", with the plugin's release_token_file"),
		crashNotReleasedMessage(whoseCrashed, errors.New("boom"), time.Minute),
		crashLeftToExpireMessage(whoseCrashed, 14, lockclient.ErrLeftToExpire),
		crashGateLockKeptMessage(whoseCrashed, time.Minute),
		leaseTakeoverMessage(9 * time.Second),
		leaseNoTakeoverMessage("the escrow holds no lock ID"),
		watchdogMessage(watchdogUnresponsive(time.Second)),
		watchdogGateMessage(nil, watchdogStillRunning(time.Second)),
		// The supervisor's, relayed: none counts.
		"Released lock",
		"Lock lost: no successful renew before the fence deadline",
		"Lock left to expire, not released: past the release cutoff",
	} {
		m.taskEvent(h.cfg.ID, msg)
	}
	tasks := m.gather(time.Now())
	if len(tasks) != 1 {
		t.Fatalf("%d tasks, want 1", len(tasks))
	}
	got := tasks[0]
	want := lockmetrics.Labels{Namespace: "prod", Job: "web", Group: "g", Task: "web", AllocID: "alloc-1", Path: "nomad/jobs/web/lock"}
	if got.Labels != want {
		t.Errorf("labels %+v, want %+v", got.Labels, want)
	}
	p := got.Plugin
	if p.CrashReleases["released"] != 2 || p.CrashReleases["not_released"] != 1 || p.CrashReleases["left_to_expire"] != 1 ||
		p.CrashReleases["kept"] != 1 || p.LeaseTakeovers["taken"] != 1 || p.LeaseTakeovers["skipped"] != 1 || p.WatchdogKills != 2 {
		t.Errorf("counts %+v", p)
	}
}

// The supervisor's metrics come from the file it writes; a supervisor that
// writes none still shows whether it holds the lock, from its status. A
// stopped task holds nothing; its series stay stoppedRetention after it
// stopped, destroyed or not, and a task Nomad restarts in place keeps what
// the plugin counted for it.
func TestPluginMetricsOfATask(t *testing.T) {
	m := &pluginMetrics{}
	h := metricsTask(t, m)
	h.status = supervisorStatus{State: "holding", Fence: 41}
	if s := m.gather(time.Now())[0].Snap; !s.Held || s.Fence != 41 {
		t.Errorf("without metrics.json: %+v, want held at fence 41 (the status)", s)
	}
	w := newMetricsWriter(h.dir, hclog.NewNullLogger(), &shim.Env{})
	w.flush()
	if s := m.gather(time.Now())[0].Snap; s.Held || s.Fence != 0 {
		t.Errorf("with an empty metrics.json: %+v, want the supervisor's count", s)
	}

	close(h.done)
	h.completedAt = time.Now()
	if ts := m.gather(time.Now()); len(ts) != 1 || !ts[0].Exited {
		t.Errorf("just stopped: %+v, want the task, stopped", ts)
	}
	m.taskEvent(h.cfg.ID, crashReleasedMessage(whoseCrashed, 12, ""))
	m.forget(h.cfg.ID)
	if ts := m.gather(time.Now()); len(ts) != 1 || !ts[0].Exited || ts[0].Plugin.CrashReleases["released"] != 1 {
		t.Errorf("destroyed just after it stopped: %+v, want the task, stopped, with its crash release", ts)
	}
	// Nomad restarts it in place: what the plugin counted goes on.
	again := &taskHandle{cfg: h.cfg, dir: h.dir, done: make(chan struct{}), logger: hclog.NewNullLogger()}
	m.track(again, supervisorSpec{Run: shim.Spec{Config: shim.Config{Path: "nomad/jobs/web/lock"}}})
	if ts := m.gather(time.Now()); len(ts) != 1 || ts[0].Exited || ts[0].Plugin.CrashReleases["released"] != 1 {
		t.Errorf("restarted: %+v, want the task, running, with its crash release", ts)
	}
	close(again.done)
	again.completedAt = time.Now()
	m.forget(h.cfg.ID)
	if ts := m.gather(time.Now().Add(stoppedRetention + time.Second)); len(ts) != 0 {
		t.Errorf("%s after it stopped: %d tasks, want none", stoppedRetention, len(ts))
	}
	if len(m.tasks) != 0 {
		t.Errorf("%d tasks kept after their series went", len(m.tasks))
	}
}

// The plugin's /metrics passes promtool's check, with a holder's count (a
// histogram of each kind among it) and the plugin's own process metrics.
func TestPluginMetricsEndpoint(t *testing.T) {
	m := &pluginMetrics{}
	h := metricsTask(t, m)
	snap := lockmetrics.Snapshot{Held: true, Fence: 9, HeldSince: time.Now(), Acquisitions: map[string]uint64{"first": 1},
		LBRequests: map[string]uint64{"add/success": 1}}
	lockmetrics.ObserveIn(&snap.RenewLatency, lockmetrics.RenewDurationDesc, "renew", .01)
	lockmetrics.ObserveIn(&snap.FenceLeft, lockmetrics.FenceLeftDesc, "renew", 12)
	lockmetrics.ObserveIn(&snap.LBLatency, lockmetrics.LBDurationDesc, "add", .2)
	if err := writeJSON(h.dir, metricsFile, snap); err != nil {
		t.Fatal(err)
	}
	m.taskEvent(h.cfg.ID, watchdogMessage(watchdogUnresponsive(time.Second)))
	srv := httptest.NewServer(m.handler(hclog.NewNullLogger()))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	promtooltest.CheckMetrics(t, body)
	for _, want := range []string{
		`nomad_singleton_lock_held{alloc_id="alloc-1",group="g",job="web",namespace="prod",path="nomad/jobs/web/lock",slot="",task="web"} 1`,
		`nomad_singleton_plugin_watchdog_kills_total{alloc_id="alloc-1",group="g",job="web",namespace="prod",path="nomad/jobs/web/lock",task="web"} 1`,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// BenchmarkPluginScrape is one scrape of a plugin supervising 100 tasks:
// a holder with renews and LB requests, and 99 standbys.
func BenchmarkPluginScrape(b *testing.B) {
	m := &pluginMetrics{}
	root := b.TempDir()
	for i := range 100 {
		path := filepath.Join(root, fmt.Sprint(i))
		if err := os.Mkdir(path, 0o700); err != nil {
			b.Fatal(err)
		}
		dir, err := securefs.OpenPrivate(path, false)
		if err != nil {
			b.Skipf("no private state dir here: %v", err)
		}
		cfg := &drivers.TaskConfig{ID: fmt.Sprintf("alloc-%d/web", i), AllocID: fmt.Sprintf("alloc-%d", i), JobID: "web",
			TaskGroupName: "g", Name: "web", Namespace: "default"}
		h := &taskHandle{cfg: cfg, dir: dir, done: make(chan struct{}), logger: hclog.NewNullLogger()}
		m.track(h, supervisorSpec{Run: shim.Spec{Config: shim.Config{Path: "nomad/jobs/web/lock"}}})
		snap := lockmetrics.Snapshot{WaitingSince: time.Now(), Acquisitions: map[string]uint64{"released": 3}}
		if i == 0 {
			snap = lockmetrics.Snapshot{Held: true, Fence: 9, HeldSince: time.Now(), LBRequests: map[string]uint64{"add/success": 1}}
			for range 50 {
				lockmetrics.ObserveIn(&snap.RenewLatency, lockmetrics.RenewDurationDesc, "renew", .01)
				lockmetrics.ObserveIn(&snap.FenceLeft, lockmetrics.FenceLeftDesc, "renew", 12)
			}
			lockmetrics.ObserveIn(&snap.LBLatency, lockmetrics.LBDurationDesc, "add", .2)
		}
		if err := writeJSON(dir, metricsFile, snap); err != nil {
			b.Fatal(err)
		}
	}
	handler := m.handler(hclog.NewNullLogger())
	b.ResetTimer()
	for range b.N {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept-Encoding", "gzip") // as Prometheus asks
		handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
		b.ReportMetric(float64(rec.Body.Len()), "bytes")
	}
}
