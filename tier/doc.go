// Package tier is the vocabulary the tiers share: how time is cut into
// retention partitions. It holds no state and orders nothing; the engine
// decides which tier is asked what.
//
// # Concurrency
//
// Every type here is an immutable value, safe for concurrent use.
//
// # Invariants
//
//  1. A key written in partition p is kept until partition p+Live begins, so
//     it stays a duplicate for at least the window and at most window plus
//     one partition.
//  2. Partition numbers come from a clock that never moves back (the engine's
//     high-water clock), so a clock step backwards cannot expire a partition.
package tier
