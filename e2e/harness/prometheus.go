package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/promtooltest"
)

// Prometheus is a real Prometheus server (Debian's prometheus package; `make
// prometheus` installs it), started by a test on a free port of the
// harness's band with its own temp storage, and killed by PID when the test
// ends. Its targets are file targets that the test may rewrite (SetTargets):
// Prometheus rereads them within a second.
type Prometheus struct {
	Addr string // host:port of its HTTP API
	// ScrapeInterval is the interval of every scrape and rule evaluation.
	ScrapeInterval time.Duration

	dir  string
	proc *Process
	mu   sync.Mutex
}

// PrometheusOptions shape a Prometheus.
type PrometheusOptions struct {
	// ScrapeInterval of every job and of rule evaluation (default 1s).
	ScrapeInterval time.Duration
	// Jobs are the scrape jobs, by name, each with its first targets
	// (host:port; none is fine).
	Jobs map[string][]string
	// Rules are rule files' contents, loaded as written.
	Rules []string
}

// StartPrometheus starts a Prometheus server and waits until it is ready.
// Without the prometheus binary the test fails, unless SINGLETON_NO_PROMTOOL=1
// (promtooltest.SkipEnv) lets it skip.
func StartPrometheus(t testing.TB, opts PrometheusOptions) *Prometheus {
	t.Helper()
	promtooltest.Path(t) // the same package, the same rule for a missing one
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("harness: prometheus not found: install Debian's prometheus package (make prometheus)")
	}
	if opts.ScrapeInterval == 0 {
		opts.ScrapeInterval = time.Second
	}
	p := &Prometheus{Addr: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), ScrapeInterval: opts.ScrapeInterval, dir: t.TempDir()}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n  scrape_timeout: %s\n",
		opts.ScrapeInterval, opts.ScrapeInterval, opts.ScrapeInterval)
	cfg.WriteString("rule_files:\n")
	for i, r := range opts.Rules {
		name := filepath.Join(p.dir, "rules-"+strconv.Itoa(i)+".yml")
		if err := os.WriteFile(name, []byte(r), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&cfg, "  - %s\n", name)
	}
	cfg.WriteString("scrape_configs:\n")
	for job, targets := range opts.Jobs {
		p.SetTargets(t, job, targets...)
		fmt.Fprintf(&cfg, "  - job_name: %s\n    honor_labels: true\n    file_sd_configs:\n      - refresh_interval: 1s\n        files: [%s]\n",
			job, p.targetsFile(job))
	}
	config := filepath.Join(p.dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtooltest.Run(t, nil, "check", "config", config)
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(p.dir, "data"),
		"--web.listen-address="+p.Addr, "--log.level=warn")
	p.proc = StartProcess(t, cmd)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + p.Addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if p.proc.Exited() || time.Now().After(deadline) {
			t.Fatalf("harness: prometheus not ready within 60s: %s", p.proc.Stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus's log:\n%s", p.proc.Stderr())
		}
	})
	return p
}

func (p *Prometheus) targetsFile(job string) string {
	return filepath.Join(p.dir, "targets-"+job+".json")
}

// SetTargets makes targets the scrape job's targets.
func (p *Prometheus) SetTargets(t testing.TB, job string, targets ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal([]map[string][]string{{"targets": append([]string{}, targets...)}})
	tmp := p.targetsFile(job) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p.targetsFile(job)); err != nil {
		t.Fatal(err)
	}
}

// PromSample is one series of a query's answer: its labels, and its value
// at the query's time (Value) or its samples (Values, for a range vector).
type PromSample struct {
	Metric map[string]string
	Value  float64
	// Values are a range vector's samples, oldest first.
	Values []PromPoint
}

// PromPoint is one sample.
type PromPoint struct {
	Time  time.Time
	Value float64
}

// Query runs an instant query now.
func (p *Prometheus) Query(t testing.TB, expr string) []PromSample {
	t.Helper()
	out, err := p.query(expr)
	if err != nil {
		t.Fatalf("harness: prometheus query %s: %v", expr, err)
	}
	return out
}

func (p *Prometheus) query(expr string) ([]PromSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var ans struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []struct {
				Metric map[string]string
				Value  [2]any
				Values [][2]any
			}
		}
	}
	if err := json.Unmarshal(body, &ans); err != nil || ans.Status != "success" {
		return nil, fmt.Errorf("answer %s: %v %s", body, err, ans.Error)
	}
	var out []PromSample
	for _, r := range ans.Data.Result {
		s := PromSample{Metric: r.Metric}
		if ans.Data.ResultType == "matrix" {
			for _, v := range r.Values {
				s.Values = append(s.Values, point(v))
			}
		} else {
			s.Value = point(r.Value).Value
		}
		out = append(out, s)
	}
	return out, nil
}

func point(v [2]any) PromPoint {
	ts, _ := v[0].(float64)
	str, _ := v[1].(string)
	f, _ := strconv.ParseFloat(str, 64)
	return PromPoint{Time: time.Unix(0, int64(ts*1e9)), Value: f}
}

// WaitQuery runs expr until ok accepts its answer, within timeout, and
// returns that answer.
func (p *Prometheus) WaitQuery(t testing.TB, what, expr string, timeout time.Duration, ok func([]PromSample) bool) []PromSample {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []PromSample
	var err error
	for {
		last, err = p.query(expr)
		if err == nil && ok(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: prometheus: not %s within %s: %s answered %+v (%v)", what, timeout, expr, last, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Scrape reads target's /metrics as Prometheus would, for a check of its
// own (promtooltest.CheckMetrics).
func Scrape(t testing.TB, target string) []byte {
	t.Helper()
	code, body := HTTPGet(t, "http://"+target+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("harness: scrape %s: HTTP %d: %s", target, code, body)
	}
	return []byte(body)
}

// HTTPGet GETs url and returns the answer's status and body.
func HTTPGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("harness: GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("harness: GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
