// Package bench generates realistic dedup workloads (key shapes and sizes,
// duplicate ratios and how far back duplicates reach), runs them through an
// engine and checks every answer (Run), turns a calibration run into a
// capacity plan (Calibrate, MakePlan), measures what a default engine
// costs as it fills (MeasureFootprint), reproduces the crash table (Crash),
// and holds the go test benchmarks that compare every engine configuration
// with the tables users replace. The clients of those tables (Redis,
// PostgreSQL) live in cmd/dedupbench, which drives bench.Baseline; the
// embedded store's own write path alone is PebbleBaseline; a run
// on a shared tier takes its server's client from the caller
// (SharedServer).
//
// # Shared tiers
//
// A run or a calibration on a shared tier (RunConfig.Shared,
// CalibrateConfig.Shared: a Redis client, Cluster included, or a
// PostgreSQL pool) opens the engine on that tier behind memory, over keys
// of its own: a fresh Redis prefix of the default prefix's length, or a
// fresh PostgreSQL table (NewSharedTier). At the end it measures the
// server (Result.Shared): Redis's memory as the growth of INFO memory
// used_memory since the start, summed over every master, and PostgreSQL's
// as pg_table_size + pg_indexes_size of the table; then it deletes the
// keys or drops the table unless SharedServer.Keep is set.
//
// A shared tier expires keys by the server's clock, and a run covers days
// of simulated time in seconds: over more than a window, the server would
// still hold keys a real deployment would have expired. So a run on a
// shared tier measures what it can honestly, and refuses the rest
// (CheckShared, ErrConfig): its stream's span stays within the window, so
// every key it committed is held at the end (as in real time), and the
// bytes it reports are per held key; an archive, which needs partitions
// to leave the window, is refused. A plan for a load then extrapolates:
// Redis holds the window's keys (IDs a day × the window, each key expiring
// by its TTL), PostgreSQL the window's and one partition's (an expired row
// is swept at the next partition rotation), each at the bytes a key and
// with the fixed heap its calibration measured on the server given, and
// at the calibration's keys/s. Neither measures expiry's own cost (Redis's
// expire cycle, PostgreSQL's sweep deleting a partition's rows).
//
// It owns workloads and measurement. It must never be imported by the
// engine or a tier, and it keeps no global state: every workload is a value
// built from a config.
//
// # Concurrency
//
// A Workload is immutable once generated and safe for concurrent reads.
package bench
