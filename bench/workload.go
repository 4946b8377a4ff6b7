package bench

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
)

// ErrConfig reports an invalid WorkloadConfig.
var ErrConfig = errors.New("bench: invalid workload config")

// WorkloadConfig describes a stream of message keys.
type WorkloadConfig struct {
	// Keys is the number of keys in the stream.
	Keys int
	// DupRatio is the share of keys that repeat an earlier key, in [0, 1).
	DupRatio float64
	// DupDistance is how many keys back a duplicate may reach (uniformly);
	// small values model redeliveries seconds apart. Zero means 1000.
	DupDistance int
	// Seed makes the stream reproducible.
	Seed uint64
}

// Workload is a pre-generated key stream: Keys[i] is the i-th message's key,
// 36-byte UUIDv4 strings with the configured repeats.
type Workload struct {
	Keys [][]byte
	// Dups is the number of keys that repeat an earlier one.
	Dups int
}

// Generate builds the stream. All keys share one arena, so a 10M-key stream
// costs ≈ 600 MB (36 B of key and a 24 B slice header each).
func Generate(c WorkloadConfig) (*Workload, error) {
	if c.Keys < 0 || c.DupRatio < 0 || c.DupRatio >= 1 || c.DupDistance < 0 {
		return nil, fmt.Errorf("%w: %+v", ErrConfig, c)
	}
	if c.DupDistance == 0 {
		c.DupDistance = 1000
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7de))
	arena := make([]byte, 0, 36*c.Keys)
	w := &Workload{Keys: make([][]byte, c.Keys)}
	for i := range w.Keys {
		if i > 0 && rng.Float64() < c.DupRatio {
			w.Keys[i] = w.Keys[i-1-rng.IntN(min(i, c.DupDistance))]
			w.Dups++
			continue
		}
		start := len(arena)
		arena = appendUUIDv4(arena, rng)
		w.Keys[i] = arena[start:len(arena):len(arena)]
	}
	return w, nil
}

// appendUUIDv4 appends a random version-4 UUID in its 36-byte text form.
func appendUUIDv4(dst []byte, rng *rand.Rand) []byte {
	var u [16]byte
	for i := 0; i < 16; i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			u[i+j] = byte(v >> (8 * j))
		}
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return append(dst, s[:]...)
}
