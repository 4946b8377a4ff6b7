package hooks

import "sync/atomic"

// RebuildGate, when set, makes every Bloom rebuild wait for the channel to
// close before it starts (or its store to close).
var RebuildGate atomic.Pointer[chan struct{}]

// CheckpointKeys, when positive, replaces the number of keys between two
// checkpoints of the open partitions' filters, so a test sees many.
var CheckpointKeys atomic.Int64

// InCheckpoint, when set, is called by a checkpoint of the open
// partitions' filters once their files are saved and before the store
// records them; InMove by a move of a sealed partition into the cold
// database once it is ingested and before the hot database forgets it.
// A kill test stops a process there.
var InCheckpoint, InMove atomic.Pointer[func()]

// BeforeCheckpoint, when set, is called by the checkpointer before each
// checkpoint of the open partitions' filters, before it takes a lock or
// resets its count of keys, so a test decides when each one starts (and
// so which keys it covers).
var BeforeCheckpoint atomic.Pointer[func()]

// NoRestore, when set, makes an Open after an unclean shutdown ignore the
// filter checkpoint and the journal, and rebuild the open partitions by a
// scan of the store, as it does when the checkpoint is damaged: the tests
// of that path set it.
var NoRestore atomic.Bool

// InArchive, when set, is called by the archiver (tier/archive) at each stage of
// archiving a partition: "put" (inside the archive's Put, at its first
// record), "held" (Put returned, the partition not yet visible as
// archived), "blob" (its filter blob saved) and "drop" (before the exact
// tier drops what the archive holds). A kill test stops a process there.
var InArchive atomic.Pointer[func(stage string)]

// BeforeDurable, when set, runs in every durable write of the engine
// (commits, attempt counts, refreshes) after its time is read and before
// anything is written, so a test can hold one there.
var BeforeDurable atomic.Pointer[func()]

// MarkBeforeCommit, when set, runs in MarkBatch between its claim (the
// keys decided, their memory claims held) and its commit, so a test can
// hold a mark there while leases end.
var MarkBeforeCommit atomic.Pointer[func()]
