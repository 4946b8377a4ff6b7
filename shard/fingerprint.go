package shard

import (
	"github.com/cespare/xxhash/v2"
)

// Fingerprint is the 128-bit name of a namespaced key. Two 64-bit xxhash
// lanes make it; at 7×10⁹ keys in a window the chance that any two keys
// share a fingerprint is about 7×10⁻²⁰, which is why an in-memory tier may
// answer Duplicate on a fingerprint match (DESIGN.md, invariant 2) while a
// 64-bit hash alone may not.
type Fingerprint struct {
	Hi, Lo uint64
}

// stackKey is the longest namespaced key hashed from a stack buffer in one
// xxhash call per lane; longer ones are streamed. 128 bytes covers UUIDs,
// numeric IDs and typical business keys with a short namespace.
const stackKey = 128

// Sum returns the fingerprint of key in namespace ns: with p = len(ns) ‖ ns ‖
// key, Hi = xxh64(p) and Lo = xxh64(p ‖ 0xff). ns may be empty (the default
// namespace) and must be at most 255 bytes; callers validate it. Sum does not
// allocate when ns is a string or the key is short.
func Sum[NS ~string | ~[]byte](ns NS, key []byte) Fingerprint {
	n := 1 + len(ns) + len(key)
	if n < stackKey {
		var buf [stackKey]byte
		buf[0] = byte(len(ns))
		copy(buf[1:], ns)
		copy(buf[1+len(ns):], key)
		buf[n] = 0xff
		return Fingerprint{Hi: xxhash.Sum64(buf[:n]), Lo: xxhash.Sum64(buf[:n+1])}
	}
	pre := [1]byte{byte(len(ns))}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.Write(pre[:])
	_, _ = d.WriteString(string(ns))
	_, _ = d.Write(key)
	hi := d.Sum64()
	pre[0] = 0xff
	_, _ = d.Write(pre[:])
	return Fingerprint{Hi: hi, Lo: d.Sum64()}
}

// IsZero reports whether f is the zero fingerprint.
func (f Fingerprint) IsZero() bool { return f.Hi == 0 && f.Lo == 0 }
