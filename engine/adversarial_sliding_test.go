package engine_test

// Adversarial tests of NamespaceOptions.Sliding: each would fail if a
// promise of docs/calls.md "Sliding windows" or of NamespaceOptions.Sliding
// were broken.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// slideMark marks key in namespace ns of e and fails the test on error.
func slideMark(t *testing.T, e *engine.Engine, ns, key string) engine.Outcome {
	t.Helper()
	return enginetest.MarkIn(t, e, ns, key)
}

// TestAdvSlidingNamespaceWindowAddedLater: a key that kept arriving in a
// sliding namespace with the engine's window, with a stored result, is
// then given a namespace window of its own (NamespaceOptions.Window
// "applies at once to keys already committed"). Its last arrival was
// minutes ago: it must still be a Duplicate under the new, shorter window,
// as a key committed once minutes ago is.
func TestAdvSlidingNamespaceWindowAddedLater(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, Clock: clock, Logger: quiet,
		ExpectedKeys: 1000, Namespaces: map[string]engine.NamespaceOptions{"s": {Sliding: true}}}
	e := open(t, o)
	ns, _ := e.Namespace("s")
	res := func(context.Context) ([]byte, error) { return []byte("r"), nil }
	if o, _, err := ns.DoResult(ctx, []byte("k"), res); err != nil || o != engine.New {
		t.Fatalf("first: %v %v", o, err)
	}
	for i := 0; i < 6; i++ {
		clock.Add(90 * time.Minute)
		if o, _, err := ns.DoResult(ctx, []byte("k"), res); err != nil || o != engine.Duplicate {
			t.Fatalf("re-send %d: %v %v", i, o, err)
		}
	}
	if o, _, err := ns.DoResult(ctx, []byte("yardstick"), res); err != nil || o != engine.New {
		t.Fatalf("yardstick: %v %v", o, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Add(10 * time.Minute)
	o.Namespaces = map[string]engine.NamespaceOptions{"s": {Sliding: true, Window: 2 * time.Hour}}
	e = open(t, o)
	defer e.Close()
	ns, _ = e.Namespace("s")
	for _, k := range []string{"yardstick", "k"} {
		info, err := ns.Lookup(ctx, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if info.Outcome != engine.Duplicate {
			t.Errorf("%s, last arrival 10 minutes ago, namespace window now 2h: %v, want Duplicate", k, info.Outcome)
		}
	}
}

// slideConfig is one configuration that slides: one of the list
// (enginetest.Configs) with the engine's window or a namespace's own.
type slideConfig struct {
	name   string
	cfg    enginetest.Config
	window time.Duration // the namespace's own window; zero for the engine's
	tiers  engine.Tiers
	dir    bool // keeps its state across a reopen
}

func slideOn(name, on string, window time.Duration) slideConfig {
	c := enginetest.Named(on)
	return slideConfig{name: name, cfg: c, window: window, tiers: c.Tiers, dir: c.Durable}
}

var slideConfigs = []slideConfig{
	slideOn("default", "default", 0),
	slideOn("default-nswindow", "default", 2*time.Hour),
	slideOn("memory", "memory", 0),
	slideOn("memory-nswindow", "memory", 2*time.Hour),
	slideOn("bloom", "bloom-dir", 0),
}

const slideWindow, slidePart = 4 * time.Hour, time.Hour

// expiryAfter is when a key last seen at last becomes New in c: exact
// with a namespace window or in memory-only, the end of its partition
// plus the window otherwise.
func (c slideConfig) expiryAfter(last time.Time) time.Time {
	if c.window > 0 {
		return last.Add(c.window)
	}
	if c.tiers == engine.MemoryOnly {
		return last.Add(slideWindow)
	}
	end := last.Truncate(slidePart).Add(slidePart)
	return end.Add(slideWindow)
}

func (c slideConfig) w() time.Duration {
	if c.window > 0 {
		return c.window
	}
	return slideWindow
}

func (c slideConfig) options(t *testing.T, clock engine.Clock) engine.Options {
	o := engine.Options{Window: slideWindow, Partition: slidePart, ExpectedKeys: 10000, Clock: clock, Logger: quiet,
		Namespaces: map[string]engine.NamespaceOptions{"slide": {Sliding: true}}}
	if c.window > 0 {
		o.Namespaces = map[string]engine.NamespaceOptions{"slide": {Sliding: true, Window: c.window}, "fixed": {Window: c.window}}
	}
	return c.cfg.New(t, c.name).Options(o) // fresh storage at each call
}

// TestAdvSlidingIrregularGaps: two keys re-sent together (one MarkBatch)
// at random gaps, many just under the window (down to a nanosecond under
// it), some tiny, landing anywhere in a partition, with the engine closed
// and reopened at random (right after a refresh too): every re-send is a
// Duplicate. Then they stop: a nanosecond before their expiry (counted
// from their last arrival as the configuration counts) one is still a
// Duplicate, and at that expiry the other is New. A key of the same bytes
// in a namespace that does not slide expires from its first commit.
func TestAdvSlidingIrregularGaps(t *testing.T) {
	for _, c := range slideConfigs {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, uint64(len(c.name))))
			clock := newClock()
			clock.Add(17*time.Minute + 123456789) // not a partition's start
			o := c.options(t, clock)
			e := open(t, o)
			defer func() { e.Close() }()
			reopen := func() {
				if !c.dir {
					return
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				e = open(t, o)
			}
			keys := [][]byte{[]byte("k"), []byte("j")}
			out := make([]engine.Outcome, 2)
			mark := func() {
				t.Helper()
				ns, _ := e.Namespace("slide")
				if err := ns.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Fatal(err)
				}
			}
			mark()
			if out[0] != engine.New || out[1] != engine.New {
				t.Fatalf("first send: %v", out)
			}
			if got := slideMark(t, e, "fixed", "k"); got != engine.New {
				t.Fatalf("fixed first: %v", got)
			}
			fixedAt := clock.Now()
			last := clock.Now()
			w := c.w()
			for step := 0; step < 60; step++ {
				var gap time.Duration
				switch rng.IntN(4) {
				case 0:
					gap = w - 1 // a nanosecond under the window
				case 1:
					gap = w - time.Duration(1+rng.Int64N(int64(time.Minute)))
				case 2:
					gap = time.Duration(1 + rng.Int64N(int64(time.Second)))
				default:
					gap = time.Duration(1 + rng.Int64N(int64(w)-1))
				}
				clock.Add(gap)
				mark()
				if out[0] != engine.Duplicate || out[1] != engine.Duplicate {
					t.Fatalf("step %d: re-sent %v after the last arrival (at %v): %v, want Duplicate", step, gap, clock.Now().UTC(), out)
				}
				last = clock.Now()
				if rng.IntN(3) == 0 {
					reopen() // right after a refresh: it must be durable
				}
			}
			total := clock.Now().Sub(fixedAt)
			if total <= c.expiryAfter(fixedAt).Sub(fixedAt) {
				t.Fatalf("the run lasted %v only", total)
			}
			if got := slideMark(t, e, "fixed", "k"); got != engine.New {
				t.Errorf("the non-sliding namespace's key, %v after its only commit: %v, want New", total, got)
			}
			reopen()
			exp := c.expiryAfter(last)
			clock.Add(exp.Add(-1).Sub(clock.Now()))
			if got := slideMark(t, e, "slide", "k"); got != engine.Duplicate {
				t.Errorf("k, a nanosecond before its expiry (%v after its last arrival): %v, want Duplicate", exp.Sub(last), got)
			}
			clock.Add(1)
			if got := slideMark(t, e, "slide", "j"); got != engine.New {
				t.Errorf("j at its expiry (%v after its last arrival): %v, want New", exp.Sub(last), got)
			}
		})
	}
}

