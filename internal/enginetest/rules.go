package enginetest

import (
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
)

// The reference model's rules: what one key may answer, from what the
// engine acknowledged of it. Every model in the engine's tests asks these
// (the conformance suite's, the linearizability checker's, the
// partition-move world's, the memory tier's, TestAdvance's script); the
// models differ only in how they observe a run: one call at a time with
// crashes and windows, or concurrent histories where a call's time is an
// interval. A change to what the engine promises is a change here, and
// every model follows it.

// Conflicts reports a request's digest that contradicts the stored one:
// both given and different (Conflict). A key committed without a digest,
// or a request without one, never conflicts.
func Conflicts(requested, stored engine.Digest) bool {
	return requested != (engine.Digest{}) && stored != (engine.Digest{}) && requested != stored
}

// LeaseMayLive reports whether a lease ending at until may still hold
// during a call whose engine time starts at t0: a lease holds while the
// engine's time is before its end.
func LeaseMayLive(until, t0 int64) bool { return until > t0 }

// LeaseMayEnd reports whether a lease ending at until may have ended
// during a call whose engine time reaches t1.
func LeaseMayEnd(until, t1 int64) bool { return until <= t1 }

// Poisoned reports a key whose failed claims reached MaxAttempts (max 0:
// attempts are not counted, never poisoned).
func Poisoned(attempts uint16, max int) bool { return max > 0 && int(attempts) >= max }

// Counted is attempts after one more failed claim (a release, a lease
// left to end): one more where attempts are counted.
func Counted(attempts uint16, max int) uint16 {
	if max > 0 {
		return attempts + 1
	}
	return attempts
}

// AdvanceOutcome is what an Advance offering version offered answers of a
// free entity whose stored version is stored: a higher version is New, the
// same one Duplicate, a lower one Stale.
func AdvanceOutcome(stored, offered uint64) engine.Outcome {
	switch {
	case offered > stored:
		return engine.New
	case offered == stored:
		return engine.Duplicate
	}
	return engine.Stale
}

// Retention is how long a committed key stays a Duplicate: the engine's
// partitions and window, or a namespace's own window (Exact), which is
// judged by the key's age.
type Retention struct {
	Parts tier.Partitions
	// Window is the engine's window; Exact, when set, a namespace's own.
	Window, Exact time.Duration
}

// Held reports a key committed at engine time at that must still be a
// Duplicate at now: younger than the window.
func (r Retention) Held(at, now int64) bool {
	if r.Exact > 0 {
		return now-at < int64(r.Exact)
	}
	return now-at < int64(r.Window)
}

// Gone reports a key committed at at that must be New at now: its
// partition left the window (retention drops whole partitions), or it is
// older than a namespace's own window. Between Held and Gone a key may be
// either.
func (r Retention) Gone(at, now int64) bool {
	if r.Exact > 0 {
		return now-at >= int64(r.Exact)
	}
	return now >= r.Parts.Expiry(r.Parts.Of(at))
}
