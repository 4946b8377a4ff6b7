//go:build !race

// The runtime's memory classes are measured without the race detector,
// which keeps memory of its own; CI runs this in its pass without -race.

package bloom

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// TestGrowthReturnsReplacedCopies: a growth that replaces a ring of
// releaseBytes or more hands the replaced copy back to the OS, in the
// background, instead of leaving it resident until the heap next reaches
// its goal. Measured as the runtime counts it (free heap spans not yet
// returned: /memory/classes/heap/free:bytes), which does not depend on
// what else the process allocated since, as its RSS does. Without the
// release the free spans held the replaced 16 MiB copy.
func TestGrowthReturnsReplacedCopies(t *testing.T) {
	f := growing(t, 4_000_000, 10)
	var replaced int64
	for i := 0; replaced < 2*releaseBytes; i++ {
		before := f.Bytes()
		f.Add(keys("k"+string(rune('a'+i%26))+string(rune('a'+i/26)), 10_000), 10)
		if after := f.Bytes(); after > before && before > 0 {
			replaced = before
		}
		if i > 1000 {
			t.Fatalf("no growth past %d bytes (ring %d of %d)", 2*releaseBytes, f.Bytes(), f.FullBytes())
		}
	}
	runtime.GC() // the replaced copy is garbage now; its spans are free
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	var free uint64
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		metrics.Read(sample)
		if free = sample[0].Value.Uint64(); free < uint64(replaced)/2 {
			t.Logf("a ring of %d MiB replaced; %.1f MiB of free heap kept resident", replaced>>20, float64(free)/(1<<20))
			runtime.KeepAlive(f) // its ring is not the garbage measured
			return
		}
	}
	t.Fatalf("a ring of %d MiB replaced: %.1f MiB of free heap still resident after 5 s", replaced>>20, float64(free)/(1<<20))
	runtime.KeepAlive(f)
}
