// Package bench generates realistic dedup workloads (key shapes, duplicate
// ratios and how far back duplicates reach) and holds the go test
// benchmarks that compare every engine configuration with the tables users
// replace.
//
// It owns workloads and measurement. It must never be imported by the
// engine or a tier, and it keeps no global state: every workload is a value
// built from a config.
//
// # Concurrency
//
// A Workload is immutable once generated and safe for concurrent reads.
package bench
