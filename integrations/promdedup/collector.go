package promdedup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/statsmetrics"
)

// Collector is a prometheus.Collector of one Engine's Stats.
type Collector struct {
	e     *engine.Engine
	descs map[string]*prometheus.Desc
}

// New returns a Collector of e's Stats; constLabels (may be nil) are added
// to every metric, to tell engines of one process apart (for example
// {"engine": "payments"}).
func New(e *engine.Engine, constLabels prometheus.Labels) *Collector {
	c := &Collector{e: e, descs: map[string]*prometheus.Desc{}}
	for _, m := range statsmetrics.Metrics {
		c.descs[m.Name] = prometheus.NewDesc("tierdedup_"+m.Name, m.Help, m.Labels, constLabels)
	}
	return c
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect reads Stats once and sends every metric (the set and its
// flattening are internal/statsmetrics', shared with oteldedup).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	statsmetrics.Each(&s, func(p statsmetrics.Point) {
		d := c.descs[p.Metric.Name]
		switch p.Metric.Kind {
		case statsmetrics.Counter:
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(p.Count), p.Labels...)
		case statsmetrics.Gauge:
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, p.Value, p.Labels...)
		case statsmetrics.Histogram:
			h := p.Histogram
			buckets := make(map[float64]uint64, len(h.Bounds))
			for i, b := range h.Bounds {
				buckets[b] = h.Counts[i]
			}
			ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets, p.Labels...)
		}
	})
}