// TestAdvSlidingConcurrent: many goroutines re-send a few hot keys through
// every call (MarkBatch and ClaimBatch with repeats in one batch,
// MarkIfAbsent, Do, DoResult), while others claim fresh keys and commit
// them with CommitAsync, across many partition boundaries: no re-send of
// a hot key is ever New, and once the senders stop, each hot key expires
// a window after its last arrival. InFlight answers (a concurrent call
// holds the key while it reads the store) are counted.
func TestAdvSlidingConcurrent(t *testing.T) {
	for _, c := range slideConfigs {
		if c.tiers == engine.BloomOnly {
			continue // DoResult needs results; covered by MarkBatch below
		}
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			o := c.options(t, clock)
			e := open(t, o)
			defer e.Close()
			ns, err := e.Namespace("slide")
			if err != nil {
				t.Fatal(err)
			}
			hot := [][]byte{[]byte("h0"), []byte("h1"), []byte("h2")}
			out := make([]engine.Outcome, len(hot))
			if err := ns.MarkBatch(ctx, hot, nil, out); err != nil {
				t.Fatal(err)
			}
			var news, inflight, dups atomic.Int64
			var bad sync.Map
			// step is the clock's step; seen[k] the latest step at which a
			// call of hot key k that started in that step answered
			// Duplicate. The clock moves on only once every hot key was
			// seen in the current step, so no key goes unsent longer than
			// a step (under half its window), however slow the senders.
			var step atomic.Int64
			var seen [3]atomic.Int64
			count := func(where string, ki int, st int64, o engine.Outcome) {
				switch o {
				case engine.New:
					news.Add(1)
					bad.Store(fmt.Sprintf("%s h%d New", where, ki), clock.Now().String())
				case engine.InFlight:
					inflight.Add(1)
				case engine.Duplicate:
					dups.Add(1)
					for {
						old := seen[ki].Load()
						if old >= st || seen[ki].CompareAndSwap(old, st) {
							break
						}
					}
				default:
					bad.Store(fmt.Sprintf("%s h%d %v", where, ki, o), clock.Now().String())
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					fresh := 0
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ki := (g + i) % len(hot)
						k2 := (g + i + 1) % len(hot)
						k := hot[ki]
						st := step.Load()
						switch (g + i) % 6 {
						case 0:
							keys := [][]byte{k, k, hot[k2], k}
							idx := []int{ki, ki, k2, ki}
							res := make([]engine.Outcome, len(keys))
							if err := ns.MarkBatch(ctx, keys, nil, res); err != nil {
								bad.Store(fmt.Sprint("markbatch error ", err), "")
								continue
							}
							for j, r := range res {
								count("MarkBatch", idx[j], st, r)
							}
						case 1:
							keys := [][]byte{k, k, k}
							cl := make([]engine.Claim, len(keys))
							if err := ns.ClaimBatch(ctx, keys, nil, cl); err != nil {
								bad.Store(fmt.Sprint("claimbatch error ", err), "")
								continue
							}
							for _, x := range cl {
								count("ClaimBatch", ki, st, x.Outcome)
								if x.Outcome == engine.New {
									e.Release(ctx, x)
								}
							}
						case 2:
							r, err := ns.Do(ctx, k, func(context.Context) error { return nil })
							if err != nil {
								bad.Store(fmt.Sprint("do error ", err), "")
								continue
							}
							count("Do", ki, st, r)
						case 3:
							r, err := ns.MarkIfAbsent(ctx, k)
							if err != nil {
								bad.Store(fmt.Sprint("mark error ", err), "")
								continue
							}
							count("MarkIfAbsent", ki, st, r)
						default:
							// Fresh keys committed asynchronously beside the
							// re-sends.
							fresh++
							fk := []byte(fmt.Sprintf("fresh-%d-%d", g, fresh))
							cl, err := ns.Claim(ctx, fk)
							if err != nil || cl.Outcome != engine.New {
								bad.Store(fmt.Sprint("fresh claim ", cl.Outcome, err), "")
								continue
							}
							done := make(chan error, 1)
							e.CommitAsync(ctx, cl, func(err error) { done <- err })
							// The test's clock jumps hours past a lease: a
							// lost lease is the clock's, not a defect.
							if err := <-done; err != nil && !errors.Is(err, engine.ErrLeaseLost) {
								bad.Store(fmt.Sprint("commit async ", err), "")
							}
						}
					}
				}(g)
			}
			// Move the clock in steps just under half the window: each hot
			// key is re-sent at least once per step, in a new partition.
			var last time.Time
			for s := int64(1); s <= 30; s++ {
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
					all := true
					for k := range seen {
						all = all && seen[k].Load() >= s-1
					}
					if all {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("step %d: the hot keys were not all re-sent in a minute", s)
					}
				}
				time.Sleep(5 * time.Millisecond)
				clock.Add(c.w()/2 - 7*time.Minute - time.Duration(s)*time.Second)
				step.Store(s)
			}
			// Every hot key re-sent at the final time, then stop.
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
				if seen[0].Load() >= 30 && seen[1].Load() >= 30 && seen[2].Load() >= 30 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the hot keys were not all re-sent at the last step")
				}
			}
			close(stop)
			wg.Wait()
			last = clock.Now() // every sender stopped at this instant (the clock stood still since the last step)
			bad.Range(func(k, v any) bool {
				t.Errorf("%v at %v", k, v)
				return true
			})
			t.Logf("hot re-sends: %d Duplicate, %d InFlight, %d New; Refreshes %d", dups.Load(), inflight.Load(), news.Load(), e.Stats().Calls.Refreshes)
			// A nanosecond before expiry: h0 Duplicate; at expiry: h1 New.
			exp := c.expiryAfter(last)
			clock.Add(exp.Add(-1).Sub(clock.Now()))
			if got := slideMark(t, e, "slide", "h0"); got != engine.Duplicate {
				t.Errorf("h0 a nanosecond before its expiry: %v", got)
			}
			clock.Add(1)
			if got := slideMark(t, e, "slide", "h1"); got != engine.New {
				t.Errorf("h1 at its expiry: %v", got)
			}
		})
	}
}

