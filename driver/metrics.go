package driver

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics/prom"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The plugin's metrics (plugin config metrics_addr, docs/operations.md):
// the plugin serves /metrics for every task it supervises. Each task's
// supervisor counts its own run (shim's metrics hook) and writes the
// count to metrics.json in its state dir (metricsWriter); at each scrape
// the plugin reads those files, adds what it counted itself from the task
// events it words (crash releases, lease takeovers, the watchdog) and its
// standby's view of a lease-mode heartbeat, and hands the families
// (internal/lockmetrics) to client_golang. A task's series go once the task
// is destroyed, or stoppedRetention after it stopped.

// stoppedRetention is how long a stopped task's series stay (held 0): long
// enough for a "no holder" alert to see a job whose only holder stopped,
// and for a scrape to see what the plugin counted as the task ended (a
// crash release).
const stoppedRetention = 10 * time.Minute

// metricsFile is the supervisor's metrics (lockmetrics.Snapshot).
const metricsFile = "metrics.json"

// pluginMetrics is the plugin's side of the metrics: per task, what it
// counted itself and where the supervisor's count is.
type pluginMetrics struct {
	mu    sync.Mutex
	tasks map[string]*taskMetrics // by task ID

	serveMu sync.Mutex
	addr    string
	srv     *http.Server
	cancel  context.CancelFunc
}

// taskMetrics is one task's.
type taskMetrics struct {
	h      *taskHandle
	labels lockmetrics.Labels
	counts lockmetrics.PluginCounts // under pluginMetrics.mu
	// destroyed: Nomad destroyed the task (under pluginMetrics.mu).
	destroyed bool

	// mu keeps a read of dir from its close: a closed fd's number may be
	// another directory's by the time of the read.
	mu  sync.Mutex
	dir *securefs.Dir // the task's state dir, opened for the metrics alone; nil once destroyed
	// last is the supervisor's count as last read: a destroyed task's.
	last *lockmetrics.Snapshot
}

// track adds a started or recovered task. Its state dir is opened again,
// so that a scrape never reads through a dir the task's handle closed. A
// task Nomad restarts in place keeps what the plugin counted for it.
func (m *pluginMetrics) track(h *taskHandle, spec supervisorSpec) {
	dir, err := securefs.OpenPrivate(h.dir.Path(), false)
	if err != nil {
		h.logger.Warn("metrics: cannot open the task's state dir; its supervisor's metrics are left out", "error", err)
		dir = nil
	}
	c := h.cfg
	tm := &taskMetrics{h: h, dir: dir, labels: lockmetrics.Labels{Namespace: cmp.Or(c.Namespace, "default"),
		Job: cmp.Or(c.ParentJobID, c.JobID), Group: c.TaskGroupName, Task: c.Name, AllocID: c.AllocID, Path: spec.Run.Path}}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tasks == nil {
		m.tasks = map[string]*taskMetrics{}
	}
	if old := m.tasks[c.ID]; old != nil {
		old.closeDir()
		tm.counts = old.counts
		tm.counts.StandbyWatching = false
	}
	m.tasks[c.ID] = tm
}

// forget is DestroyTask's: the task's series stay until stoppedRetention
// after it stopped (Nomad destroys a task it restarts in place, too, and
// the plugin's counts of it must go on), from what was last read of it.
func (m *pluginMetrics) forget(taskID string) {
	m.mu.Lock()
	tm := m.tasks[taskID]
	if tm != nil {
		tm.destroyed = true
	}
	var destroyed []*taskMetrics
	for _, other := range m.tasks {
		if other.destroyed {
			destroyed = append(destroyed, other)
		}
	}
	m.mu.Unlock()
	if tm == nil {
		return
	}
	tm.mu.Lock()
	tm.last = tm.snapshotLocked()
	tm.mu.Unlock()
	tm.closeDir()
	// Without scrapes, nothing else drops the destroyed tasks' entries.
	now := time.Now()
	for _, other := range destroyed {
		if _, old := other.stopped(now); old {
			m.drop(other)
		}
	}
}

func (tm *taskMetrics) closeDir() {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.dir != nil {
		tm.dir.Close()
		tm.dir = nil
	}
}

// eventCounts are the task events the plugin words that it counts, by kind.
var eventCounts = map[string]func(*lockmetrics.PluginCounts){
	evCrashReleased.ID:     func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.CrashReleases, "released") },
	evCrashNotReleased.ID:  func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.CrashReleases, "not_released") },
	evCrashLeftToExpire.ID: func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.CrashReleases, "left_to_expire") },
	evCrashGateLockKept.ID: func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.CrashReleases, "kept") },
	evLeaseTakeover.ID:     func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.LeaseTakeovers, "taken") },
	evLeaseNoTakeover.ID:   func(p *lockmetrics.PluginCounts) { lockmetrics.Count(&p.LeaseTakeovers, "skipped") },
	evWatchdog.ID:          func(p *lockmetrics.PluginCounts) { p.WatchdogKills++ },
	evWatchdogGate.ID:      func(p *lockmetrics.PluginCounts) { p.WatchdogKills++ },
}

// taskEvent counts a task event of a kind eventCounts lists.
func (m *pluginMetrics) taskEvent(taskID, msg string) {
	k, ok := events.Classify(msg)
	count := eventCounts[k.ID]
	if !ok || count == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if tm := m.tasks[taskID]; tm != nil {
		count(&tm.counts)
	}
}

