// Package pebble is the durable, exact tier of one process: committed keys
// in two Pebble databases of one directory that the process opens
// exclusively: the hot one takes every write, the cold one (Dir/cold)
// holds the sealed partitions, moved there once each (cold.go), so the
// LSM that today's writes compact holds about one partition whatever the
// window. The hot database's tables carry Pebble's Bloom filters (a read
// skips the levels a key is not in); the cold database's do not: a read
// reaches a sealed partition only where the engine's own filter says the
// key may be there, so a table filter would only load its block to agree.
//
// It owns the on-disk layout (partition ‖ namespace ‖ key, so retention is
// one range deletion per expired span of partitions), the versioned value
// encoding, the store's recorded Layout (partition length, window,
// fingerprint secret, store ID, format version), snapshot epoch and
// partition seals, the moves of sealed partitions, the journal of
// fingerprints and the record of the filters' checkpoint (journal.go),
// WAL durability and the translation of every Pebble failure into
// ErrStorage; and ArchiveDir, the embedded archive (archive.go): closed
// partitions kept as immutable tables in a Pebble database of another
// directory. It must never hold claims in flight (the engine's memory tier
// does, and an exclusive directory makes them void at the next open anyway),
// never compare fingerprints instead of key bytes, and never exit the
// process: a Pebble fatal error or panic inside a call of this package (its
// own background compaction included) becomes ErrStorage and the Store
// refuses every call from then on.
//
// # Failures: fail closed, or Pebble's fail stop
//
// A write that fails (a WAL write or sync) latches: it and every write in
// flight beside it return ErrStorage, and so does every later call, within
// the time of one write; none waits forever. This rests on admitting one
// batch at a time into Pebble's commit pipeline (a batch that failed there
// stays at the pipeline's head, and Pebble would keep every batch behind
// it waiting); syncs are still shared. A broken Store is abandoned, not
// closed (closing would wait on that pipeline): the process exits and a
// new one opens the directory, as after a crash.
//
// Two failures are Pebble's own to handle, and its policy is to stop the
// process: a WAL that fails while Pebble rotates to a new one (when a
// memtable fills), and a MANIFEST that cannot be written (a flush or a
// compaction, Pebble's own background work). The process exits; nothing
// acknowledged is lost, because an acknowledged write was synced to the
// WAL before its call returned, and the next Open replays it (the
// engine's TestStorageFaultChild kills children both ways and finds every
// acknowledged key after the restart).
//
// # Concurrency
//
// A Store is safe for concurrent use. Concurrent synced writes share WAL
// fsyncs (each batch waits for its sync outside the pipeline's entry).
// Close must not race with other calls.
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
//  8. A partition is in the cold database only once sealed, and is read
//     from exactly one database at a time: it leaves the hot one only
//     after an ingest that holds all of it (atomic, with its marker) is
//     durable, and a reader's hot iterator predates its look at the
//     boundary while its cold iterator follows it. A cold database of
//     another store, or none where the hot one recorded a move, is
//     refused at Open (ErrLayout). Every partition up to the newest moved
//     one is read from the cold database: the mover skips a partition only
//     when it left the window (Drop deletes it next), and with
//     Options.KeepExpired (an archive that has not taken it yet) only when
//     a Drop deleted it.
//  9. With Options.Journal, every batch that writes records journals
//     their fingerprints in the same batch, and SaveFilterCheckpoint trims
//     the journal up to the generation it records in the same batch: the
//     checkpoint's generation and the journal after it always hold every
//     key written since the checkpoint's files were taken. A store opened
//     without the journal deletes its checkpoint record.
//  10. After CloseWrites(before) returns, no record is written in a
//     partition before `before`: a batch of records is checked against
//     the floor as it enters the commit pipeline (under the one entry
//     lock), and CloseWrites returns only after a synced batch behind
//     every batch that entered before it. The floor lives in the process
//     (a call in flight does not outlive it).
package pebble
