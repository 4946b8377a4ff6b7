// Package memory is the in-process exact tier: a lock-striped table of
// 128-bit fingerprints that holds every claim in flight and an LRU with TTL
// of recently committed keys.
//
// It owns the answer to "is this key claimed right now?" for one process and
// is the lock that makes a claim atomic across tiers: the engine acquires a
// claim here first, and only then consults slower tiers while the entry keeps
// every other caller out. It must never decide that a key is new on its own
// behalf (only the engine, knowing the configuration, may), never evict a
// claim, and never import another tier.
//
// # Concurrency
//
// A Table is safe for concurrent use. Each stripe has its own mutex; a batch
// call takes each stripe's mutex at most once, in stripe order, and never
// holds two at a time.
//
// # Layout
//
// Each stripe keeps its entries (56 B: the fingerprint, a token or digest,
// a deadline, LRU links, state and attempts) in one slab, and indexes them
// with an open-addressing table of 8-byte slots: an entry's index and the
// 32-bit hash of its fingerprint. A probe walks adjacent slots comparing
// hashes and reads an entry only where the hash matches, so a lookup
// touches the slots' cache line and, for a key present, its entry's; an
// insert or a backward-shift deletion reads no entry. The index holds at
// most 0.75 of its slots and is sized to its entries (a hash finds its
// home slot by multiplication), about 11 B a key.
//
// # Invariants
//
//  1. A claim stays until it is committed, released, abandoned or replaced
//     after its lease expired; capacity pressure evicts committed entries only.
//     Mark (claim and commit in one visit, for a table that is the only
//     tier) evicts once a stripe's keys of the batch are all answered, so
//     within one call a stripe may hold more committed entries than its
//     share of the capacity, and no key of the batch loses what it held to
//     another key's commit.
//  2. A committed entry is never reported after its expiry.
//  3. Within one batch, keys are applied in batch order, so a repeated key
//     sees the effect of its earlier occurrence.
//  4. Fingerprints and payload digests are compared at all 128 bits.
//  5. With MaxAttempts, a key's attempt count (releases and lease expiries)
//     is kept until the keep time the caller gives, whichever made it
//     poison; a slower tier's count can raise it (Settle), never lower it.
package memory
