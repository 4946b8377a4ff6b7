package engine_test

// Tests of the memory-only one-step MarkBatch
// (engine/mark.go markInMemory → memory.Table.Mark). Every expectation
// below is the answer the claim-then-commit path gives to the same calls.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

func mmkeys(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func mmdig(b byte) engine.Digest {
	var d engine.Digest
	d[0], d[15] = b, b
	return d
}

type mmmarker interface {
	MarkBatch(context.Context, [][]byte, []engine.Digest, []engine.Outcome) error
}

func mmmark(t *testing.T, m mmmarker, keys [][]byte, ds []engine.Digest) []engine.Outcome {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	if err := m.MarkBatch(context.Background(), keys, ds, out); err != nil {
		t.Fatalf("MarkBatch: %v", err)
	}
	return out
}

func mmwant(t *testing.T, what string, got []engine.Outcome, want ...engine.Outcome) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outcomes, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: outcomes %v, want %v (first difference at %d)", what, got, want, i)
		}
	}
}

const (
	mmN = engine.New
	mmD = engine.Duplicate
	mmC = engine.Conflict
	mmI = engine.InFlight
	mmP = engine.Poison
)

// TestMemoryMarkRepeats: a key repeated in a batch is New once,
// then Duplicate, or Conflict when its digest differs from the first
// occurrence's (a zero digest conflicts with nothing); a key committed by
// an earlier batch answers by its stored digest.
func TestMemoryMarkRepeats(t *testing.T) {
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock()})
	defer e.Close()
	mmwant(t, "nil digests", mmmark(t, e, mmkeys("a", "b", "a", "a", "c", "b"), nil), mmN, mmN, mmD, mmD, mmN, mmD)
	mmwant(t, "digests", mmmark(t, e, mmkeys("x", "x", "x", "y", "y"), []engine.Digest{mmdig(1), mmdig(1), mmdig(2), {}, mmdig(3)}),
		mmN, mmD, mmC, mmN, mmD)
	mmwant(t, "against earlier batch", mmmark(t, e, mmkeys("x", "x", "y", "z", "z"), []engine.Digest{mmdig(1), mmdig(9), mmdig(2), {}, mmdig(4)}),
		mmD, mmC, mmD, mmN, mmD)
	mmwant(t, "zero then digest", mmmark(t, e, mmkeys("w", "w", "w"), []engine.Digest{{}, mmdig(4), {}}), mmN, mmD, mmD)
	// Namespaces are separate key spaces.
	ns, err := e.Namespace("orders")
	if err != nil {
		t.Fatal(err)
	}
	mmwant(t, "other namespace", mmmark(t, ns, mmkeys("a", "x", "a"), []engine.Digest{{}, mmdig(9), {}}), mmN, mmN, mmD)
	// The one-key form.
	if o, err := e.MarkIfAbsent(context.Background(), []byte("a")); err != nil || o != mmD {
		t.Fatalf("MarkIfAbsent of a marked key = %v, %v", o, err)
	}
	if o, err := ns.MarkIfAbsent(context.Background(), []byte("fresh")); err != nil || o != mmN {
		t.Fatalf("MarkIfAbsent of a fresh key = %v, %v", o, err)
	}
	// A marked key is committed for every other call: Claim, Do, Lookup.
	def, err := e.Namespace("")
	if err != nil {
		t.Fatal(err)
	}
	c, err := def.ClaimDigest(context.Background(), []byte("x"), mmdig(2))
	if err != nil || c.Outcome != mmC {
		t.Fatalf("ClaimDigest of a key marked with another digest = %v, %v", c.Outcome, err)
	}
	if o, err := e.Do(context.Background(), []byte("b"), func(context.Context) error { t.Fatal("handler ran for a marked key"); return nil }); err != nil || o != mmD {
		t.Fatalf("Do of a marked key = %v, %v", o, err)
	}
	ki, err := e.Lookup(context.Background(), []byte("x"))
	if err != nil || ki.Outcome != mmD || ki.Digest != mmdig(1) {
		t.Fatalf("Lookup of a marked key = %+v, %v", ki, err)
	}
}