// TestAdvSlidingRepeatInMarkBatch: MarkBatch promises "a key repeated in
// the batch is New once and Duplicate after". A committed key of a
// sliding namespace, repeated in one batch in a later partition (where the
// first occurrence must reach the store to refresh it), is Duplicate at
// every occurrence: none is InFlight (nobody holds it: it is committed).
func TestAdvSlidingRepeatInMarkBatch(t *testing.T) {
	for _, c := range slideConfigs {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			e := open(t, c.options(t, clock))
			defer e.Close()
			ns, _ := e.Namespace("slide")
			if got := slideMark(t, e, "slide", "k"); got != engine.New {
				t.Fatal(got)
			}
			clock.Add(90 * time.Minute) // a later partition, inside every window
			keys := [][]byte{[]byte("k"), []byte("k"), []byte("k")}
			out := make([]engine.Outcome, len(keys))
			if err := ns.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				if o != engine.Duplicate {
					t.Errorf("occurrence %d of a committed key in one MarkBatch: %v, want Duplicate (all: %v)", i, o, out)
				}
			}
		})
	}
}

// TestAdvSlidingRepeatInMarkBatchNotSliding is the same after a reopen
// (memory empty) in a namespace that does not slide: it tells whether the
// InFlight repeat is the sliding option's or the engine's.
func TestAdvSlidingRepeatInMarkBatchNotSliding(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000, Clock: clock, Logger: quiet}
	e := open(t, o)
	if got, _ := e.MarkIfAbsent(ctx, []byte("k")); got != engine.New {
		t.Fatal(got)
	}
	e.Close()
	e = open(t, o)
	defer e.Close()
	keys := [][]byte{[]byte("k"), []byte("k")}
	out := make([]engine.Outcome, 2)
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.Duplicate {
			t.Errorf("occurrence %d of a committed key in one MarkBatch after a reopen: %v, want Duplicate (all: %v)", i, o, out)
		}
	}
}

