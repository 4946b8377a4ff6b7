// Package oteldedup exports an Engine's Stats as OpenTelemetry metrics,
// and traces its Do and DoResult calls as OpenTelemetry spans.
//
// Register makes an observable instrument of each metric promdedup exports
// (the same set, defined once in internal/statsmetrics, flattened from the
// same Stats), with one callback that reads Stats once per collection:
// counters are Int64ObservableCounters, gauges Float64ObservableGauges;
// labels become attributes of the same names and values. Tracer adapts a
// TracerProvider to engine.Options.Tracer: a span "tierdedup.Do" or
// "tierdedup.DoResult" per call, with its namespace, outcome and whether
// the handler ran, status Error and the error recorded when it failed.
//
// The Prometheus metrics and their OpenTelemetry instruments (both
// prefixed "tierdedup", one per line):
//
//	Prometheus                                     OpenTelemetry                                  unit
//	tierdedup_claims_total{outcome}                tierdedup.claims                               {key}
//	tierdedup_commits_total                        tierdedup.commits                              {claim}
//	tierdedup_releases_total                       tierdedup.releases                             {claim}
//	tierdedup_lease_expiries_total                 tierdedup.lease.expiries                       {claim}
//	tierdedup_lease_lost_total                     tierdedup.lease.lost                           {call}
//	tierdedup_tier_lookups_total{tier,result}      tierdedup.tier.lookups                         {key}
//	tierdedup_errors_total                         tierdedup.errors                               {call}
//	tierdedup_fail_open_total                      tierdedup.fail_open                            {key}
//	tierdedup_done_panics_total                    tierdedup.done_panics                          {call}
//	tierdedup_commit_groups_total                  tierdedup.commit.groups                        {group}
//	tierdedup_commit_queue_depth                   tierdedup.commit.queue.depth                   {call}
//	tierdedup_commit_batch_seconds (sum)           tierdedup.commit.batch.duration.sum            s
//	tierdedup_commit_batch_seconds (count)         tierdedup.commit.batch.duration.count          {group}
//	tierdedup_wal_fsync_seconds (sum)              tierdedup.wal.fsync.duration.sum               s
//	tierdedup_wal_fsync_seconds (count)            tierdedup.wal.fsync.duration.count             {fsync}
//	tierdedup_lookups_total                        tierdedup.lookups                              {key}
//	tierdedup_forgets_total                        tierdedup.forgets                              {key}
//	tierdedup_memory_entries{kind}                 tierdedup.memory.entries                       {entry}
//	tierdedup_bloom_state{state}                   tierdedup.bloom.state                          1
//	tierdedup_bloom_bytes                          tierdedup.bloom.size                           By
//	tierdedup_bloom_estimated_false_positive_ratio tierdedup.bloom.estimated_false_positive_ratio 1
//	tierdedup_bloom_partition_false_positive_ratio{partition,kind} tierdedup.bloom.partition.false_positive_ratio 1
//	tierdedup_bloom_partition_keys{partition}      tierdedup.bloom.partition.keys                 {key}
//	tierdedup_bloom_recommended_expected_keys      tierdedup.bloom.recommended_expected_keys      {key}
//	tierdedup_bloom_over_target_total              tierdedup.bloom.over_target                    {filter}
//	tierdedup_refreshes_total                      tierdedup.refreshes                            {key}
//	tierdedup_window_seconds                       tierdedup.window.duration                      s
//	tierdedup_window_coverage_ratio                tierdedup.window.coverage                      1
//	tierdedup_archive_partitions                   tierdedup.archive.partitions                   {partition}
//	tierdedup_archive_lag_partitions               tierdedup.archive.lag                          {partition}
//	tierdedup_archive_keys_total                   tierdedup.archive.keys                         {key}
//	tierdedup_archive_reads_total{result}          tierdedup.archive.reads                        {key}
//	tierdedup_archive_lag_reads_total              tierdedup.archive.lag_reads                    {key}
//	tierdedup_archive_failures_total               tierdedup.archive.failures                     {pass}
//	tierdedup_archive_filter_bytes                 tierdedup.archive.filter.size                  By
//	tierdedup_archive_log_entries                  tierdedup.archive.log.entries                  {entry}
//	tierdedup_archive_drainer                      tierdedup.archive.drainer                      1
//	tierdedup_archive_log_passes_total             tierdedup.archive.log.passes                   {pass}
//	tierdedup_disk_bytes{kind}                     tierdedup.disk.usage                           By
//
// The two histograms are exported as their sum and count only, each an
// observable counter: OpenTelemetry has no asynchronous histogram, and a
// synchronous one would have to be fed from the engine's hot path. Their
// rate gives the mean latency; the buckets are Prometheus' alone. As in
// Prometheus, a metric the configuration lacks (the WAL and the disk
// without the embedded store, the filters without filters, the archive
// without one) reports no point.
//
// It owns the OpenTelemetry side of the metric set (instrument kinds,
// the histograms' split, the scope name ScopeName, constant attributes),
// the span names and attributes of the engine's calls, and nothing else.
// It must never feed an instrument from the engine's calls, run anything
// between collections, record a key, or change the engine; and it costs
// nothing without a provider: Register with a nil MeterProvider registers
// nothing, Tracer of a nil TracerProvider is a nil engine.Tracer, which
// the engine never calls.
//
// Safe for concurrent use: a collection may run while the engine does
// (each reads the engine's atomic counters and Pebble's metrics), and the
// Tracer is called from every goroutine that calls Do. Unregister when
// the engine closes.
package oteldedup
