package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// openResults opens cfg to store results (MaxResultSize maxResult; the
// embedded store with a memory tier of 16 keys, so most answers come from
// the store); again, when not nil, closes e and returns another engine
// over the same state (a restart, or a second process of a shared tier).
func openResults(t *testing.T, cfg engineCfg, clock engine.Clock, maxResult int) (*engine.Engine, func(*engine.Engine) *engine.Engine) {
	o := engine.Options{Clock: clock, MaxResultSize: maxResult}
	if cfg.name == "default" {
		o.MemoryCapacity = 16
	}
	e, other, _ := cfg.open(t, o)
	if !cfg.cfg.Durable {
		return e, nil
	}
	return e, func(old *engine.Engine) *engine.Engine {
		if cfg.shared {
			old.Close()
		}
		return other()
	}
}

// TestStoredResult: a commit stores its claim's Result, and every later
// claim of the key answers Duplicate with that result and the commit's
// time, from memory, from the store, after a restart or from another
// process; the digest rule is unchanged (another payload is a Conflict,
// still with the result); a commit without a result returns none; a
// result over the limit is refused and writes nothing; the caller's copy
// is its own.
func TestStoredResult(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			clock := newClock()
			e, again := openResults(t, cfg, clock, 0)
			defer func() { e.Close() }()
			d1, d2 := engine.DigestOf([]byte("payload-1")), engine.DigestOf([]byte("payload-2"))
			resp := []byte(`{"order":42,"status":"created"}`)

			c, err := mustNamespace(t, e, "").ClaimDigest(ctx, []byte("k1"), d1)
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			c.Result = resp
			at := clock.Now().UnixNano()
			if err := e.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
			plain, _ := e.Claim(ctx, []byte("k2"))
			if err := e.Commit(ctx, plain); err != nil {
				t.Fatal(err)
			}
			clock.Add(time.Minute)

			check := func(when string, e *engine.Engine) {
				t.Helper()
				ns := mustNamespace(t, e, "")
				got, err := ns.ClaimDigest(ctx, []byte("k1"), d1)
				if err != nil || got.Outcome != engine.Duplicate || !bytes.Equal(got.Result, resp) || got.CommittedAt != at {
					t.Fatalf("%s: k1 = %v %q at %d, %v; want duplicate %q at %d", when, got.Outcome, got.Result, got.CommittedAt, err, resp, at)
				}
				got.Result[0] = 'X' // the caller's copy
				if got, _ := ns.ClaimDigest(ctx, []byte("k1"), d2); got.Outcome != engine.Conflict || !bytes.Equal(got.Result, resp) {
					t.Fatalf("%s: k1 with another digest = %v %q, want conflict with the result", when, got.Outcome, got.Result)
				}
				if got, _ := e.Claim(ctx, []byte("k2")); got.Outcome != engine.Duplicate || got.Result != nil || got.CommittedAt != 0 {
					t.Fatalf("%s: k2 = %v %q at %d, want duplicate without result", when, got.Outcome, got.Result, got.CommittedAt)
				}
				// A batch that repeats the key: every occurrence has it.
				keys := [][]byte{[]byte("k1"), []byte("k2"), []byte("k1"), []byte("k3-" + when)}
				out := make([]engine.Claim, len(keys))
				if err := e.ClaimBatch(ctx, keys, nil, out); err != nil {
					t.Fatal(err)
				}
				for _, i := range []int{0, 2} {
					if out[i].Outcome != engine.Duplicate || !bytes.Equal(out[i].Result, resp) || out[i].CommittedAt != at {
						t.Fatalf("%s: batch[%d] = %v %q at %d", when, i, out[i].Outcome, out[i].Result, out[i].CommittedAt)
					}
				}
				if err := e.ReleaseBatch(ctx, out, nil); err != nil {
					t.Fatal(err)
				}
			}
			check("first", e)
			check("again", e) // memory-only and cached answers
			if again != nil {
				e = again(e)
				check("reopened", e)
			}

			// Too long: refused, nothing written, the claim still the caller's.
			big, _ := e.Claim(ctx, []byte("big"))
			big.Result = make([]byte, engine.DefaultMaxResultSize+1)
			if err := e.Commit(ctx, big); !errors.Is(err, engine.ErrResultTooLarge) {
				t.Fatalf("commit of %d bytes: %v, want ErrResultTooLarge", len(big.Result), err)
			}
			done := make(chan error, 1)
			e.CommitAsync(ctx, big, func(err error) { done <- err })
			if err := <-done; !errors.Is(err, engine.ErrResultTooLarge) {
				t.Fatalf("async commit of %d bytes: %v, want ErrResultTooLarge", len(big.Result), err)
			}
			if err := e.Release(ctx, big); err != nil {
				t.Fatalf("release after a refused commit: %v", err)
			}
			if c, _ := e.Claim(ctx, []byte("big")); c.Outcome != engine.New {
				t.Fatalf("after a refused commit the key is %v, want New", c.Outcome)
			} else {
				c.Result = make([]byte, engine.DefaultMaxResultSize) // at the limit: stored
				for i := range c.Result {
					c.Result[i] = byte(i)
				}
				if err := e.Commit(ctx, c); err != nil {
					t.Fatal(err)
				}
				want := c.Result
				if again != nil {
					e = again(e)
				}
				if got, _ := e.Claim(ctx, []byte("big")); !bytes.Equal(got.Result, want) {
					t.Fatalf("a %d-byte result came back as %d bytes", len(want), len(got.Result))
				}
			}
		})
	}
}

