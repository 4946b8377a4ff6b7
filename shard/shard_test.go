package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/dchest/siphash"
)

// testSecret is the fixed secret of the golden vectors.
var testSecret = Secret{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// TestSumGolden freezes the fingerprint function: Bloom snapshots and every
// in-memory answer depend on it, so a change here must be deliberate and
// versioned (the stores record a format version). The first vector is
// SipHash-2-4-128's published test vector for the one-byte message 00 under
// key 00 01 … 0f (da87c1d86b99af44 347659119b22fc45, little endian).
func TestSumGolden(t *testing.T) {
	h := NewHasher(testSecret)
	tests := []struct {
		ns, key string
		want    Fingerprint
	}{
		{"", "", Fingerprint{0x44af996bd8c187da, 0x45fc229b11597634}},
		{"", "a", Fingerprint{0x5d64579d6f7c17bf, 0xa1f4b3d64d3dd584}},
		{"", "6ba7b810-9dad-11d1-80b4-00c04fd430c8", Fingerprint{0x71d2e77cb7f149a1, 0x4d1954567d1cead4}},
		{"orders", "order:42", Fingerprint{0x36a09df04ca11ef8, 0x24407ecd4a21d7ac}},
		{"a", "bc", Fingerprint{0x2a643e9bbb11720b, 0x838b453b3f339609}},
		{"", string(make([]byte, 300)), Fingerprint{0xa4c6f7e71389a182, 0x78b926af42933d59}},
		{"ab", "c", Fingerprint{0xe388de8178886d8c, 0x1314e34fba24511a}},
	}
	for _, tt := range tests {
		got := Sum(h, tt.ns, []byte(tt.key))
		if got != tt.want {
			t.Errorf("Sum(%q, %q) = {%#x, %#x}, want {%#x, %#x}", tt.ns, tt.key, got.Hi, got.Lo, tt.want.Hi, tt.want.Lo)
		}
	}
}

// TestSumIsSipHash128 checks both of Sum's paths (stack buffer and pooled
// buffer) against the reference streaming SipHash-2-4-128 of
// len(ns) ‖ ns ‖ key.
func TestSumIsSipHash128(t *testing.T) {
	h := NewHasher(testSecret)
	for n := 0; n < 3*stackKey; n++ {
		key := make([]byte, n)
		for i := range key {
			key[i] = byte(i * 7)
		}
		ref := siphash.New128(testSecret[:])
		ref.Write(append(append([]byte{2}, "ns"...), key...))
		sum := ref.Sum(nil)
		want := Fingerprint{Hi: binary.LittleEndian.Uint64(sum[:8]), Lo: binary.LittleEndian.Uint64(sum[8:])}
		if got := Sum(h, "ns", key); got != want {
			t.Fatalf("len %d: Sum = %x, want %x", n, got, want)
		}
	}
}

// TestSumNeedsTheSecret: the same key under two secrets shares no
// fingerprint bits beyond chance, so a fingerprint table built offline
// without the store's secret predicts nothing.
func TestSumNeedsTheSecret(t *testing.T) {
	a, b := NewHasher(NewSecret()), NewHasher(NewSecret())
	same := 0
	for i := range 1000 {
		k := fmt.Appendf(nil, "%d", i)
		fa, fb := Sum(a, "", k), Sum(b, "", k)
		same += bits.OnesCount64(^(fa.Hi ^ fb.Hi)) + bits.OnesCount64(^(fa.Lo ^ fb.Lo))
	}
	if mean := float64(same) / 1000; mean < 60 || mean > 68 { // 64 expected
		t.Fatalf("fingerprints under two secrets agree in %.1f of 128 bits on average", mean)
	}
}

// legacySum is the fingerprint function of format 1: two unkeyed xxh64
// lanes over len(ns) ‖ ns ‖ key, the second continuing the first's state.
func legacySum(ns string, key []byte) Fingerprint {
	p := append(append([]byte{byte(len(ns))}, ns...), key...)
	return Fingerprint{Hi: xxhash.Sum64(p), Lo: xxhash.Sum64(append(p, 0xff))}
}

// collidingLegacyPair builds two distinct keys whose legacy fingerprints are
// equal in all 128 bits, without any search: xxh64's stripe round
// v' = rotl(v + lane·P2, 31)·P1 is invertible in the lane, so the second
// 32-byte stripe of key b can be solved to bring its internal state back to
// key a's; both halves then share everything after.
func collidingLegacyPair() (a, b []byte) {
	var p1, p2 uint64 = 11400714785074694791, 14029467366897019727 // xxh64 PRIME64_1, PRIME64_2
	inv := func(x uint64) uint64 {                                 // inverse of an odd number mod 2⁶⁴
		y := x
		for range 6 {
			y *= 2 - x*y
		}
		return y
	}
	round := func(v, lane uint64) uint64 { return bits.RotateLeft64(v+lane*p2, 31) * p1 }
	unround := func(v, target uint64) uint64 { // the lane with round(v, lane) == target
		return (bits.RotateLeft64(target*inv(p1), -31) - v) * inv(p2)
	}
	init := [4]uint64{p1 + p2, p2, 0, -p1}
	// p = 0x00 (empty namespace) ‖ key; stripes are p[0:32] and p[32:64].
	pa := []byte("\x00" + strings.Repeat("a", 66))
	pb := []byte("\x00" + strings.Repeat("b", 31) + strings.Repeat("a", 35))
	for lane := range 4 {
		va := round(round(init[lane], binary.LittleEndian.Uint64(pa[8*lane:])), binary.LittleEndian.Uint64(pa[32+8*lane:]))
		vb := round(init[lane], binary.LittleEndian.Uint64(pb[8*lane:]))
		binary.LittleEndian.PutUint64(pb[32+8*lane:], unround(vb, va))
	}
	return pa[1:], pb[1:]
}

// TestSumResistsConstructedCollisions: a pair of distinct keys built to
// collide in all 128 bits of the legacy unkeyed fingerprint has distinct
// fingerprints under the keyed one, whatever the secret.
func TestSumResistsConstructedCollisions(t *testing.T) {
	a, b := collidingLegacyPair()
	if bytes.Equal(a, b) || legacySum("", a) != legacySum("", b) {
		t.Fatalf("the construction did not collide the legacy fingerprint: %x vs %x", legacySum("", a), legacySum("", b))
	}
	for _, s := range []Secret{{}, testSecret, NewSecret()} {
		if h := NewHasher(s); Sum(h, "", a) == Sum(h, "", b) {
			t.Fatalf("secret %x: constructed keys share a fingerprint", s)
		}
	}
}

func TestSumNamespaceSeparates(t *testing.T) {
	h := NewHasher(testSecret)
	if Sum(h, "a", []byte("bc")) == Sum(h, "ab", []byte("c")) {
		t.Fatal("length prefix does not separate namespace from key")
	}
	if Sum(h, "", []byte("x")) == Sum(h, "x", nil) {
		t.Fatal("empty namespace collides with key-as-namespace")
	}
}

// TestSumDoesNotAllocate checks the stack path; TestAllocSumLongKey (built
// without the race detector, whose sync.Pool drops items on purpose) the
// pooled one.
func TestSumDoesNotAllocate(t *testing.T) {
	h := NewHasher(testSecret)
	key := []byte("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	if n := testing.AllocsPerRun(100, func() { _ = Sum(h, "ns", key) }); n != 0 {
		t.Fatalf("Sum allocates %v times per call", n)
	}
}

func TestNewRouterRejectsBadStripeCounts(t *testing.T) {
	for _, n := range []int{0, -1, 3, 100, MaxStripes * 2} {
		if _, err := NewRouter(Secret{}, n); !errors.Is(err, ErrStripes) {
			t.Errorf("NewRouter(%d) error = %v, want ErrStripes", n, err)
		}
	}
	r, err := NewRouter(Secret{}, 64)
	if err != nil || r.Stripes() != 64 {
		t.Fatalf("NewRouter(64) = %v, %v", r.Stripes(), err)
	}
}

// TestStripeSpreadsCraftedKeys builds 10⁵ keys whose unkeyed fingerprints
// agree in their low 8 bits, so a router that used those bits directly would
// put every one on the same stripe, and checks that the keyed router still
// spreads them evenly.
func TestStripeSpreadsCraftedKeys(t *testing.T) {
	const (
		stripes = 256
		want    = 100_000
	)
	keys := make([]Fingerprint, 0, want)
	buf := []byte("k")
	for i := uint64(0); len(keys) < want; i++ {
		f := legacySum("", strconv.AppendUint(buf[:1], i, 10))
		if f.Hi&(stripes-1) == 0 {
			keys = append(keys, f)
		}
	}
	naive := map[uint64]int{}
	for _, f := range keys {
		naive[f.Hi&(stripes-1)]++
	}
	if len(naive) != 1 {
		t.Fatalf("crafted keys are not colliding under the unkeyed hash: %d stripes", len(naive))
	}
	for _, secret := range []Secret{NewSecret(), NewSecret(), {}} {
		r, err := NewRouter(secret, stripes)
		if err != nil {
			t.Fatal(err)
		}
		load := make([]int, stripes)
		for _, f := range keys {
			load[r.Stripe(f)]++
		}
		maxLoad := 0
		for _, n := range load {
			maxLoad = max(maxLoad, n)
		}
		mean := float64(want) / stripes
		if ratio := float64(maxLoad) / mean; ratio >= 1.5 {
			t.Errorf("secret %x: max/mean stripe load = %.2f, want < 1.5", secret, ratio)
		}
	}
}

func TestStripeDependsOnSecret(t *testing.T) {
	a, _ := NewRouter(Secret{1}, 1024)
	b, _ := NewRouter(Secret{2}, 1024)
	same := 0
	for i := range 1000 {
		f := Sum(NewHasher(testSecret), "", fmt.Appendf(nil, "%d", i))
		if a.Stripe(f) == b.Stripe(f) {
			same++
		}
	}
	if same > 20 { // 1000/1024 expected by chance
		t.Fatalf("%d of 1000 keys share a stripe under two secrets", same)
	}
}

func BenchmarkSum(b *testing.B) {
	h := NewHasher(testSecret)
	key := []byte("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	b.ReportAllocs()
	for b.Loop() {
		_ = Sum(h, "", key)
	}
}