// TestAdvSlidingConflictKeepsRefreshing: a key re-sent with another
// payload (ClaimDigest) answers Conflict, and a Conflict refreshes as a
// Duplicate does: after many windows of conflicting re-sends the key is
// still committed, with its first digest (the original payload is a
// Duplicate, the other still a Conflict) and its result.
func TestAdvSlidingConflictKeepsRefreshing(t *testing.T) {
	for _, c := range slideConfigs {
		if c.tiers == engine.BloomOnly {
			continue // no digests: nothing conflicts
		}
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			o := c.options(t, clock)
			e := open(t, o)
			defer func() { e.Close() }()
			ns, _ := e.Namespace("slide")
			d1, d2 := engine.DigestOf([]byte("payload-1")), engine.DigestOf([]byte("payload-2"))
			cl, err := ns.ClaimDigest(ctx, []byte("k"), d1)
			if err != nil || cl.Outcome != engine.New {
				t.Fatal(cl.Outcome, err)
			}
			cl.Result = []byte("first")
			if err := e.Commit(ctx, cl); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 12; i++ {
				clock.Add(c.w()*2/3 + time.Duration(i)*time.Minute)
				if i%4 == 3 && c.dir {
					e.Close()
					e = open(t, o)
					ns, _ = e.Namespace("slide")
				}
				cl, err := ns.ClaimDigest(ctx, []byte("k"), d2)
				if err != nil {
					t.Fatal(err)
				}
				if cl.Outcome != engine.Conflict || string(cl.Result) != "first" {
					t.Fatalf("conflicting re-send %d: %v %q, want Conflict \"first\"", i, cl.Outcome, cl.Result)
				}
			}
			clock.Add(c.w() - time.Minute)
			cl, err = ns.ClaimDigest(ctx, []byte("k"), d1)
			if err != nil || cl.Outcome != engine.Duplicate || string(cl.Result) != "first" {
				t.Fatalf("original payload after conflicting re-sends: %v %q %v, want Duplicate \"first\"", cl.Outcome, cl.Result, err)
			}
		})
	}
}

