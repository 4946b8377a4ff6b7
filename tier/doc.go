// Package tier is what the tiers share: the contract of an exact, durable
// tier (Backend, which opens it, and Exact, with its optional CommitWriter, Dropper, Scanner,
// Latching, Extender, Marker, ResultKeeper, Looker, Forgetter and
// Advancer), the vocabulary every tier answers in (Status, Digest, Token,
// Request, Answer), the errors the tiers and the engine share (ErrOptions,
// ErrLayout, ErrStorage, ErrLocked, and Classify for a backend's own), and
// how time is cut into retention partitions, the archive contract
// (Archive, ArchiveBackend, RecordScanner) for the history behind the
// window and the archiver that drives one (Archiver, ArchiverConfig,
// ArchiveStats, opened by OpenArchiver from the one tier/archive
// registers), and what the engine needs of a store it opens in its own
// process beside its Bloom filters (LocalBackend, Local, Filters,
// ArchiveSource, Handoff: the embedded store), so the engine imports no
// store and no archive. It holds no state and orders nothing but that one
// registration; the engine decides which tier is asked what.
//
// A shared tier reaches the engine as a Backend, built by the caller in the
// tier's own package and opened by the engine with an Env: adding one means
// implementing Exact (and the optional interfaces it can offer) and
// Backend there, and passing the tiertest contract suite. The engine names
// no shared tier, so its import graph holds none of their clients.
//
// # Concurrency
//
// Every type here is an immutable value, safe for concurrent use; Exact's
// own rules are in its documentation.
//
// # Invariants
//
//  1. A key written in partition p is kept until partition p+Live begins, so
//     it stays a duplicate for at least the window and at most window plus
//     one partition.
//  2. Partition numbers come from a clock that never moves back (the engine's
//     high-water clock), so a clock step backwards cannot expire a partition.
package tier
