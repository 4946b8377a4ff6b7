package shard

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestSumGolden freezes the fingerprint function: Bloom snapshots and stripe
// placement depend on it, so a change here must be deliberate and versioned.
func TestSumGolden(t *testing.T) {
	tests := []struct {
		ns, key string
		want    Fingerprint
	}{
		{"", "", Fingerprint{0xe934a84adb052768, 0xe0d97d9a03131d7d}},
		{"", "a", Fingerprint{0x2954a8c1d262a51e, 0x8a0d3e941a7c984e}},
		{"", "6ba7b810-9dad-11d1-80b4-00c04fd430c8", Fingerprint{0x996706e982ad3af4, 0xa4c5dc1e588c6d98}},
		{"orders", "order:42", Fingerprint{0x3b4380cba2f90a24, 0xde130a090c9730ad}},
		{"a", "bc", Fingerprint{0x899855c5c500bc83, 0x1e6f34dd07fe43a1}},
		{"", string(make([]byte, 300)), Fingerprint{0x25d579d192a9c736, 0x4ea2b0adb5e733de}},
		{"ab", "c", Fingerprint{0xa9aac9f8908ad427, 0xebd775f9807e3dd4}},
	}
	for _, tt := range tests {
		got := Sum(tt.ns, []byte(tt.key))
		if got != tt.want {
			t.Errorf("Sum(%q, %q) = {%#x, %#x}, want {%#x, %#x}", tt.ns, tt.key, got.Hi, got.Lo, tt.want.Hi, tt.want.Lo)
		}
	}
}

// TestSumPathsAgree checks that the stack path and the streaming path of Sum
// compute the one documented function on both sides of their boundary.
func TestSumPathsAgree(t *testing.T) {
	for n := 0; n < 2*stackKey; n++ {
		key := make([]byte, n)
		for i := range key {
			key[i] = byte(i * 7)
		}
		p := append(append([]byte{2}, "ns"...), key...)
		want := Fingerprint{Hi: xxhash.Sum64(p), Lo: xxhash.Sum64(append(p, 0xff))}
		if got := Sum("ns", key); got != want {
			t.Fatalf("len %d: Sum = %x, want %x", n, got, want)
		}
	}
}

func TestSumNamespaceSeparates(t *testing.T) {
	if Sum("a", []byte("bc")) == Sum("ab", []byte("c")) {
		t.Fatal("length prefix does not separate namespace from key")
	}
	if Sum("", []byte("x")) == Sum("x", nil) {
		t.Fatal("empty namespace collides with key-as-namespace")
	}
}

func TestSumDoesNotAllocate(t *testing.T) {
	key := []byte("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	if n := testing.AllocsPerRun(100, func() { _ = Sum("ns", key) }); n != 0 {
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
		f := Sum("", strconv.AppendUint(buf[:1], i, 10))
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
		f := Sum("", fmt.Appendf(nil, "%d", i))
		if a.Stripe(f) == b.Stripe(f) {
			same++
		}
	}
	if same > 20 { // 1000/1024 expected by chance
		t.Fatalf("%d of 1000 keys share a stripe under two secrets", same)
	}
}

func BenchmarkSum(b *testing.B) {
	key := []byte("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	b.ReportAllocs()
	for b.Loop() {
		_ = Sum("", key)
	}
}