// standby records what the task's lease-mode standby saw of the
// heartbeat: unchanged for age; watching false once it stopped watching.
func (m *pluginMetrics) standby(taskID string, watching bool, age time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if tm := m.tasks[taskID]; tm != nil {
		tm.counts.StandbyWatching, tm.counts.HeartbeatAge = watching, age
	}
}

// gather is every task's metrics now.
func (m *pluginMetrics) gather(now time.Time) []lockmetrics.Task {
	m.mu.Lock()
	tms := make([]*taskMetrics, 0, len(m.tasks))
	counts := make([]lockmetrics.PluginCounts, 0, len(m.tasks))
	for _, tm := range m.tasks {
		tms = append(tms, tm)
		counts = append(counts, tm.counts.Clone())
	}
	m.mu.Unlock()
	out := make([]lockmetrics.Task, 0, len(tms))
	for i, tm := range tms {
		exited, stale := tm.stopped(now)
		if stale {
			m.drop(tm)
			continue
		}
		out = append(out, lockmetrics.Task{Labels: tm.labels, Snap: tm.snapshot(), Exited: exited, Plugin: &counts[i]})
	}
	return out
}

// drop removes a stale task's entry, unless a restart replaced it.
func (m *pluginMetrics) drop(tm *taskMetrics) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tasks[tm.h.cfg.ID] == tm {
		tm.closeDir()
		delete(m.tasks, tm.h.cfg.ID)
	}
}

// stopped reports whether the task's supervisor has exited, and whether
// that was longer than stoppedRetention ago.
func (tm *taskMetrics) stopped(now time.Time) (exited, stale bool) {
	if !tm.h.exited() {
		return false, false
	}
	tm.h.mu.Lock()
	at := tm.h.completedAt
	tm.h.mu.Unlock()
	return true, !at.IsZero() && now.Sub(at) > stoppedRetention
}

// snapshot is the supervisor's count; for a supervisor that writes none
// (started while metrics were off), held and fence from its status.
func (tm *taskMetrics) snapshot() *lockmetrics.Snapshot {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.snapshotLocked()
}

func (tm *taskMetrics) snapshotLocked() *lockmetrics.Snapshot {
	var s lockmetrics.Snapshot
	if tm.last != nil {
		return tm.last
	}
	if tm.dir != nil && readJSON(tm.dir, metricsFile, &s) == nil {
		return &s
	}
	st := tm.h.lastStatus()
	state := shim.State(st.State)
	s.Held, s.Fence = state.Holds() || state == shim.StateStopping, st.Fence
	return &s
}

// handler is /metrics: the tasks' families, and the plugin process's own
// (its memory, file descriptors and Go runtime).
func (m *pluginMetrics) handler(log hclog.Logger) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prom.NewCollector(m.gather), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, ErrorLog: promLogger{log}})
}

type promLogger struct{ log hclog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn("metrics", "error", v) }

// metricsRetry is the wait before another try to listen on metrics_addr.
const metricsRetry = 5 * time.Second

// serve serves /metrics on addr ("" serves nothing), in place of what it
// served before. A port in use (say, by the plugin instance Nomad is
// replacing) is tried again every metricsRetry: the plugin itself is not
// held up.
func (m *pluginMetrics) serve(ctx context.Context, addr string, log hclog.Logger) {
	m.serveMu.Lock()
	defer m.serveMu.Unlock()
	if addr == m.addr {
		return
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.addr, m.cancel = addr, nil
	if addr == "" {
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	log = log.With("metrics_addr", addr)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.handler(log))
	go func() {
		for {
			ln, err := (&net.ListenConfig{}).Listen(sctx, "tcp", addr)
			if err == nil {
				srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
				go func() {
					<-sctx.Done()
					_ = srv.Close()
				}()
				log.Info("serving /metrics")
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("metrics server stopped", "error", err)
				}
				return
			}
			log.Error("plugin config metrics_addr: cannot listen; trying again", "error", err, "retry", metricsRetry)
			select {
			case <-sctx.Done():
				return
			case <-time.After(metricsRetry):
			}
		}
	}()
}

// metricsWriter writes a supervisor's metrics to metrics.json as they
// change, from a goroutine of its own (the count's changes come from the
// lease's goroutines, which must never wait on a disk), at most every
// metricsWriteEvery.
type metricsWriter struct {
	dir *securefs.Dir
	log hclog.Logger
	// snapshot is the count now (the run's Metrics').
	snapshot func() lockmetrics.Snapshot
	kick     chan struct{}
}

// metricsWriteEvery paces the writes of metrics.json.
const metricsWriteEvery = 50 * time.Millisecond

// newMetricsWriter writes the metrics of the run env counts them for.
func newMetricsWriter(dir *securefs.Dir, log hclog.Logger, env *shim.Env) *metricsWriter {
	w := &metricsWriter{dir: dir, log: log, kick: make(chan struct{}, 1)}
	m := shim.NewMetrics(func() {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	})
	env.Metrics, w.snapshot = m, m.Snapshot
	go func() {
		for range w.kick {
			w.flush()
			time.Sleep(metricsWriteEvery)
		}
	}()
	return w
}

// flush writes the count now.
func (w *metricsWriter) flush() {
	if err := writeJSON(w.dir, metricsFile, w.snapshot()); err != nil {
		w.log.Debug("write metrics", "error", err)
	}
}
