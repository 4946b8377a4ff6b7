package pebble_test

import (
	"io"
	"log"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestContract runs the exact tiers' contract suite over Stores, each in a
// directory of its own, synced as the engine opens them.
func TestContract(t *testing.T) {
	var mu sync.Mutex
	dirs := map[tier.Exact]string{} // the directory of each Store the suite opened
	open := func(t *testing.T, dir string) tier.Exact {
		t.Helper()
		s, err := pebble.Open(&pebble.Options{
			Dir: dir, Partition: time.Hour, Window: 4 * time.Hour,
			MemTableSize: 4 << 20, CacheSize: 4 << 20, Logger: log.New(io.Discard, "", 0),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() }) // idempotent: after the suite's own Close
		mu.Lock()
		dirs[s] = dir
		mu.Unlock()
		return s
	}
	tiertest.Run(t, tiertest.Options{
		Partitioned: true,
		Reopen: func(t *testing.T, closed tier.Exact) tier.Exact {
			mu.Lock()
			dir := dirs[closed]
			mu.Unlock()
			return open(t, dir)
		},
	}, func(t *testing.T) tier.Exact { return open(t, t.TempDir()) })
}