// TestLargeResults: a result of 1 MiB (an HTTP response with its body) is
// stored and answered whole by every tier that keeps results, after a
// restart or from another process; one byte over MaxResultSize is
// refused.
func TestLargeResults(t *testing.T) {
	ctx := context.Background()
	const size = 1 << 20
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, again := openResults(t, cfg, newClock(), size)
			defer func() { e.Close() }()
			results := map[string][]byte{}
			for i := range 4 {
				key := fmt.Sprintf("large-%d", i)
				c, err := e.Claim(ctx, []byte(key))
				if err != nil || c.Outcome != engine.New {
					t.Fatal(c.Outcome, err)
				}
				c.Result = bytes.Repeat([]byte{byte('a' + i)}, size-i)
				c.Result[0] = byte(i)
				results[key] = c.Result
				done := make(chan error, 1)
				e.CommitAsync(ctx, c, func(err error) { done <- err }) // queued together
				defer func() {
					if err := <-done; err != nil {
						t.Error(err)
					}
				}()
			}
			if err := e.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			over, _ := e.Claim(ctx, []byte("over"))
			over.Result = make([]byte, size+1)
			if err := e.Commit(ctx, over); !errors.Is(err, engine.ErrResultTooLarge) {
				t.Fatalf("%d bytes with MaxResultSize %d: %v, want ErrResultTooLarge", len(over.Result), size, err)
			}
			_ = e.Release(ctx, over)
			if again != nil {
				e = again(e)
			}
			// The keys concurrently, each key's claims in turn (a claim
			// that meets another claim of its key reading the tier answers
			// InFlight).
			var wg sync.WaitGroup
			for key, want := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 4 {
						c, err := e.Claim(ctx, []byte(key))
						if err != nil || c.Outcome != engine.Duplicate || !bytes.Equal(c.Result, want) {
							t.Errorf("%s: %v, %d bytes, %v; want duplicate with its %d bytes", key, c.Outcome, len(c.Result), err, len(want))
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestDoResult: fn runs once; every later call returns its stored result
// without running it; a failing fn or a result over the limit leaves the
// key New for the redelivery.
func TestDoResult(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("memory", "default") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _ := openResults(t, cfg, newClock(), 0)
			defer e.Close()
			runs := 0
			handler := func(context.Context) ([]byte, error) {
				runs++
				return []byte("charge-7781"), nil
			}
			for i := range 3 {
				o, res, err := e.DoResult(ctx, []byte("pay-1"), handler)
				want := engine.Duplicate
				if i == 0 {
					want = engine.New
				}
				if err != nil || o != want || string(res) != "charge-7781" {
					t.Fatalf("call %d: %v %q %v, want %v with the result", i, o, res, err, want)
				}
			}
			if runs != 1 {
				t.Fatalf("the handler ran %d times", runs)
			}
			fail := errors.New("card declined")
			if _, _, err := e.DoResult(ctx, []byte("pay-2"), func(context.Context) ([]byte, error) { return nil, fail }); !errors.Is(err, fail) {
				t.Fatal(err)
			}
			if _, _, err := e.DoResult(ctx, []byte("pay-2"), func(context.Context) ([]byte, error) {
				return make([]byte, engine.DefaultMaxResultSize+1), nil
			}); !errors.Is(err, engine.ErrResultTooLarge) {
				t.Fatalf("oversized result: %v", err)
			}
			o, res, err := e.DoResult(ctx, []byte("pay-2"), handler)
			if err != nil || o != engine.New || string(res) != "charge-7781" {
				t.Fatalf("after a failure and a refused result: %v %q %v, want New", o, res, err)
			}
		})
	}
}