// TestMemoryMarkNamespaceWindows: a mark lives exactly its
// namespace's window (Duplicate one nanosecond before, New at it), the
// default namespace's own window and the engine's window likewise.
func TestMemoryMarkNamespaceWindows(t *testing.T) {
	clock := newClock()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Second,
		Namespaces: map[string]engine.NamespaceOptions{"short": {Window: time.Minute}, "": {Window: 30 * time.Minute}}})
	defer e.Close()
	short, _ := e.Namespace("short")
	other, _ := e.Namespace("other")
	k := mmkeys("k")
	for _, m := range []mmmarker{short, e, other} {
		mmwant(t, "first", mmmark(t, m, k, nil), mmN)
	}
	clock.Add(time.Minute - 1)
	mmwant(t, "short, 1ns before its window", mmmark(t, short, k, nil), mmD)
	clock.Add(1)
	mmwant(t, "short, at its window", mmmark(t, short, mmkeys("k", "k"), nil), mmN, mmD)
	mmwant(t, "default inside its window", mmmark(t, e, k, nil), mmD)
	clock.Add(29*time.Minute - 1)
	mmwant(t, "default, 1ns before its window", mmmark(t, e, k, nil), mmD)
	mmwant(t, "other (engine window)", mmmark(t, other, k, nil), mmD)
	clock.Add(1)
	mmwant(t, "default, at its window", mmmark(t, e, k, nil), mmN)
	mmwant(t, "other, inside the engine's window", mmmark(t, other, k, nil), mmD)
	clock.Add(30*time.Minute - 1)
	mmwant(t, "other, 1ns before the engine's window", mmmark(t, other, k, nil), mmD)
	clock.Add(1)
	mmwant(t, "other, at the engine's window", mmmark(t, other, k, nil), mmN)
}

// TestMemoryMarkAttempts: with MaxAttempts, a key released by
// ClaimBatch/ReleaseBatch counts attempts; a mark of a key released fewer
// than MaxAttempts times is New (and clears the count), one at
// MaxAttempts is Poison (its repeats too), a lease that ran out counts as
// an attempt (Poison at the limit, with a lease expiry counted), and the
// count is forgotten after the window.
func TestMemoryMarkAttempts(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, MaxAttempts: 2, Lease: time.Second, Window: time.Hour, Partition: 10 * time.Minute})
	defer e.Close()
	claimRelease := func(keys [][]byte) {
		t.Helper()
		cl := make([]engine.Claim, len(keys))
		if err := e.ClaimBatch(ctx, keys, nil, cl); err != nil {
			t.Fatal(err)
		}
		for i := range cl {
			if cl[i].Outcome != mmN {
				t.Fatalf("claim of %s = %v", keys[i], cl[i].Outcome)
			}
		}
		errs := make([]error, len(cl))
		if err := e.ReleaseBatch(ctx, cl, errs); err != nil {
			t.Fatal(err, errs)
		}
	}
	claimRelease(mmkeys("p", "q"))
	mmwant(t, "released once", mmmark(t, e, mmkeys("p", "p"), nil), mmN, mmD)
	claimRelease(mmkeys("q"))
	mmwant(t, "released twice (MaxAttempts)", mmmark(t, e, mmkeys("q", "q", "r"), nil), mmP, mmP, mmN)
	// p's mark cleared its count: it is committed.
	if c, err := e.Claim(ctx, []byte("p")); err != nil || c.Outcome != mmD {
		t.Fatalf("claim of marked p = %v, %v", c.Outcome, err)
	}

	// A lease that ran out is an attempt: u held twice, left to expire.
	c1, err := e.Claim(ctx, []byte("u"))
	if err != nil || c1.Outcome != mmN {
		t.Fatal(c1.Outcome, err)
	}
	clock.Add(time.Second)
	before := e.Stats().Calls.LeaseExpiries
	mmwant(t, "takeover below the limit", mmmark(t, e, mmkeys("u", "u"), nil), mmN, mmD)
	if got := e.Stats().Calls.LeaseExpiries - before; got != 1 {
		t.Fatalf("lease expiries counted by the takeover = %d, want 1", got)
	}
	if err := e.Commit(ctx, c1); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("commit of the claim a mark took over = %v, want ErrLeaseLost", err)
	}
	c2, _ := e.Claim(ctx, []byte("v"))
	clock.Add(time.Second)
	c3, _ := e.Claim(ctx, []byte("v")) // takes over: one attempt
	if c2.Outcome != mmN || c3.Outcome != mmN {
		t.Fatal(c2.Outcome, c3.Outcome)
	}
	clock.Add(time.Second)
	before = e.Stats().Calls.LeaseExpiries
	mmwant(t, "expiry at the limit", mmmark(t, e, mmkeys("v", "v"), nil), mmP, mmP)
	if got := e.Stats().Calls.LeaseExpiries - before; got != 1 {
		t.Fatalf("lease expiries counted by the poisoning expiry = %d, want 1", got)
	}
	if err := e.Release(ctx, c3); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("release of the expired claim = %v, want ErrLeaseLost", err)
	}
	// After the window (and its partition) the counts are gone.
	clock.Add(time.Hour + 10*time.Minute)
	mmwant(t, "after the window", mmmark(t, e, mmkeys("q", "v"), nil), mmN, mmN)
}

