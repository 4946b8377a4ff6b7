package hooks

import "sync/atomic"

// RebuildGate, when set, makes every Bloom rebuild wait for the channel to
// close before it starts (or its store to close).
var RebuildGate atomic.Pointer[chan struct{}]
