// Package bench generates realistic dedup workloads (key shapes and sizes,
// duplicate ratios and how far back duplicates reach), runs them through an
// engine and checks every answer (Run), turns a calibration run into a
// capacity plan (Calibrate, MakePlan), reproduces the crash table (Crash),
// and holds the go test benchmarks that compare every engine configuration
// with the tables users replace. The clients of those tables (Redis,
// PostgreSQL) live in cmd/dedupbench, which drives bench.Baseline.
//
// It owns workloads and measurement. It must never be imported by the
// engine or a tier, and it keeps no global state: every workload is a value
// built from a config.
//
// # Concurrency
//
// A Workload is immutable once generated and safe for concurrent reads.
package bench
