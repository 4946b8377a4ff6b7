package tier

import (
	"bytes"
	"errors"
	"fmt"
)

// Digest is a message payload's 128-bit digest, stored whole with a
// commit by every tier; the zero value means none.
type Digest [16]byte

// Token is a claim's owner token: unique across processes (the engine makes
// it from a random process ID and a per-claim counter).
type Token [16]byte

// EarlierOf reports whether held is one of the tokens a retry adopts
// (Request.Earlier): earlier is set, held has token's process (its first 8
// bytes), and earlier <= held < token, as bytes (the counter is big-endian).
func EarlierOf(earlier, token, held Token) bool {
	return earlier != (Token{}) && [8]byte(held[:8]) == [8]byte(token[:8]) &&
		bytes.Compare(held[:], earlier[:]) >= 0 && bytes.Compare(held[:], token[:]) < 0
}

// Status is what a tier knows of one key after a call: the vocabulary every
// tier answers in.
type Status uint8

// Statuses.
const (
	// Acquired: the key was free (unknown, its committed entry expired, or
	// held by this very token) and now holds the caller's claim.
	Acquired Status = iota + 1
	// TakenOver is Acquired where an earlier claim's lease had expired.
	TakenOver
	// Held: another claim with an unexpired lease holds the key.
	Held
	// Committed: committed inside the window.
	Committed
	// Lost: the caller's token does not hold the key: its lease expired,
	// another owner took over, or the claim was already settled.
	Lost
	// OK: a commit, release or settling step took effect.
	OK
	// Poisoned: the key's claims were released (or let expire) MaxAttempts
	// times inside the window: no claim was made.
	Poisoned
	// Absent: a tier whose claims live in the engine holds no record of
	// the key.
	Absent
	// Released: a tier whose claims live in the engine holds the key's
	// attempt count, and no commit.
	Released
)

var statusNames = [...]string{"", "acquired", "taken-over", "held", "committed", "lost", "ok", "poisoned", "absent", "released"}

// String returns the status's name.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", s)
}

// MaxAttempts bounds an attempt limit: counts are stored in 16 bits.
const MaxAttempts = 1<<16 - 1

// ErrAttempts reports an attempt limit outside [0, MaxAttempts].
var ErrAttempts = errors.New("tier: invalid attempt limit")

// CheckAttempts is the one rule for an attempt limit (zero counts nothing).
func CheckAttempts(n int) error {
	if n < 0 || n > MaxAttempts {
		return fmt.Errorf("%w: MaxAttempts %d is outside [0, %d]", ErrAttempts, n, MaxAttempts)
	}
	return nil
}