// TestMemoryMarkHeldClaim: a key claimed by ClaimBatch and not yet
// committed is InFlight for a mark (every occurrence), and the mark takes
// nothing from the claimer: it can still commit or release.
func TestMemoryMarkHeldClaim(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MaxAttempts: 3})
	defer e.Close()
	cl := make([]engine.Claim, 2)
	if err := e.ClaimBatch(ctx, mmkeys("h1", "h2"), []engine.Digest{mmdig(7), mmdig(8)}, cl); err != nil {
		t.Fatal(err)
	}
	mmwant(t, "held", mmmark(t, e, mmkeys("h1", "h2", "h1", "f"), []engine.Digest{mmdig(7), mmdig(1), mmdig(7), {}}), mmI, mmI, mmI, mmN)
	if err := e.Extend(ctx, &cl[0], time.Minute); err != nil {
		t.Fatalf("Extend after the mark: %v", err)
	}
	if err := e.Commit(ctx, cl[0]); err != nil {
		t.Fatalf("commit after the mark: %v", err)
	}
	if err := e.Release(ctx, cl[1]); err != nil {
		t.Fatalf("release after the mark: %v", err)
	}
	mmwant(t, "after", mmmark(t, e, mmkeys("h1", "h2", "h1", "h2"), []engine.Digest{mmdig(7), mmdig(1), mmdig(9), mmdig(2)}), mmD, mmN, mmC, mmC)
}

// TestMemoryMarkTakeover: without MaxAttempts a claim whose lease
// ended is taken over by a mark (New, committed), its owner's commit and
// release are refused with ErrLeaseLost.
func TestMemoryMarkTakeover(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, Lease: time.Second})
	defer e.Close()
	c, _ := e.Claim(ctx, []byte("t"))
	clock.Add(time.Second - 1)
	mmwant(t, "inside the lease", mmmark(t, e, mmkeys("t"), nil), mmI)
	clock.Add(1)
	mmwant(t, "at the lease end", mmmark(t, e, mmkeys("t", "t", "s"), nil), mmN, mmD, mmN)
	if err := e.Commit(ctx, c); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("commit = %v, want ErrLeaseLost", err)
	}
	if err := e.Release(ctx, c); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("release = %v, want ErrLeaseLost", err)
	}
	mmwant(t, "after", mmmark(t, e, mmkeys("t"), nil), mmD)
	if s := e.Stats(); s.Calls.LeaseExpiries != 1 || s.Calls.LeaseLost != 2 {
		t.Fatalf("LeaseExpiries %d LeaseLost %d, want 1 and 2", s.Calls.LeaseExpiries, s.Calls.LeaseLost)
	}
}

// TestMemoryMarkRepeatAfterEviction: MarkBatch's documented
// promise "A key repeated in the batch is New once and Duplicate after"
// (and the claim-then-commit path's answers) with a memory capacity the
// batch exceeds. Claim then commit holds every first occurrence as a claim,
// which capacity does not evict, until the whole batch is decided.
func TestMemoryMarkRepeatAfterEviction(t *testing.T) {
	t.Run("one stripe", func(t *testing.T) {
		e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 4, Stripes: 1})
		defer e.Close()
		// The claim-then-commit path answered [N N N N N D N D].
		mmwant(t, "batch over capacity", mmmark(t, e, mmkeys("a", "b", "c", "d", "e", "a", "f", "b"), nil), mmN, mmN, mmN, mmN, mmN, mmD, mmN, mmD)
	})
	t.Run("committed before the batch", func(t *testing.T) {
		// A key committed by an earlier batch, found after the batch's own
		// new keys: the claim-then-commit path looked every key up before
		// committing any, and answered [N N N N D].
		e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 4, Stripes: 1})
		defer e.Close()
		mmwant(t, "first", mmmark(t, e, mmkeys("a"), nil), mmN)
		mmwant(t, "batch over capacity", mmmark(t, e, mmkeys("b", "c", "d", "e", "a"), nil), mmN, mmN, mmN, mmN, mmD)
	})
	t.Run("poisoned before the batch", func(t *testing.T) {
		// Likewise a key poisoned by ClaimBatch/ReleaseBatch: [N N N N P].
		e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 4, Stripes: 1, MaxAttempts: 1})
		defer e.Close()
		c, err := e.Claim(context.Background(), []byte("p"))
		if err != nil || c.Outcome != mmN {
			t.Fatal(c.Outcome, err)
		}
		if err := e.Release(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		mmwant(t, "batch over capacity", mmmark(t, e, mmkeys("b", "c", "d", "e", "p"), nil), mmN, mmN, mmN, mmN, mmP)
	})
	t.Run("default stripes", func(t *testing.T) {
		e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 1024})
		defer e.Close()
		const n = 2048
		keys := make([][]byte, 0, 2*n)
		for i := range n {
			keys = append(keys, fmt.Appendf(nil, "k%05d", i))
		}
		keys = append(keys, keys...) // every key twice in one batch
		out := mmmark(t, e, keys, nil)
		news := map[string]int{}
		for i, o := range out {
			if o == mmN {
				news[string(keys[i])]++
			}
		}
		twice := 0
		for _, c := range news {
			if c > 1 {
				twice++
			}
		}
		if len(news) != n || twice > 0 {
			t.Fatalf("%d distinct keys New, %d of them New twice in the same batch; want %d, each once", len(news), twice, n)
		}
		if s := e.Stats(); s.Calls.New != n || s.Calls.Commits != n {
			t.Fatalf("Stats New %d Commits %d, want %d each", s.Calls.New, s.Calls.Commits, n)
		}
	})
}

