// Package statsmetrics is the one definition of the metrics an Engine's
// Stats are exported as, shared by every exporter (integrations/promdedup
// for Prometheus, integrations/oteldedup for OpenTelemetry).
//
// It owns the metric set: each metric's names (the Prometheus name and the
// OpenTelemetry instrument name), help, kind (counter, gauge, histogram),
// unit and label names, in the table Metrics; and the flattening of one
// engine.Stats into points of those metrics (Each), including which
// metrics a configuration has (the WAL's fsyncs and the disk only for the
// embedded store, the Bloom filters only with filters, the archive only
// with one). A metric added to Metrics and to Each reaches every exporter,
// and the exporters' tests, at once.
//
// It must never import an exporter's library (Prometheus, OpenTelemetry),
// read an Engine itself or hold state: an exporter reads Stats once per
// collection and hands them here. The engine, the tiers and shard must
// never import it.
//
// It is stateless: safe for concurrent use.
package statsmetrics
