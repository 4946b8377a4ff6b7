package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// TestSlidingWindows: in a sliding namespace, a key re-sent every half
// window for ten windows stays a Duplicate (each re-send refreshes it),
// while keys sent once expire on time: a Duplicate a minute before their
// window ends (the engine's is rounded up to their partition's end), New a
// minute after; a key re-sent just before its window ends is a Duplicate
// after that first expiry. The engine is closed and reopened between re-sends where it
// has a directory. The same re-sends in a namespace without the option
// become New: the refresh is what keeps them. Each configuration that
// slides: the embedded store, memory-only, bloom-only, and a namespace
// window (dated per commit, so every duplicate refreshes).
func TestSlidingWindows(t *testing.T) {
	const window, part = 4 * time.Hour, time.Hour
	for _, tc := range []struct {
		name    string
		tiers   engine.Tiers
		dir     bool
		window  time.Duration // the namespace's own window; zero for the engine's
		expires time.Duration // a key sent at a partition's start expires this much later
	}{
		{"default", engine.Default, true, 0, window + part},
		{"default-namespace-window", engine.Default, true, 2 * time.Hour, 2 * time.Hour},
		{"memory", engine.MemoryOnly, false, 0, window},
		{"memory-namespace-window", engine.MemoryOnly, false, 2 * time.Hour, 2 * time.Hour},
		{"bloom", engine.BloomOnly, true, 0, window + part},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock() // 10:00, a partition's start
			o := engine.Options{
				Tiers: tc.tiers, Window: window, Partition: part, ExpectedKeys: 1000, Clock: clock, Logger: quiet,
				Namespaces: map[string]engine.NamespaceOptions{"slide": {Sliding: true}},
			}
			if tc.dir {
				setDir(&o, t.TempDir())
			}
			w := window
			if tc.window > 0 {
				o.Namespaces = map[string]engine.NamespaceOptions{"slide": {Sliding: true, Window: tc.window}, "fixed": {Window: tc.window}}
				w = tc.window
			}
			e, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { e.Close() }()
			reopen := func() {
				if !tc.dir {
					return
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				if e, err = engine.Open(&o); err != nil {
					t.Fatal(err)
				}
			}
			mark := func(ns, key string) engine.Outcome {
				t.Helper()
				n, err := e.Namespace(ns)
				if err != nil {
					t.Fatal(err)
				}
				got, err := n.MarkIfAbsent(ctx, []byte(key))
				if err != nil {
					t.Fatal(err)
				}
				return got
			}

			// Sent once: on time.
			for _, k := range []string{"once-a", "once-b"} {
				if got := mark("slide", k); got != engine.New {
					t.Fatalf("first send of %s: %v", k, got)
				}
			}
			clock.Add(tc.expires - time.Minute)
			reopen()
			if got := mark("slide", "once-a"); got != engine.Duplicate {
				t.Errorf("a key sent once, a minute before it expires: %v, want Duplicate", got)
			}
			clock.Add(2 * time.Minute)
			if got := mark("slide", "once-b"); got != engine.New {
				t.Errorf("a key sent once, a minute after it expired: %v, want New", got)
			}

			// Re-sent a minute before its window ends, then a minute after
			// the first send's expiry: the refresh carried it over, even
			// where memory answered the re-send.
			if got := mark("slide", "edge"); got != engine.New {
				t.Fatalf("first send of edge: %v", got)
			}
			sent := clock.Now()
			clock.Add(w - time.Minute)
			if got := mark("slide", "edge"); got != engine.Duplicate {
				t.Fatalf("edge, re-sent a minute before its window ends: %v", got)
			}
			clock.Add(sent.Add(tc.expires + time.Minute).Sub(clock.Now()))
			if got := mark("slide", "edge"); got != engine.Duplicate {
				t.Errorf("edge, re-sent %v after a re-send: %v, want Duplicate", tc.expires-w+2*time.Minute, got)
			}

			// Re-sent every half window for ten windows.
			for _, ns := range []string{"slide", "fixed"} {
				if got := mark(ns, "kept"); got != engine.New {
					t.Fatalf("%s: first send %v, want New", ns, got)
				}
			}
			start := clock.Now()
			fixedNew := 0
			for i := 1; i <= 20; i++ {
				clock.Add(w / 2)
				if i%3 == 0 {
					reopen()
				}
				if got := mark("slide", "kept"); got != engine.Duplicate {
					t.Fatalf("re-send %d at +%v: %v, want Duplicate", i, clock.Now().Sub(start), got)
				}
				if mark("fixed", "kept") == engine.New {
					fixedNew++
				}
			}
			if fixedNew == 0 {
				t.Error("without SlidingWindows the key re-sent every half window never became New: the test cannot tell a refresh")
			}
			t.Logf("the fixed namespace's key was New again %d times in 20 re-sends", fixedNew)
		})
	}
}

