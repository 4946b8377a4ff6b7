package engine

import (
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

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

// WarnFilter reports p as Stats would at the engine's time, and logs the
// warning the engine gives a filter found over its target.
func (e *Engine) WarnFilter(p tier.FilterStats) BloomPartition {
	now, err := e.now()
	if err != nil {
		panic(err)
	}
	e.warnFilter(p, now)
	return e.bloomPartition(p, now)
}