// TestMemoryMarkBadInput: bad input is refused with a typed error
// and writes nothing; FailOpen and NoSharedCache are refused for a
// memory-only engine; a closed engine answers ErrClosed.
func TestMemoryMarkBadInput(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, MaxKeySize: 8, MaxAttempts: 2})
	out := make([]engine.Outcome, 3)
	cases := []struct {
		name string
		keys [][]byte
		ds   []engine.Digest
		out  []engine.Outcome
		want error
	}{
		{"empty key", mmkeys("a", "", "b"), nil, out, engine.ErrEmptyKey},
		{"long key", mmkeys("a", "b", "123456789"), nil, out, engine.ErrKeyTooLong},
		{"short digests", mmkeys("a", "b", "c"), []engine.Digest{{}}, out, engine.ErrBatch},
		{"long digests", mmkeys("a", "b", "c"), make([]engine.Digest, 4), out, engine.ErrBatch},
		{"short out", mmkeys("a", "b", "c"), nil, out[:2], engine.ErrBatch},
	}
	for _, c := range cases {
		err := e.MarkBatch(ctx, c.keys, c.ds, c.out)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		if c.want == engine.ErrEmptyKey || c.want == engine.ErrKeyTooLong {
			var ke *engine.KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("%s: %v is no *KeyError", c.name, err)
			}
		}
	}
	if s := e.Stats(); s.Calls.Claims != 0 || s.Calls.Commits != 0 || s.Memory.Entries != 0 || s.Memory.Claims != 0 {
		t.Fatalf("refused calls counted or wrote: %+v", s)
	}
	mmwant(t, "after refusals", mmmark(t, e, mmkeys("a", "b", "c"), nil), mmN, mmN, mmN)
	if err := e.MarkBatch(ctx, nil, nil, nil); err != nil {
		t.Fatalf("empty MarkBatch: %v", err)
	}
	if _, err := e.MarkIfAbsent(ctx, nil); !errors.Is(err, engine.ErrEmptyKey) {
		t.Fatalf("MarkIfAbsent(nil) = %v", err)
	}
	e.Close()
	if err := e.MarkBatch(ctx, mmkeys("z"), nil, out[:1]); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("MarkBatch after Close = %v, want ErrClosed", err)
	}
	for _, o := range []engine.Options{{Tiers: engine.MemoryOnly, FailOpen: true}, {Tiers: engine.MemoryOnly, NoSharedCache: true}} {
		if e, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			if e != nil {
				e.Close()
			}
			t.Fatalf("Open(%+v) = %v, want ErrOptions", o, err)
		}
	}
}

