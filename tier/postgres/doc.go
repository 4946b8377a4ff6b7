// Package postgres is an exact tier shared by many processes in one
// PostgreSQL table, for teams whose system of record is PostgreSQL: claims,
// commits and releases of a whole batch are one statement each, fenced by
// the claim's owner token and leased by the server's clock, with the same
// answers as the Redis tier (tier.ClaimsInStore).
//
// It owns its table's rows and their layout. It must never answer Acquired
// for a key another live claim or commit holds, never let a token commit
// or release a key it does not hold, and never keep a reference to a
// caller's buffers.
//
// # Concurrency
//
// A Store is safe for concurrent use when its DB is (a *pgxpool.Pool).
// Batches lock their rows in key order, so concurrent batches cannot
// deadlock.
//
// # Invariants
//
//  1. Every time is the server's (clock_timestamp), so leases and expiries
//     do not depend on the clocks of the processes.
//  2. A row is a claim, a commit or an attempt count, and carries its
//     expiry; an expired row answers as absent before it is deleted.
//  3. A commit or release changes a row only when the request's token holds
//     it: a claim whose lease ended, or was taken over, gets Lost.
//  4. A row's key is the full key (up to MaxStoredKey bytes) or, for a
//     longer one, its SHA-256, in two forms that cannot meet.
//  5. The table records its format, window and MaxAttempts; a Store never
//     uses a table whose record disagrees or that it cannot vouch for.
//
// # Retention
//
// PostgreSQL cannot keep (namespace, key) unique across the partitions of a
// partitioned table (a unique index must include the partition key), and a
// uniqueness check across partitions would race at their boundaries, so the
// table is one heap and every row carries its expiry: an expired row is
// absent to every statement at once, and space is reclaimed by a sweep that
// the engine's partition rotation starts (Drop). The sweep runs in the
// background, deleting the expired rows of one block range per statement by
// a TID range scan: no index on the write path, and no claim waits behind a
// long delete. Its cost is a scan of the table per partition, not a cost
// per key on every write.
package postgres
