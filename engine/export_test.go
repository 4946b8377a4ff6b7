package engine

import "time"

// Capabilities names the optional tier capabilities the engine found.
func (e *Engine) Capabilities() (dropper, marker bool) { return e.dropper != nil, e.marker != nil }

// HoldCommits holds the commit queue's writer back until the returned
// function is called: what is enqueued meanwhile is written as one group.
func HoldCommits() (release func()) {
	gate := make(chan struct{})
	holdCommits.Store(&gate)
	return func() { holdCommits.Store(nil); close(gate) }
}

// Sealed reports whether the partition of t is sealed; false while a
// sealing pass runs.
func (e *Engine) Sealed(t time.Time) bool {
	return e.local != nil && e.local.Sealed(e.parts.Of(t.UnixNano()))
}
