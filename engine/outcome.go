package engine

import (
	"crypto/sha256"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
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

// Claim is the answer to a claim for one key and, when Outcome is New, the
// handle that commits or releases it. The caller owns it; Key aliases the
// caller's key bytes, which must stay unchanged until Commit or Release: a
// claim whose key changed (a reused read buffer) is refused with
// ErrLeaseLost and changes nothing.
type Claim struct {
	Outcome Outcome
	// undo: New over the caller's own commit in a shared tier, made by a
	// mark whose reply was lost; a release must undo that commit.
	undo bool
	Key  []byte
	// LeaseUntil is when the claim stops excluding other workers, in Unix
	// nanoseconds of the engine's clock (New only).
	LeaseUntil int64
	// Result is a small result stored with the key's commit, so a
	// duplicate can answer what the first processing answered (an API's
	// response, a created resource's ID). For a New claim, set it before
	// Commit (at most Options.MaxResultSize bytes; empty stores none); for
	// a Duplicate or Conflict it is the result the key's commit stored,
	// nil if none (the caller's copy).
	Result []byte
	// CommittedAt is when the commit that stored Result was made, in Unix
	// nanoseconds of the committing engine's clock (Duplicate or Conflict
	// with a Result; zero otherwise).
	CommittedAt int64
	// Version is the entity's stored version (Advance): the one a New
	// claim replaces (0 for none), or the one that made the answer
	// Duplicate or Stale.
	Version uint64
	// advance: a claim of an entity's version (Advance): its release keeps
	// the version it replaced and counts no attempt.
	advance bool

	ns     *Namespace
	fp     shard.Fingerprint
	token  uint64 // the memory tier's claim
	rtoken uint64 // the counter of the Redis owner token (Tiers: Redis)
	// digest is the caller's payload digest, or, once a slower tier answered
	// Duplicate or Conflict (the claim is not owned and commits nothing),
	// the digest it found committed: a repeat of the key in the batch
	// compares its own with it.
	digest Digest
}

// Owned reports whether the caller holds the key and must Commit or Release.
func (c *Claim) Owned() bool { return c.Outcome == New }
