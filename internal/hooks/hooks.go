// Package hooks holds the points where tests of this module hold the
// engine's background work back, so they can observe a state that is
// otherwise brief. It owns those variables and nothing else: production
// code only reads them, and nothing outside the module can reach them.
// It must never hold behaviour of its own.
package hooks

import "sync/atomic"

// RebuildGate, when set, makes every Bloom rebuild wait for the channel to
// close before it starts (or its store to close).
var RebuildGate atomic.Pointer[chan struct{}]
