// Package embedded is the engine's embedded default: a directory holding a
// Pebble store (tier/pebble, the exact tier) and the Bloom filters in
// front of it (tier/bloom), with everything that exists only because the
// two live together in one directory of one process: which filters are
// complete (warm, rebuilding, cold), the snapshot a clean Close leaves, the
// seals of closed partitions, the checkpoints of the open ones and their
// restore after a crash, the rebuild when those cannot be used, the process's
// registry of open directories, and the directory's handoff to another
// process (Export, Import, ReadExport). With Options.BloomOnly it is the
// filters alone, their state saved in the directory.
//
// It owns that lifecycle and the files it writes, and it is the one owner
// of its partitions' lives (life.go): open, closed, sealed, moved,
// archived, dropped, each recorded durably, each moved on by an event (a
// rotation, a seal, the archive's progress), and every drop decided in
// one place from the window and the archive's reach. It must never decide an
// outcome (the engine does, from Masks and the exact tier's answers), hold
// a claim, or answer "absent" from a filter that has not seen every key
// the store holds. It names no shared tier. The engine opens it as a
// tier.LocalBackend (Backend, embedded.Dir) and drives it through package
// tier's interfaces (Local, Filters, ArchiveSource, Handoff), never
// through its types.
//
// # Concurrency
//
// A Store is safe for concurrent use between Start and Close: Masks, Add,
// Rotate, Enter and Exit from many goroutines, with the sealer and the
// rebuild running in the background. Open, Start and Close are the
// owner's, once each, in that order; no write may run during Close.
//
// # Invariants
//
//  1. The filters answer "no" (a zero mask that proves a key absent) only
//     while warm: restored from the snapshot of the exact store state they
//     were saved with (the store's ID and the epoch it sealed at a clean
//     Close, forgotten by the next Open before anything is written; the
//     file is removed whatever the outcome), or rebuilt from Pebble. While
//     rebuilding, every key is read from Pebble in each partition being
//     rebuilt, and in the others where their complete filter says maybe.
//     The engine's own invariants call this its invariant 4.
//  2. Every key reaches the filters before the write that stores it
//     (Add before the durable write), so a warm filter has seen every key
//     the store holds.
//  3. A closed partition's filter is saved once no write can reach that
//     partition (every write that read the time before the rotation has
//     exited the write gate: Enter and Exit bracket each write), with a
//     seal in the store naming the file; after a crash each file its seal
//     vouches for is loaded and the other partitions are rebuilt. The
//     store refuses writes into a sealed partition.
//  4. What makes a file invalid, and who checks: a snapshot of another
//     store or another state (Open refuses it and rebuilds); a sealed file
//     without its seal, or of another store, partition, checksum, size or
//     filter parameters (Open removes it and rebuilds that partition);
//     bloom-only state of other parameters (Open refuses it, ErrLayout) or
//     damaged (Open refuses it, ErrStorage); an export whose files differ
//     from its manifest (Import refuses it, ErrExport, and writes nothing).
//  5. One store per directory: Pebble's lock (bloom-only: its own lock
//     file) excludes other processes, and the registry of open directories
//     makes Import refuse a directory this process holds, under any
//     spelling of its path.
//  6. An Import a crash interrupted is completed or undone by the next
//     Import or Open of its destination, which never finds the
//     destination missing.
//  7. A checkpoint of the open partitions' filters is taken only while
//     warm, after the write gate drained every write of the journal
//     generation it names, and is trusted after a crash only with the
//     journal after that generation and only for the files the store's
//     record names (ID, checksum, size, store, partition): a file
//     missing, damaged, foreign or of an earlier checkpoint is not
//     trusted, and its partition is rebuilt by a scan (checkpoint.go).
package embedded
