package engine

import (
	"crypto/sha256"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Outcome is the answer for one key.
type Outcome uint8

// Outcomes. The zero value is not an outcome: a Claim left zero by an error
// has none.
const (
	// New: first time inside the window. The caller owns the key under a
	// lease and must Commit or Release it.
	New Outcome = iota + 1
	// Duplicate: committed inside the window. Skip it (and ack it).
	Duplicate
	// InFlight: another claim holds the key now, perhaps an earlier copy in
	// the same batch. Do not ack; the redelivery will find it committed, or
	// free again if that worker fails.
	InFlight
	// Conflict: committed inside the window with a different payload
	// digest. The same key carried other content: report it rather than
	// skip it silently.
	Conflict
	// Poison: the key's claims were released, or left to expire, MaxAttempts
	// times within the window: its handler keeps failing. Nothing was
	// claimed; dead-letter the message instead of redelivering it forever.
	Poison
	// Stale (Advance only): the entity's stored version is higher than
	// the one offered: an older event arriving after a newer one was
	// applied. Skip it (and ack it).
	Stale
)

var outcomeNames = [...]string{"", "new", "duplicate", "in-flight", "conflict", "poison", "stale"}

// String returns the outcome's name.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Digest is an optional 128-bit digest of a message's payload, stored with
// its commit; the zero value means none. Make one with DigestOf or from a
// hash the producer already sends. Every tier stores it whole, as this one
// type.
type Digest = tier.Digest

// DigestOf returns the first 128 bits of the SHA-256 of payload.
func DigestOf(payload []byte) Digest {
	sum := sha256.Sum256(payload)
	return Digest(sum[:16])
}

// conflicts reports whether a stored digest contradicts a requested one,
// comparing all 128 bits (every tier keeps the full digest, so memory and
// disk give the same answer); either being absent means no conflict can be
// told.
func conflicts(requested, stored Digest) bool {
	return requested != (Digest{}) && stored != (Digest{}) && requested != stored
}
