package pebble_test

import (
	"io"
	"log"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestContract runs the exact tiers' contract suite over Stores, each in a
// directory of its own, synced as the engine opens them.
func TestContract(t *testing.T) {
	tiertest.RunInDirs(t, tiertest.Options{Partitioned: true}, func(t *testing.T, dir string) tier.Exact {
		s, err := pebble.Open(&pebble.Options{
			Dir: dir, Partition: time.Hour, Window: 4 * time.Hour,
			MemTableSize: 4 << 20, CacheSize: 4 << 20, Logger: log.New(io.Discard, "", 0),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() }) // idempotent: after the suite's own Close
		return s
	})
}
