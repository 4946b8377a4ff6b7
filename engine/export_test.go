package engine

import (
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/internal/hooks"
)

// SetRebuildGate makes every later Bloom rebuild wait for gate to close
// before it starts, so tests can observe the cold state.
func SetRebuildGate(gate chan struct{}) {
	if gate == nil {
		hooks.RebuildGate.Store(nil)
		return
	}
	hooks.RebuildGate.Store(&gate)
}

// Capabilities names the optional tier capabilities the engine found.
func (e *Engine) Capabilities() (dropper, marker bool) { return e.dropper != nil, e.marker != nil }

// HoldCommits holds the commit queue's writer back until the returned
// function is called: what is enqueued meanwhile is written as one group.
func HoldCommits() (release func()) {
	gate := make(chan struct{})
	holdCommits.Store(&gate)
	return func() { holdCommits.Store(nil); close(gate) }
}

// SetBeforeDurable runs fn in every durable write after the engine's time
// is read and before anything is written; nil removes it.
func SetBeforeDurable(fn func()) {
	if fn == nil {
		beforeDurable.Store(nil)
		return
	}
	beforeDurable.Store(&fn)
}

// Sealed reports whether the partition of t is sealed; false while a
// sealing pass runs.
func (e *Engine) Sealed(t time.Time) bool {
	return e.local != nil && e.local.Sealed(e.parts.Of(t.UnixNano()))
}

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

// SetInMove: see SetInCheckpoint.
func SetInMove(f func()) { setHook(&hooks.InMove, f) }

func setHook(h *atomic.Pointer[func()], f func()) {
	if f == nil {
		h.Store(nil)
		return
	}
	h.Store(&f)
}
