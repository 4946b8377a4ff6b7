// Package pebble is the durable, exact tier of one process: committed keys
// in a Pebble database that the process opens exclusively.
//
// It owns the on-disk layout (partition ‖ namespace ‖ key, so retention is
// one range deletion per expired span of partitions), the versioned value
// encoding, the store's recorded Layout (partition length, window,
// fingerprint secret, store ID, format version), snapshot epoch and
// partition seals, WAL durability and the translation of every Pebble
// failure into ErrStorage. It must never hold claims in flight (the engine's memory tier
// does, and an exclusive directory makes them void at the next open anyway),
// never compare fingerprints instead of key bytes, and never exit the
// process: a Pebble fatal error or panic inside a call of this package (its
// own background compaction included) becomes ErrStorage and the Store
// refuses every call from then on. Pebble's internal background work (flushes
// and compactions it schedules itself) can still abort the process on a
// fatal error; that is Pebble's policy for a corrupt or unwritable store.
//
// # Concurrency
//
// A Store is safe for concurrent use. Concurrent synced writes share WAL
// fsyncs through Pebble's commit pipeline (group commit). Close must not
// race with other calls.
//
// # Invariants
//
//  1. Write returns nil only after the records are in the WAL and, unless
//     Options.NoSync, the WAL is fsynced.
//  2. Claim compares full key bytes and answers the newest committed or
//     released (attempt count) record; a claimed record is treated as
//     absent.
//  3. Drop removes whole partitions with one range deletion; it never
//     removes a partition at or after the one it is given.
//  4. After the first storage error, read or write, every call that reads
//     or writes records fails with ErrStorage: Pebble clears an iterator's
//     error at its next seek, so Claim checks it after every positioning
//     call, and a read that failed is never taken for an absent key.
//  5. Open refuses a store whose recorded partition length differs, whose
//     window is longer than requested, or whose format version is another
//     (ErrLayout); a longer window is recorded.
//  6. A snapshot epoch sealed by SealSnapshot is returned by the next
//     TakeSnapshotEpoch only, which deletes it (synced) before any other
//     write.
//  7. A partition is sealed (SealPartition, synced) only before the
//     partition of the persisted clock, and from then on no record is
//     written in it or before it (ErrSealed), across reopens; Drop deletes
//     seals with their partitions. So a seal never describes fewer records
//     than its partition holds.
package pebble