// TestMemoryMarkStats: the counters agree with the answers given:
// Claims counts every key, New and Commits the New answers, Duplicates,
// Conflicts, InFlight and Poisoned theirs, MemoryEntries the distinct
// committed keys.
func TestMemoryMarkStats(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MaxAttempts: 1})
	defer e.Close()
	cl := make([]engine.Claim, 2)
	if err := e.ClaimBatch(ctx, mmkeys("held", "poison"), nil, cl); err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, cl[1]); err != nil {
		t.Fatal(err)
	}
	base := e.Stats()
	keys := mmkeys("a", "b", "a", "held", "poison", "a", "c", "b", "poison")
	ds := []engine.Digest{mmdig(1), {}, mmdig(2), {}, {}, mmdig(1), {}, mmdig(3), {}}
	out := mmmark(t, e, keys, ds)
	mmwant(t, "mixed", out, mmN, mmN, mmC, mmI, mmP, mmD, mmN, mmD, mmP)
	var count [8]uint64
	for _, o := range out {
		count[o]++
	}
	s := e.Stats()
	got := []uint64{s.Calls.Claims - base.Calls.Claims, s.Calls.New - base.Calls.New, s.Calls.Commits - base.Calls.Commits, s.Calls.Duplicates - base.Calls.Duplicates, s.Calls.Conflicts - base.Calls.Conflicts, s.Calls.InFlight - base.Calls.InFlight, s.Calls.Poisoned - base.Calls.Poisoned}
	want := []uint64{uint64(len(keys)), count[mmN], count[mmN], count[mmD], count[mmC], count[mmI], count[mmP]}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("counter deltas [Claims New Commits Duplicates Conflicts InFlight Poisoned] = %v, want %v", got, want)
		}
	}
	if s.Memory.Entries != 4 || s.Memory.Claims != 1 { // a, b, c committed, poison released; held claimed
		t.Fatalf("MemoryEntries %d MemoryClaims %d, want 4 and 1", s.Memory.Entries, s.Memory.Claims)
	}
}

// TestMemoryMarkConcurrent: marks, claims and commits of the same
// keys from many goroutines: each key is New exactly once in total.
func TestMemoryMarkConcurrent(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Stripes: 4})
	defer e.Close()
	const keysN, workers, rounds = 500, 8, 20
	var news [keysN]atomic.Int32
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				keys := make([][]byte, 0, 64)
				idx := make([]int, 0, 64)
				for j := range 64 {
					k := (w*131 + r*67 + j*7) % keysN
					keys, idx = append(keys, fmt.Appendf(nil, "c%d", k)), append(idx, k)
				}
				if w%2 == 0 {
					out := make([]engine.Outcome, len(keys))
					if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
						errc <- err
						return
					}
					for i, o := range out {
						if o == mmN {
							news[idx[i]].Add(1)
						}
					}
					continue
				}
				cl := make([]engine.Claim, len(keys))
				if err := e.ClaimBatch(ctx, keys, nil, cl); err != nil {
					errc <- err
					return
				}
				if err := e.CommitBatch(ctx, cl, nil); err != nil {
					errc <- err
					return
				}
				for i := range cl {
					if cl[i].Outcome == mmN {
						news[idx[i]].Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for k := range news {
		if n := news[k].Load(); n > 1 {
			t.Fatalf("key c%d New %d times", k, n)
		}
	}
}

// TestMemoryMarkCloseRace: Close while marks run: every mark
// returns nil or ErrClosed, none panics, and every one after Close is
// ErrClosed.
func TestMemoryMarkCloseRace(t *testing.T) {
	ctx := context.Background()
	for round := range 20 {
		e := open(t, engine.Options{Tiers: engine.MemoryOnly})
		var wg sync.WaitGroup
		var bad atomic.Value
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if p := recover(); p != nil {
						bad.Store(fmt.Errorf("panic: %v", p))
					}
				}()
				for i := 0; ; i++ {
					keys := [][]byte{fmt.Appendf(nil, "%d-%d-%d", round, w, i), []byte("same")}
					out := make([]engine.Outcome, 2)
					err := e.MarkBatch(ctx, keys, nil, out)
					if errors.Is(err, engine.ErrClosed) {
						return
					}
					if err != nil {
						bad.Store(err)
						return
					}
					if out[0] != mmN {
						bad.Store(fmt.Errorf("fresh key answered %v", out[0]))
						return
					}
				}
			}()
		}
		time.Sleep(time.Millisecond)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if v := bad.Load(); v != nil {
			t.Fatal(v)
		}
	}
}

// TestBloomOnlyMarkNotMemoryOnly: the one-step memory path is for
// memory-only engines alone: a bloom-only engine (whose memory keeps no
// commits) still adds every mark to its filters, with and without a Dir.
func TestBloomOnlyMarkNotMemoryOnly(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		e := open(t, engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), ExpectedKeys: 1000, Clock: newClock()})
		mmwant(t, "bloom-only "+dir, mmmark(t, e, mmkeys("k", "k", "j"), nil), mmN, mmD, mmN)
		mmwant(t, "bloom-only again "+dir, mmmark(t, e, mmkeys("k", "j"), nil), mmD, mmD)
		e.Close()
	}
}
