package shard

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// ErrStripes reports a stripe count that is not a power of two in [1,
// MaxStripes].
var ErrStripes = errors.New("shard: invalid stripe count")

// MaxStripes bounds the stripe count: beyond it the per-stripe overhead
// dominates and no 2-core machine gains from more locks.
const MaxStripes = 1 << 16

// Secret keys a Hasher (persisted with a store, since Bloom filters and
// snapshots depend on the fingerprints it gives) or a Router (chosen per
// process: stripes live only in memory).
type Secret [16]byte

// NewSecret returns a random Secret from crypto/rand.
func NewSecret() Secret {
	var s Secret
	_, _ = rand.Read(s[:]) // crypto/rand.Read never fails on supported platforms.
	return s
}

// Router maps fingerprints onto stripes. The zero value maps everything to
// stripe 0; use NewRouter.
type Router struct {
	k0, k1 uint64
	mask   uint64
}

// CheckStripes is the one rule for a stripe count: a power of two in [1,
// MaxStripes]. It returns an error matching ErrStripes otherwise.
func CheckStripes(n int) error {
	if n < 1 || n > MaxStripes || n&(n-1) != 0 {
		return fmt.Errorf("%w: Stripes %d is not a power of two in [1, %d]", ErrStripes, n, MaxStripes)
	}
	return nil
}

// NewRouter returns a Router over n stripes keyed by secret.
func NewRouter(secret Secret, n int) (Router, error) {
	if err := CheckStripes(n); err != nil {
		return Router{}, err
	}
	return Router{
		k0:   binary.LittleEndian.Uint64(secret[:8]),
		k1:   binary.LittleEndian.Uint64(secret[8:]),
		mask: uint64(n - 1),
	}, nil
}

// Stripes returns the number of stripes.
func (r Router) Stripes() int { return int(r.mask) + 1 }

// Stripe returns the stripe of f, in [0, Stripes()). Both fingerprint lanes
// pass through a keyed multiply-xorshift, so an attacker who can make keys
// agree in some bits of the unkeyed hash, without knowing the secret, cannot
// predict which stripe they land on.
func (r Router) Stripe(f Fingerprint) int {
	hi, lo := bits.Mul64(f.Hi^r.k0, f.Lo^r.k1|1)
	return int(Mix(hi^lo^r.k0) & r.mask)
}

// Mix is the splitmix64 finaliser: every input bit affects every output bit.
// Tiers use it to derive positions (hash-table slots) from fingerprint bits
// mixed with a secret, so they need no hash of their own.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