// TestResultRefusedWithoutStore: bloom-only keeps no results, so a commit
// with one is refused, and options bound the size.
func TestResultRefusedWithoutStore(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 1000})
	defer e.Close()
	c, _ := e.Claim(ctx, []byte("k"))
	c.Result = []byte("r")
	if err := e.Commit(ctx, c); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("bloom-only commit with a result: %v, want ErrOptions", err)
	}
	if got, _ := e.Claim(ctx, []byte("k")); got.Outcome != engine.InFlight {
		t.Fatalf("after the refused commit: %v, want the claim still held", got.Outcome)
	}
	for _, n := range []int{-1, engine.MaxResultSize + 1} {
		o := engine.Options{Tiers: engine.MemoryOnly, MaxResultSize: n}
		if err := o.Validate(); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("MaxResultSize %d: %v", n, err)
		}
	}
}

// TestCommitAsyncCopiesResult: CommitAsync returns before the write; the
// caller may reuse its result's buffer at once, and the commit stores what
// it was given.
func TestCommitAsyncCopiesResult(t *testing.T) {
	ctx := context.Background()
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	defer e.Close()
	first := claimNew(t, e, "first")
	gate.Shut() // the writer waits inside the first group's sync
	e.CommitAsync(ctx, first, nil)
	waitWriterInSync(t, gate, e, "the writer in its sync")
	c := claimNew(t, e, "k")
	buf := []byte("response-for-k")
	c.Result = buf
	done := make(chan error, 1)
	e.CommitAsync(ctx, c, func(err error) { done <- err })
	copy(buf, "RESPONSE-FOR-X")
	gate.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, err := e.Claim(ctx, []byte("k")); err != nil || got.Outcome != engine.Duplicate || string(got.Result) != "response-for-k" {
		t.Fatalf("k = %v %q, %v; want the result CommitAsync was called with", got.Outcome, got.Result, err)
	}
}

// TestDoResultRefusedBeforeClaiming: where no result can be stored,
// DoResult refuses before the handler runs.
func TestDoResultRefusedBeforeClaiming(t *testing.T) {
	e := open(t, engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 1000})
	defer e.Close()
	runs := 0
	for range 2 {
		if _, _, err := e.DoResult(context.Background(), []byte("k"), func(context.Context) ([]byte, error) {
			runs++
			return []byte("charged"), nil
		}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("DoResult on bloom-only: %v, want ErrOptions", err)
		}
	}
	if runs != 0 {
		t.Fatalf("the handler ran %d times", runs)
	}
}

// TestCommittedAtOnlyWithResult: a commit without a result answers no
// time, whichever tier answers (a namespace with its own window dates its
// commits in the store, for itself).
func TestCommittedAtOnlyWithResult(t *testing.T) {
	ctx := context.Background()
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Namespaces: map[string]engine.NamespaceOptions{"s": {Window: time.Hour}}}
	e := open(t, o)
	s := mustNamespace(t, e, "s")
	if got, _ := s.MarkIfAbsent(ctx, []byte("k")); got != engine.New {
		t.Fatal(got)
	}
	c1, _ := s.Claim(ctx, []byte("k")) // from memory
	e.Close()
	e = open(t, o)
	defer e.Close()
	c2, _ := mustNamespace(t, e, "s").Claim(ctx, []byte("k")) // from Pebble
	l, _ := mustNamespace(t, e, "s").Lookup(ctx, []byte("k"))
	if c1.Outcome != engine.Duplicate || c2.Outcome != engine.Duplicate || c1.CommittedAt != 0 || c2.CommittedAt != 0 || l.CommittedAt != 0 {
		t.Fatalf("memory: %v at %d; pebble: %v at %d; lookup at %d", c1.Outcome, c1.CommittedAt, c2.Outcome, c2.CommittedAt, l.CommittedAt)
	}
}

func mustNamespace(t *testing.T, e *engine.Engine, name string) *engine.Namespace {
	t.Helper()
	ns, err := e.Namespace(name)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
