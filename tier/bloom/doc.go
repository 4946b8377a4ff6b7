// Package bloom is the probabilistic tier: one bits-and-blooms filter per
// retention partition, probed with locations computed once per key from its
// fingerprint, so a key that no filter may hold can skip the durable tier.
//
// It owns the filters, their rotation and their snapshot encoding (all
// filters, or one partition's, which MergeSnapshot adds to the others). It must never
// answer "seen": a probe says which partitions may hold a key, and only an
// exact tier may turn that into Duplicate. Whether a "no" may be trusted (the
// filters saw every key the durable tier holds) is the engine's decision, not
// this package's.
//
// # Concurrency
//
// Filters is safe for concurrent use. Probes and adds read an immutable ring
// of filters without locking and test or set bits with atomic operations;
// rotation, a new partition's filter and restore publish a new ring under a
// mutex.
//
// # Invariants
//
//  1. All live filters have the same size and hash count, so one set of
//     locations serves every partition.
//  2. Rotation only moves forward: a partition number lower than the newest
//     seen never drops a filter.
//  3. A snapshot is loaded whole or not at all: its size, checksum, the
//     caller's acceptance of its meta (the store and epoch it describes, or
//     bloom-only's secret and clock) and its parameters are verified before
//     any filter is allocated.
//  4. MergeSnapshot only adds: each filter becomes the union of itself and
//     the snapshot's, so merging never removes a key.
package bloom
