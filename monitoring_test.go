package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/promtooltest"
)

// monitoringDir holds the Prometheus and Grafana examples.
const monitoringDir = "examples/monitoring"

// TestMonitoringExamples: the scrape config and the alert rules pass
// promtool's checks, the rules' unit tests (singleton-rules_test.yml) pass,
// and the rules, the Grafana dashboard and docs/operations.md name only
// metrics that exist, and the page every one that does.
func TestMonitoringExamples(t *testing.T) {
	dir := filepath.Join(monitoringDir)
	promtooltest.Run(t, nil, "check", "config", filepath.Join(dir, "prometheus.yml"))
	promtooltest.Run(t, nil, "check", "rules", filepath.Join(dir, "singleton-rules.yml"))
	// promtool test rules reads the rule files relative to the test file.
	promtooltest.Run(t, nil, "test", "rules", filepath.Join(dir, "singleton-rules_test.yml"))

	known := map[string]bool{"nomad_singleton:lock_holders:sum": true}
	for _, d := range slices.Concat(lockmetrics.Supervisor, lockmetrics.PluginFamilies) {
		known[d.Name] = true
		if d.Kind == lockmetrics.KindHistogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[d.Name+s] = true
			}
		}
	}
	name := regexp.MustCompile(`nomad_singleton[a-z_:]*`)
	check := func(file, text string) {
		for _, n := range name.FindAllString(text, -1) {
			if !known[n] {
				t.Errorf("%s names %s, which no family declares (internal/lockmetrics)", file, n)
			}
		}
	}
	rules, err := os.ReadFile(filepath.Join(dir, "singleton-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	check("singleton-rules.yml", string(rules))

	raw, err := os.ReadFile(filepath.Join(dir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	exprs := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs++
			check("grafana-dashboard.json panel "+p.Title, tg.Expr)
		}
	}
	if exprs == 0 {
		t.Error("grafana-dashboard.json: no panel queries anything")
	}

	page, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	check("docs/operations.md", string(page))
	for _, d := range slices.Concat(lockmetrics.Supervisor, lockmetrics.PluginFamilies) {
		if !strings.Contains(string(page), "`"+d.Name+"`") {
			t.Errorf("docs/operations.md does not list %s", d.Name)
		}
	}
	for _, alert := range regexp.MustCompile(`alert: (\w+)`).FindAllStringSubmatch(string(rules), -1) {
		if !strings.Contains(string(page), "`"+alert[1]+"`") {
			t.Errorf("docs/operations.md does not say what %s means and what to do", alert[1])
		}
	}
}
