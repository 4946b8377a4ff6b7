// Package promdedup exports an Engine's Stats as Prometheus metrics.
//
// It owns the Prometheus side of the metric set, and nothing else: the
// "tierdedup_" prefix, the descriptions and constant labels, and turning
// points into Prometheus metrics. The set itself (names, help, labels)
// and the flattening of Stats into points are internal/statsmetrics',
// shared with oteldedup, so both export the same values. A Collector
// reads Stats once per scrape and keeps no state, so it adds nothing to
// the engine's hot path. It must not change the engine or hold it open:
// register it for as long as the engine runs.
//
// Safe for concurrent use: Prometheus may scrape while the engine runs;
// each scrape reads the engine's atomic counters and Pebble's metrics.
package promdedup
