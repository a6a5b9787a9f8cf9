// Package prom hands internal/lockmetrics' families to
// prometheus/client_golang: the plugin's /metrics. A package of its own, so
// that `lock`, which writes the text format itself, links no client_golang.
package prom

import (
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/lockmetrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector collects the families of the tasks gather returns, at each
// scrape. It is unchecked (Describe sends nothing): its series come and go
// with tasks.
type Collector struct {
	gather func(now time.Time) []lockmetrics.Task
	mu     sync.Mutex
	descs  map[*lockmetrics.Desc]*prometheus.Desc
}

// NewCollector returns the Collector of the tasks gather returns.
func NewCollector(gather func(now time.Time) []lockmetrics.Task) *Collector {
	return &Collector{gather: gather, descs: map[*lockmetrics.Desc]*prometheus.Desc{}}
}

// Describe sends nothing (an unchecked collector).
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect sends every sample of every family.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, f := range lockmetrics.Gather(c.gather(now), now) {
		desc := c.desc(f.Desc)
		for _, s := range f.Samples {
			var metric prometheus.Metric
			var err error
			switch f.Desc.Kind {
			case lockmetrics.KindHistogram:
				metric, err = prometheus.NewConstHistogram(desc, s.Hist.Count, s.Hist.Sum, s.Buckets(f.Desc), s.Labels...)
			case lockmetrics.KindCounter:
				metric, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, s.Value, s.Labels...)
			default:
				metric, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, s.Value, s.Labels...)
			}
			if err == nil {
				ch <- metric
			}
		}
	}
}

func (c *Collector) desc(d *lockmetrics.Desc) *prometheus.Desc {
	c.mu.Lock()
	defer c.mu.Unlock()
	pd := c.descs[d]
	if pd == nil {
		pd = prometheus.NewDesc(d.Name, d.Help, d.LabelNames(), nil)
		c.descs[d] = pd
	}
	return pd
}