// TestAdvSlidingCommittedAt: in a sliding namespace of the embedded store
// a refresh re-commits the key dated now (whatever judges its age, a
// namespace window or the archive, must count from the last arrival), so
// Claim.CommittedAt tells the last refresh: here every re-send, 70 minutes
// apart, crosses a partition. Memory-only moves its entry's expiry and
// keeps the commit's time.
func TestAdvSlidingCommittedAt(t *testing.T) {
	for _, c := range slideConfigs {
		if c.tiers == engine.BloomOnly {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			e := open(t, c.options(t, clock))
			defer e.Close()
			ns, _ := e.Namespace("slide")
			first := clock.Now().UnixNano()
			if o, _, err := ns.DoResult(ctx, []byte("k"), func(context.Context) ([]byte, error) { return []byte("r"), nil }); err != nil || o != engine.New {
				t.Fatal(o, err)
			}
			for i := 0; i < 4; i++ {
				clock.Add(70 * time.Minute)
				cl, err := ns.Claim(ctx, []byte("k"))
				if err != nil || cl.Outcome != engine.Duplicate {
					t.Fatal(cl.Outcome, err)
				}
				want := first
				if c.tiers == engine.Default {
					want = clock.Now().UnixNano()
				}
				if cl.CommittedAt != want {
					t.Errorf("re-send %d: CommittedAt %v, want %v",
						i, time.Unix(0, cl.CommittedAt).UTC(), time.Unix(0, want).UTC())
				}
			}
		})
	}
}

// TestAdvSlidingRefreshCount: Stats.Calls.Refreshes "counts the duplicates of
// sliding namespaces that re-committed their key". In the embedded store
// a key is refreshed at most once a partition; a repeat in one batch of a
// key New in that batch refreshes nothing (it was just committed); a
// namespace that does not slide counts none.
func TestAdvSlidingRefreshCount(t *testing.T) {
	for _, c := range slideConfigs {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			e := open(t, c.options(t, clock))
			defer e.Close()
			ns, _ := e.Namespace("slide")
			fixed, _ := e.Namespace("fixed")
			keys := [][]byte{[]byte("a"), []byte("a"), []byte("a")}
			out := make([]engine.Outcome, 3)
			if err := ns.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatal(err)
			}
			if err := fixed.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatal(err)
			}
			if r := e.Stats().Calls.Refreshes; r != 0 {
				t.Errorf("a new key and its repeats in one MarkBatch: Refreshes %d, want 0 (%v)", r, out)
			}
			// The non-sliding namespace, many duplicates: nothing.
			before := e.Stats().Calls.Refreshes
			for range 5 {
				clock.Add(10 * time.Minute)
				fixed.MarkIfAbsent(ctx, []byte("a"))
			}
			if r := e.Stats().Calls.Refreshes; r != before {
				t.Errorf("duplicates in a namespace that does not slide: Refreshes %d → %d, want no change", before, r)
			}
			if c.tiers == engine.MemoryOnly || c.window > 0 {
				return // every duplicate refreshes there
			}
			// The sliding one, in one later partition, five duplicates:
			// one refresh.
			clock.Add(slidePart)
			before = e.Stats().Calls.Refreshes
			for range 5 {
				if o, _ := ns.MarkIfAbsent(ctx, []byte("a")); o != engine.Duplicate {
					t.Fatal(o)
				}
			}
			if r := e.Stats().Calls.Refreshes - before; r != 1 {
				t.Errorf("five duplicates in one later partition: %d refreshes, want 1", r)
			}
		})
	}
}