// TestSlidingWindowsRefusedWithABackend: a shared tier has no refresh, so
// naming a sliding namespace beside a Backend is refused at Open, before
// any server is reached, and a name the engine keeps for itself is
// refused too.
func TestSlidingWindowsRefusedWithABackend(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	for _, o := range []engine.Options{
		{Backend: redis.NewBackend(c, redis.Config{Prefix: "slide:"}), Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}},
		{Tiers: engine.MemoryOnly, Namespaces: map[string]engine.NamespaceOptions{"\x00tokens": {Sliding: true}}},
	} {
		if e, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			if e != nil {
				e.Close()
			}
			t.Errorf("Open with sliding namespaces %v: %v, want ErrOptions", o.Namespaces, err)
		}
	}
	// Off is not on: false entries are ignored.
	e, err := engine.Open(&engine.Options{Tiers: engine.MemoryOnly, Namespaces: map[string]engine.NamespaceOptions{"x": {Sliding: false}}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if n, _ := e.Namespace("x"); n.Sliding() {
		t.Error("a namespace set false slides")
	}
}

// TestSlidingKeepsResultsAndForgets: a refresh carries the key's stored
// result, so a duplicate past the first commit's expiry replays it; a
// Lookup is not an arrival and refreshes nothing; Forget removes the
// refreshed key as it does any other.
func TestSlidingKeepsResultsAndForgets(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, Clock: clock, Logger: quiet,
		Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	runs := 0
	do := func() (engine.Outcome, string) {
		t.Helper()
		out, res, err := e.DoResult(ctx, []byte("order-1"), func(context.Context) ([]byte, error) {
			runs++
			return []byte("receipt-7"), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out, string(res)
	}
	if got, res := do(); got != engine.New || res != "receipt-7" {
		t.Fatalf("first: %v %q", got, res)
	}
	clock.Add(3 * time.Hour) // a later partition: refreshes
	if got, res := do(); got != engine.Duplicate || res != "receipt-7" {
		t.Fatalf("re-send: %v %q", got, res)
	}
	clock.Add(3 * time.Hour) // past the first commit's expiry (+5h)
	for range 2 {            // Lookup refreshes nothing: the second finds what the first did
		info, err := e.Lookup(ctx, []byte("order-1"))
		if err != nil || info.Outcome != engine.Duplicate || string(info.Result) != "receipt-7" {
			t.Fatalf("Lookup past the first expiry: %+v, %v", info, err)
		}
	}
	before := e.Stats().Calls.Refreshes
	if got, res := do(); got != engine.Duplicate || res != "receipt-7" || runs != 1 {
		t.Fatalf("past the first commit's expiry: %v %q, %d runs", got, res, runs)
	}
	if e.Stats().Calls.Refreshes != before+1 {
		t.Errorf("refreshes %d → %d, want one more", before, e.Stats().Calls.Refreshes)
	}
	if _, err := e.Forget(ctx, []byte("order-1")); err != nil {
		t.Fatal(err)
	}
	if got, _ := do(); got != engine.New || runs != 2 {
		t.Errorf("after Forget: %v (%d runs), want New", got, runs)
	}
}
