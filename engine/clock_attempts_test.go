package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestEmbeddedAttemptCounts: attempt counts survive partition rotation,
// eviction from a one-stripe, 16-key memory tier and a clean restart with a
// warm Bloom snapshot, and make the key Poison at MaxAttempts.
func TestEmbeddedAttemptCounts(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewMem()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, MaxAttempts: 3, MemoryCapacity: 16, Stripes: 1,
		Window: 4 * time.Hour, Partition: time.Hour, Lease: time.Minute}
	e := open(t, o)
	boom := errors.New("boom")
	key := []byte("k")
	fail := func(e *engine.Engine, want engine.Outcome) {
		t.Helper()
		out, err := e.Do(ctx, key, func(context.Context) error { return boom })
		if out != want {
			t.Fatalf("Do = %v, %v; want %v", out, err, want)
		}
	}
	fail(e, engine.New)
	clock.Add(90 * time.Minute)
	for i := range 64 {
		if _, err := e.MarkIfAbsent(ctx, []byte(fmt.Sprint("filler-", i))); err != nil {
			t.Fatal(err)
		}
	}
	fail(e, engine.New)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	fail(e, engine.New)
	if out, err := e.Claim(ctx, key); err != nil || out.Outcome != engine.Poison {
		t.Fatalf("after 3 failures: %v, %v", out.Outcome, err)
	}
	e.Close()
}

// TestBogusClockAtFirstOpen: a clock before 1970 at the first Open of a
// store (a dead RTC battery) must be refused, not run at 1970 and then jump
// 56 years on the first sane reading and drop every key; once the store has
// a sane reading, the same clock is no progress.
func TestBogusClockAtFirstOpen(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	good := clock.Now()
	clock.Set(time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)) // an RTC that lost its battery, say
	fs := vfs.NewMem()
	for _, o := range []engine.Options{
		{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Logger: quiet},
		{Tiers: engine.MemoryOnly, Clock: clock, Logger: quiet},
	} {
		if _, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) || !strings.Contains(err.Error(), "Clock") {
			t.Fatalf("%v: Open with a clock at 1969 and no earlier reading = %v, want ErrOptions naming Clock", o.Tiers, err)
		}
	}
	clock.Set(good) // NTP fixes the clock
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock})
	if o, err := e.MarkIfAbsent(ctx, []byte("paid-order")); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	_ = e.Close()
	clock.Set(time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC))                                // the battery fails again
	e = open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock}) // the store's reading stands in
	defer e.Close()
	if o, err := e.MarkIfAbsent(ctx, []byte("paid-order")); err != nil || o != engine.Duplicate {
		t.Fatalf("with the clock at 1969 after a sane reading: %v, %v; want Duplicate", o, err)
	}
}
