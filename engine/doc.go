// Package engine is the public API of tierdedup and the only place that
// orders tiers: for every message key it answers, atomically, whether this
// is the first time inside the retention window (New: process it), a
// Duplicate (skip it), InFlight (another worker holds it now) or a Conflict
// (the key was committed with a different payload).
//
// Around that answer it offers what handlers and operators need: a small
// result stored with a commit and returned with every Duplicate (DoResult),
// Lookup and Forget, namespaces with windows of their own, versioned
// entities (Advance: New only for a higher version, Stale for an older
// one), one-time tokens (IssueToken, ConsumeToken), and Stats.
//
// It holds the memory table and at most one exact tier (tier.Exact), which
// a tier.Backend in Options.Backend opens: the embedded default
// (embedded.Dir(dir), package tier/embedded: Pebble behind Bloom filters,
// where claims live in the engine; a tier.LocalBackend, driven through the
// tier.Local, tier.Filters, tier.ArchiveSource and tier.Handoff
// interfaces), or a shared tier (tier/redis, tier/postgres: many
// processes, claims live in the store); bloom-only holds the embedded
// store's filters alone. It imports no store, so a memory-only program
// links no storage engine. The configuration matters only in
// Open and Options.Validate. It owns claims, leases and owner tokens, the
// clock, partition rotation, the group commit, the fail-open layer of a
// shared tier, and Stats; the filters' lifecycle is the embedded store's.
// It must never let a probabilistic tier decide Duplicate in a
// configuration that promises exactness, never decide New from the Bloom
// filters unless they have seen every key the durable tier holds, and
// never acknowledge a commit before the durable tier has.
//
// # Concurrency
//
// An Engine and its Namespaces are safe for concurrent use. A Claim is a
// value owned by the caller that received it.
//
// # Invariants
//
//  1. Check-and-set is atomic: the memory tier's stripe lock installs a
//     claim before any slower tier is consulted, so of N concurrent claims
//     of a key exactly one is New.
//  2. Commit and Release succeed only for the current owner of an unexpired
//     lease; otherwise they return ErrLeaseLost and change nothing.
//  3. Duplicate comes from an exact source: a 128-bit fingerprint in memory,
//     SipHash-2-4-128 keyed by a secret the store keeps (so nobody without
//     it can build two keys that share one), or full key bytes in Pebble,
//     Redis and PostgreSQL (a key over 1 KiB by its SHA-256 there).
//     Payload digests are compared at all 128 bits everywhere.
//     Only the bloom-only configuration, which says so, answers Duplicate
//     from a filter.
//  4. The Bloom filters answer New only while warm: they have seen every
//     key the durable tier holds. Package embedded owns how (its
//     invariants 1 to 3: the snapshot, the seals, the rebuild); the engine
//     asks it for masks and adds every key to it before the durable write.
//  5. Time never runs backwards inside an engine: it uses the highest clock
//     reading seen (persisted with each partition drop, and in bloom-only
//     state), so a clock step back neither expires leases late nor drops
//     partitions early.
//  6. After a storage failure, read or write, the engine answers ErrStorage
//     and never New until it is reopened.
//  7. A directory records its layout (partition length, window, secret,
//     format version; configuration and filter parameters of bloom-only
//     state) and Open refuses a mismatch with ErrLayout, except a longer
//     window, which keeps every key at least as long as promised.
//  8. A call to a shared tier (Redis, PostgreSQL) returns by the caller's
//     deadline; a claim (or an Advance) that failed as unavailable is
//     retried with the same owner token, so a claim the tier applied
//     meanwhile is recognised as the caller's own.
//  9. Names starting with a NUL byte are the engine's own namespaces
//     (versions, tokens): callers cannot name them, so no key of theirs
//     meets a version or a token.
//  10. With an archive (Options.Archive), the exact tier drops a partition
//     only after the archive holds it durably, a key is in the archive's
//     filter before its partition counts as archived, and a key the exact
//     tier leaves New is answered New only after the archive (where its
//     filter may hold the key) and the unarchived partitions past the
//     window said absent; an archive that cannot answer fails the call.
//     Behind Redis, every archived commit is appended to the tier's log in
//     the script that makes it, the log is trimmed only up to what the
//     archive recorded applied, and a key Redis let go is answered New
//     only once every partition it could be in is sealed in this engine's
//     filter. Package tier/archive holds the details and the recorded
//     state (its doc.go); the engine drops below the archive's Next only.
package engine
