//go:build !race

package bloom

import "testing"

func TestAllocTestAndAdd(t *testing.T) {
	f := newFilters(t, 10000, 0.01, 1)
	in := keys("k", 256)
	out := make([]Probe, len(in))
	f.Add(in, 1)
	if n := testing.AllocsPerRun(50, func() {
		f.Test(in, out)
		f.Add(in, 1)
	}); n != 0 {
		t.Fatalf("Test+Add of 256 keys allocates %v times", n)
	}
}
