package enginetest

import (
	"sync/atomic"

	"github.com/tierdedup/tierdedup/internal/hooks"
)

// SetRebuildGate makes every later Bloom rebuild wait for gate to close
// before it starts, so tests can observe the cold state; nil removes it.
func SetRebuildGate(gate chan struct{}) {
	if gate == nil {
		hooks.RebuildGate.Store(nil)
		return
	}
	hooks.RebuildGate.Store(&gate)
}

// SetBeforeDurable runs fn in every durable write after the engine's time
// is read and before anything is written; nil removes it.
func SetBeforeDurable(fn func()) { setHook(&hooks.BeforeDurable, fn) }

// SetMarkBeforeCommit sets (nil: clears) the hook MarkBatch runs between
// its claim and its commit.
func SetMarkBeforeCommit(fn func()) { setHook(&hooks.MarkBeforeCommit, fn) }

// SetNoRestore makes every Open after an unclean shutdown rebuild the open
// partitions' filters by a scan, ignoring the checkpoint and the journal
// (the path taken when they are damaged).
func SetNoRestore(on bool) { hooks.NoRestore.Store(on) }

// SetCheckpointKeys sets the keys between two checkpoints of the open
// partitions' filters (0: the store's own choice).
func SetCheckpointKeys(n int64) { hooks.CheckpointKeys.Store(n) }

// SetInCheckpoint and SetInMove set the functions a checkpoint and a move
// call at their critical point (nil: none).
func SetInCheckpoint(f func()) { setHook(&hooks.InCheckpoint, f) }

// SetBeforeCheckpoint sets (nil: clears) the function the checkpointer
// calls before each checkpoint of the open partitions' filters starts: a
// test that blocks in it decides when each checkpoint starts. Release it
// before the store closes: Close waits for the checkpointer.
func SetBeforeCheckpoint(f func()) { setHook(&hooks.BeforeCheckpoint, f) }

// SetInMove: see SetInCheckpoint.
func SetInMove(f func()) { setHook(&hooks.InMove, f) }

func setHook(h *atomic.Pointer[func()], f func()) {
	if f == nil {
		h.Store(nil)
		return
	}
	h.Store(&f)
}
