package bloom

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
)

// TestManyFiltersGrowTogether: four growing Filters sized for 2M
// keys a partition (rings pass 8 MiB, so growths call FreeOSMemory) are
// filled at once, 4 adders each over two partitions, while probers test
// every key already added: no key whose Add returned is ever absent, and
// all are present at the end.
func TestManyFiltersGrowTogether(t *testing.T) {
	const nf, adders = 4, 4
	per := 40_000
	if raceOn {
		per = 10_000 // the rings still grow through three doublings
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for fi := range nf {
		f := growing(t, 2_000_000, 10)
		var mu sync.Mutex
		var added []shard.Fingerprint
		stop := make(chan struct{})
		var pw sync.WaitGroup
		for range 2 {
			pw.Add(1)
			go func() {
				defer pw.Done()
				out := make([]Probe, 256)
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					snap := added
					mu.Unlock()
					if len(snap) == 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					start := len(snap) - min(len(snap), 256)
					b := snap[start:]
					f.Test(b, out[:len(b)])
					for i := range b {
						if out[i].Maybe == 0 {
							errs <- fmt.Errorf("filters %d: a key added before is absent (ring %d bytes)", fi, f.Bytes())
							return
						}
					}
				}
			}()
		}
		for a := range adders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := keys(fmt.Sprintf("f%d-a%d-", fi, a), per)
				for i := 0; i < len(k); i += 500 {
					b := k[i:min(i+500, len(k))]
					f.Add(b, 10+int64(a%2))
					mu.Lock()
					added = append(added, b...)
					mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				n := len(added)
				mu.Unlock()
				if n >= adders*per {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			close(stop)
			pw.Wait()
			if m := missing(f, added); m != 0 {
				errs <- fmt.Errorf("filters %d: %d of %d keys missing at the end", fi, m, len(added))
			}
			t.Logf("filters %d: %d keys, ring %d bytes of %d", fi, len(added), f.Bytes(), f.FullBytes())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