// TestAdvSlidingMemoryEviction: memory-only with a small MemoryCapacity,
// a hot key re-sent among a stream of keys sent once (ten times the
// capacity): memory evicts the least recently used, and a refreshed key
// is recently used, so the hot key stays a Duplicate.
func TestAdvSlidingMemoryEviction(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, MemoryCapacity: 1024, Stripes: 1, Window: slideWindow, Clock: clock,
		Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}})
	defer e.Close()
	if o, _ := e.MarkIfAbsent(ctx, []byte("hot")); o != engine.New {
		t.Fatal(o)
	}
	for i := 0; i < 10240; i++ {
		clock.Add(time.Second)
		if o, err := e.MarkIfAbsent(ctx, []byte(fmt.Sprint("once-", i))); err != nil || o != engine.New {
			t.Fatal(o, err)
		}
		if i%500 == 0 {
			if o, _ := e.MarkIfAbsent(ctx, []byte("hot")); o != engine.Duplicate {
				t.Fatalf("the hot key after %d keys sent once: %v", i, o)
			}
		}
	}
}

// TestAdvSlidingBloomReopenWithoutArrival: bloom-only, a refresh in a
// later partition, then Close and Open: the snapshot carries the refresh.
func TestAdvSlidingBloomReopenWithoutArrival(t *testing.T) {
	// Bloom-only: a refresh in a later partition, then Close and Open:
	// the snapshot carries the refresh; at the first send's expiry the
	// key is still a Duplicate, at the refresh's it is New.
	ctx := context.Background()
	clock := newClock()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(t.TempDir()), Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000, Clock: clock,
		Logger: quiet, Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
	e := open(t, o)
	if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.New {
		t.Fatal(g)
	}
	clock.Add(3*time.Hour + 59*time.Minute)
	if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.Duplicate {
		t.Fatal(g)
	}
	refreshed := clock.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * time.Hour) // past the first send's expiry (15:00)
	e = open(t, o)
	if g, _ := e.MarkIfAbsent(ctx, []byte("probe-other")); g != engine.New {
		t.Fatal(g)
	}
	exp := slideConfig{tiers: engine.BloomOnly}.expiryAfter(refreshed)
	clock.Add(exp.Add(-1).Sub(clock.Now()))
	if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.Duplicate {
		t.Errorf("a nanosecond before the refresh's expiry, across a reopen: %v", g)
	}
	e.Close()
}

// TestAdvSlidingRefreshSurvivesMachineCrash: "the refresh is durable
// before the duplicate is answered". A key committed, then re-sent in a
// later partition (a refresh), then the machine crashes at once (a crash
// clone of the filesystem: what was not synced is lost, no Close): opened
// after the first commit's expiry, the key is still a Duplicate. With a
// namespace window too (every duplicate writes, dated now).
func TestAdvSlidingRefreshSurvivesMachineCrash(t *testing.T) {
	for _, nsw := range []time.Duration{0, 2 * time.Hour} {
		t.Run(fmt.Sprint("nswindow=", nsw), func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			fs := vfs.NewCrashableMem()
			o := engine.Options{Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000, Clock: clock,
				Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
			w := slideWindow
			if nsw > 0 {
				o.Namespaces = map[string]engine.NamespaceOptions{"": {Sliding: true, Window: nsw}}
				w = nsw
			}
			e := open(t, o)
			if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.New {
				t.Fatal(g)
			}
			first := clock.Now()
			if g, _ := e.MarkIfAbsent(ctx, []byte("other")); g != engine.New {
				t.Fatal(g)
			}
			clock.Add(w - time.Minute) // a later partition, inside the window
			if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.Duplicate {
				t.Fatal(g)
			}
			refreshed := clock.Now()
			crashed := fs.CrashClone(vfs.CrashCloneCfg{})
			e.Close()
			// Past the first commit's expiry (rounded to its partition's
			// end with the engine's window), inside the refresh's.
			clock.Add(slideConfig{window: nsw}.expiryAfter(first).Add(time.Minute).Sub(clock.Now()))
			setFS(&o, crashed)
			e = open(t, o)
			defer e.Close()
			if g, _ := e.MarkIfAbsent(ctx, []byte("other")); g != engine.New {
				t.Fatalf("the key sent once, past its expiry: %v (the check cannot tell a refresh)", g)
			}
			if g, _ := e.MarkIfAbsent(ctx, []byte("k")); g != engine.Duplicate {
				t.Errorf("after a machine crash, %v after the refresh: %v, want Duplicate", clock.Now().Sub(refreshed), g)
			}
		})
	}
}
