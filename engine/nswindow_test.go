package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestNamespaceWindows: a namespace with a window of its own answers a
// committed key Duplicate for exactly that window and New from its end,
// from memory and from the store (after a restart), while the engine's
// other namespaces keep the engine's window; a key committed again is a
// Duplicate for another window; Lookup agrees; a window changed between
// runs applies to keys already committed, and a commit made before its
// namespace had a window is dated at its partition's end, never earlier.
func TestNamespaceWindows(t *testing.T) {
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.MemoryOnly, engine.Default} {
		t.Run(tiers.String(), func(t *testing.T) {
			clock := newClock()
			o := engine.Options{Tiers: tiers, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, Lease: time.Minute,
				Namespaces: map[string]engine.NamespaceOptions{"telemetry": {Window: 10 * time.Minute}}}
			if tiers == engine.Default {
				o.Backend, o.ExpectedKeys = embedded.Dir(t.TempDir()), 1000
			}
			e := open(t, o)
			defer func() { e.Close() }()
			reopen := func(o engine.Options) {
				t.Helper()
				if tiers == engine.MemoryOnly {
					return
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				e = open(t, o)
			}
			ns := func(name string) *engine.Namespace {
				n, err := e.Namespace(name)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			mark := func(name, key string, want engine.Outcome) {
				t.Helper()
				if got, err := ns(name).MarkIfAbsent(ctx, []byte(key)); err != nil || got != want {
					t.Fatalf("%s at %v: mark %s/%s = %v, %v; want %v", tiers, clock.Now().Format("15:04:05"), name, key, got, err, want)
				}
			}
			look := func(name, key string, want engine.Outcome) {
				t.Helper()
				if got, err := ns(name).Lookup(ctx, []byte(key)); err != nil || got.Outcome != want {
					t.Fatalf("%s: Lookup %s/%s = %v, %v; want %v", tiers, name, key, got.Outcome, err, want)
				}
			}
			if w := ns("telemetry").Window(); w != 10*time.Minute {
				t.Fatalf("telemetry window %v", w)
			}
			if w := ns("payments").Window(); w != 4*time.Hour {
				t.Fatalf("payments window %v", w)
			}
			mark("telemetry", "t1", engine.New)
			mark("payments", "p1", engine.New)
			clock.Add(10*time.Minute - time.Nanosecond)
			look("telemetry", "t1", engine.Duplicate)
			mark("telemetry", "t1", engine.Duplicate) // from memory
			reopen(o)
			mark("telemetry", "t1", engine.Duplicate) // from the store, dated
			clock.Add(time.Nanosecond)                // exactly the window
			look("telemetry", "t1", engine.New)
			mark("telemetry", "t1", engine.New)
			mark("payments", "p1", engine.Duplicate)
			clock.Add(9 * time.Minute)
			reopen(o)
			mark("telemetry", "t1", engine.Duplicate) // committed again: a new window
			clock.Add(time.Minute)
			mark("telemetry", "t1", engine.New)
			mark("payments", "p1", engine.Duplicate)
			if tiers == engine.MemoryOnly {
				return
			}

			// A longer window applies to what is committed.
			mark("telemetry", "t2", engine.New)
			clock.Add(15 * time.Minute)
			o2 := o
			o2.Namespaces = map[string]engine.NamespaceOptions{"telemetry": {Window: 20 * time.Minute}, "late": {Window: 10 * time.Minute}}
			reopen(o2)
			mark("telemetry", "t2", engine.Duplicate)
			clock.Add(5 * time.Minute)
			mark("telemetry", "t2", engine.New)

			// "late" had no window of its own when l1 was committed: no
			// time was stored, so it is dated at its partition's end.
			reopen(o)
			clock.Add(clock.Now().Truncate(time.Hour).Add(time.Hour + 5*time.Minute).Sub(clock.Now())) // 5 minutes into a partition
			mark("late", "l1", engine.New)
			reopen(o2)
			clock.Add(50 * time.Minute) // 5 minutes before the partition's end
			mark("late", "l1", engine.Duplicate)
			clock.Add(5*time.Minute + 10*time.Minute - time.Nanosecond)
			look("late", "l1", engine.Duplicate)
			clock.Add(time.Nanosecond)
			look("late", "l1", engine.New)
		})
	}
}

// TestNamespaceWindowRedis: Redis keeps a commit in a namespace with its
// own window for that window (the key's TTL on the server's clock), and
// the engine's memory no longer than that.
func TestNamespaceWindowRedis(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("nsw-%d:", time.Now().UnixNano())
	o := engine.Options{Lease: 200 * time.Millisecond,
		Namespaces: map[string]engine.NamespaceOptions{"short": {Window: time.Second}}}
	a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer a.Close()
	defer b.Close()
	short, _ := a.Namespace("short")
	long, _ := a.Namespace("long")
	for _, n := range []*engine.Namespace{short, long} {
		if got, err := n.MarkIfAbsent(ctx, []byte("k")); err != nil || got != engine.New {
			t.Fatal(got, err)
		}
	}
	// The commit's TTL and its time in memory started before this.
	start := time.Now()
	bshort, _ := b.Namespace("short")
	if got, _ := bshort.MarkIfAbsent(ctx, []byte("k")); got != engine.Duplicate {
		t.Fatalf("another process within the window: %v", got)
	}
	time.Sleep(time.Until(start.Add(1100 * time.Millisecond)))
	if got, err := bshort.Lookup(ctx, []byte("k")); err != nil || got.Outcome != engine.New {
		t.Fatalf("another process after the namespace's window: %v, %v", got.Outcome, err)
	}
	if got, err := short.MarkIfAbsent(ctx, []byte("k")); err != nil || got != engine.New {
		t.Fatalf("after the namespace's window: %v, %v", got, err)
	}
	if got, _ := long.MarkIfAbsent(ctx, []byte("k")); got != engine.Duplicate {
		t.Fatalf("the engine's window: %v", got)
	}
}

// TestNamespaceWindowOptions: a namespace window longer than the engine's,
// not longer than the lease, or in a configuration that cannot date keys
// is refused.
func TestNamespaceWindowOptions(t *testing.T) {
	for _, o := range []engine.Options{
		{Tiers: engine.MemoryOnly, Window: time.Hour, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: 2 * time.Hour}}},
		{Tiers: engine.MemoryOnly, Lease: time.Minute, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Minute}}},
		{Tiers: engine.BloomOnly, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Hour}}},
		{Tiers: engine.MemoryOnly, Namespaces: map[string]engine.NamespaceOptions{string(make([]byte, engine.MaxNamespace+1)): {Window: time.Hour}}},
	} {
		if err := o.Validate(); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%+v: %v, want ErrOptions", o.Namespaces, err)
		}
	}
}

// TestNamespaceWindowRedisLayout: Redis sets a commit's TTL from its
// namespace's window when it is made, so a prefix records the namespace
// windows and refuses a process with others (which would answer keys
// committed under the old window by the new one).
func TestNamespaceWindowRedisLayout(t *testing.T) {
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("nswl-%d:", time.Now().UnixNano())
	o := engine.Options{Window: time.Hour,
		Namespaces: map[string]engine.NamespaceOptions{"n": {Window: time.Minute}}}
	a := openRedis(t, c, prefix, o)
	defer a.Close()
	b := openRedis(t, c, prefix, o) // the same windows: accepted
	b.Close()
	for _, w := range []map[string]engine.NamespaceOptions{nil, {"n": {Window: 2 * time.Minute}}, {"n": {Window: time.Minute}, "m": {Window: time.Minute}}} {
		o.Namespaces = w
		o.Backend = redisBackend(c, prefix)
		if e, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
			if e != nil {
				e.Close()
			}
			t.Fatalf("namespace windows %v on a prefix recorded with n=1m: %v, want ErrLayout", w, err)
		}
	}
}
