package enginetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// TestAdvSlidingArchiveCountsFromLastArrival: with an archive, a key of a
// sliding namespace that kept arriving must be kept by the archive as long
// as a key committed at its last arrival: ArchiveWindow counted from its
// last partition. A key committed once at the moment of the sliding key's
// last arrival is the yardstick: both were last seen at the same instant,
// so both must answer the same afterwards.
func TestAdvSlidingArchiveCountsFromLastArrival(t *testing.T) {
	clock := newClock()
	fs := vfs.NewMem()
	o := archiveOptions(clock, fs, filesArchive(fs)) // Window 7 days, partitions of a day, archive 21 days
	o.Namespaces = map[string]engine.NamespaceOptions{"": {Sliding: true}}
	e := open(t, o)
	defer func() { e.Close() }()

	if got := enginetest.MarkIn(t, e, "", "slid"); got != engine.New {
		t.Fatalf("first send: %v", got)
	}
	// Re-sent every 3 days for 24 days: each re-send in a later partition
	// (a refresh), each well inside the 7-day window.
	for d := 3; d <= 24; d += 3 {
		clock.Add(3 * day)
		if got := enginetest.MarkIn(t, e, "", "slid"); got != engine.Duplicate {
			t.Fatalf("re-send on day %d: %v, want Duplicate", d, got)
		}
	}
	// The yardstick: committed once, on day 24, with the last re-send.
	if got := enginetest.MarkIn(t, e, "", "once-at-last-arrival"); got != engine.New {
		t.Fatalf("yardstick: %v", got)
	}
	lastArrival := clock.Now()
	// Nine days later both have left the 7-day window (their partition
	// ends on day 25, the window on day 32) and are inside the archive's
	// 21 days: both Duplicate, from the archive.
	clock.Add(9 * day)
	// Something must be committed for the clock to rotate partitions.
	enginetest.MarkIn(t, e, "", "tick")
	waitArchived(t, e)
	ctx := context.Background()
	for _, k := range []string{"once-at-last-arrival", "slid"} {
		info, err := e.Lookup(ctx, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if info.Outcome != engine.Duplicate {
			t.Errorf("%s, last arrival %v ago (ArchiveWindow 21 days): Lookup %v from %v, want Duplicate (committed at %v)",
				k, clock.Now().Sub(lastArrival), info.Outcome, info.Source, time.Unix(0, info.CommittedAt).UTC())
		}
		c, err := e.Claim(ctx, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if c.Outcome != engine.Duplicate {
			t.Errorf("%s, last arrival %v ago (ArchiveWindow 21 days): Claim %v, want Duplicate", k, clock.Now().Sub(lastArrival), c.Outcome)
			if c.Outcome == engine.New {
				e.Release(ctx, c)
			}
		}
	}
}
