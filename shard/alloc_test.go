//go:build !race

package shard

import "testing"

// TestAllocSumLongKey: a key longer than the stack buffer is hashed from a
// pooled buffer, without allocating.
func TestAllocSumLongKey(t *testing.T) {
	h := NewHasher(testSecret)
	long := make([]byte, 4096)
	if n := testing.AllocsPerRun(100, func() { _ = Sum(h, "ns", long) }); n != 0 {
		t.Fatalf("Sum of a 4 KiB key allocates %v times per call", n)
	}
}
