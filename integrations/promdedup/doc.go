// Package promdedup exports an Engine's Stats as Prometheus metrics.
//
// It owns the mapping from engine.Stats to metric names and labels, and
// nothing else: a Collector reads Stats once per scrape and keeps no
// state, so it adds nothing to the engine's hot path. It must not change
// the engine or hold it open: register it for as long as the engine runs.
//
// Safe for concurrent use: Prometheus may scrape while the engine runs;
// each scrape reads the engine's atomic counters and Pebble's metrics.
package promdedup
