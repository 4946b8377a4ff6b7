// Package bloom is the probabilistic tier: one Bloom filter per retention
// partition, so a key that no filter may hold can skip the durable tier.
//
// # Layout
//
// The live partitions' filters are stored interleaved: each word holds
// lanes of Live bits, one lane per position, bit s of a lane belonging to
// the partition in slot s (partition mod Live). A key's k positions lie in
// two independently chosen blocks of at least 64 positions (one 64-byte
// cache line for windows of up to 8 live partitions, the default; 2 lines a
// block up to 16, 3 up to 21, 4 up to 32, 8 above), k/2 in each, so one
// probe reads at most two blocks and answers for every live partition at
// once: a new key's cost does not grow as the window fills. Blocking costs
// bits: Sizing sizes the filters by the blocked layout's own false-positive
// rate (at the default 1 % over 8 partitions, 15.5 bits a key where a
// classic filter needs 14). bits-and-blooms/bloom/v3 is kept for the
// encoding of a filter's bits in snapshots; its own layout, a filter per
// partition probed one after another, read up to 8 × k lines a new key.
//
// It owns the filters, their size (Options.Grow: a ring that starts at about
// a MiB and doubles as its partitions receive keys, up to the size
// ExpectedKeys asks for; growth.go), their rotation (which clears a dropped partition's
// slot before another partition takes it) and their snapshot encoding (all
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
// mutex, and wait for the adds still writing through the ring they replaced
// (each add counts itself on its ring, then checks the ring is current). A
// merge first publishes a marker that makes new adds wait, waits for the
// others, then copies the words, sets its bits in the copy and publishes it.
// A growth does the same with a ring twice (or more) as large, every block
// copied into its children.
//
// # Invariants
//
//  1. All live filters have the same size and hash count, so one set of
//     locations serves every partition. A ring grows whole: every block
//     copied into the blocks that replace it, where every key added before
//     finds all its bits (a key's block in a ring d times larger is one of
//     the d copies of its block), or, growing to the full size, the
//     newest partition's filter rebuilt from the log of every key added to
//     it; a filter without a complete log (an older partition's, or one
//     placed from a file) is copied. Growing never loses a key.
//  2. Rotation only moves forward: a partition number lower than the newest
//     seen never drops a filter.
//  3. A snapshot is loaded whole or not at all: its size, checksum, the
//     caller's acceptance of its meta (the store and epoch it describes, or
//     bloom-only's secret and clock) and its parameters are verified before
//     any filter is allocated.
//  4. MergeSnapshot only adds: each filter becomes the union of itself and
//     the snapshot's, so merging never removes a key.
//  5. A slot is cleared when its partition is dropped and before a later
//     partition is given it; clearing touches no other slot's bits, and
//     starts only when no add of the dropped partition is still writing,
//     so none of its bits survive into the slot's next partition.
//  6. A snapshot's filters are in the layout of its version: a file of
//     another version (ErrSnapshotVersion) puts a key's bits elsewhere and
//     is never loaded. Its size must be one of the ring's steps (the full
//     size when the ring does not grow): a smaller step is copied up, a
//     larger one grows the ring first, any other is refused
//     (ErrSnapshotParams).
package bloom
