package shard

import (
	"encoding/binary"
	"sync"

	"github.com/dchest/siphash"
)

// Fingerprint is the 128-bit name of a namespaced key: the output of
// SipHash-2-4-128, a keyed pseudorandom function, under the store's Secret.
// Without the secret nobody can build two keys that share a fingerprint
// (SipHash's 128-bit key is the only way to predict its output), and for
// keys nobody crafted the chance that any two of n share one is about
// n²/2¹²⁹: 7×10⁻²⁰ for 7×10⁹ keys in a window. That is why an in-memory
// tier may answer Duplicate on a fingerprint match (the engine's invariant 3)
// while a 64-bit hash may not. Hi and Lo are the two output words; as words
// of one PRF output neither predicts the other.
type Fingerprint struct {
	Hi, Lo uint64
}

// Hasher computes fingerprints under one secret. The zero value hashes
// under the all-zero secret: use it only in tests. A Hasher is an immutable
// value, safe for concurrent use.
type Hasher struct {
	k0, k1 uint64
}

// NewHasher returns the Hasher keyed by secret.
func NewHasher(secret Secret) Hasher {
	return Hasher{k0: binary.LittleEndian.Uint64(secret[:8]), k1: binary.LittleEndian.Uint64(secret[8:])}
}

// stackKey is the longest namespaced key hashed from a stack buffer; longer
// ones use a pooled buffer. 128 bytes covers UUIDs, numeric IDs and typical
// business keys with a short namespace.
const stackKey = 128

var longKeys = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Sum returns the fingerprint of key in namespace ns: SipHash-2-4-128 of
// len(ns) ‖ ns ‖ key under the hasher's secret. ns may be empty (the default
// namespace) and must be at most 255 bytes; callers validate it. Sum does
// not allocate.
func Sum[NS ~string | ~[]byte](h Hasher, ns NS, key []byte) Fingerprint {
	n := 1 + len(ns) + len(key)
	if n <= stackKey {
		var buf [stackKey]byte
		buf[0] = byte(len(ns))
		copy(buf[1:], ns)
		copy(buf[1+len(ns):], key)
		hi, lo := siphash.Hash128(h.k0, h.k1, buf[:n])
		return Fingerprint{Hi: hi, Lo: lo}
	}
	bp := longKeys.Get().(*[]byte)
	b := append(append(append((*bp)[:0], byte(len(ns))), ns...), key...)
	hi, lo := siphash.Hash128(h.k0, h.k1, b)
	*bp = b[:0]
	longKeys.Put(bp)
	return Fingerprint{Hi: hi, Lo: lo}
}

// IsZero reports whether f is the zero fingerprint.
func (f Fingerprint) IsZero() bool { return f.Hi == 0 && f.Lo == 0 }
