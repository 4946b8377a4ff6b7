package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// repeatModel is what the docs promise for one key across batches run one
// after another: absent, held by one of the test's claims, or committed.
// Advance's entities keep their version beside it.
type repeatModel struct {
	held      map[string]bool
	committed map[string]bool
	version   map[string]uint64
}

// TestBatchRepeats: a key repeated anywhere in a batch gets the answer the
// docs give its repeats, at every position, in every configuration, over
// random batches drawn from a few keys (so most batches repeat some):
//   - ClaimBatch: the first occurrence's outcome; a repeat of a New or
//     InFlight key is InFlight, of a Duplicate key Duplicate;
//   - MarkBatch: New once, Duplicate after (InFlight where a claim holds it);
//   - LookupBatch: the same answer at every position;
//   - ForgetBatch: the first occurrence's answer at every position;
//   - AdvanceBatch: the first occurrence's outcome; a repeat is Duplicate
//     or Stale by the version the first read, InFlight after a New.
//
// Each answer is checked against a model of the promised states, so a
// position answered from a stale or partial read fails.
func TestBatchRepeats(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 7))
			t.Logf("seed %d", seed)
			advance := cfg.name == "default" || cfg.name == "redis"
			m := repeatModel{held: map[string]bool{}, committed: map[string]bool{}, version: map[string]uint64{}}
			var holding []engine.Claim // claims kept across batches
			settle := func() {
				if len(holding) == 0 {
					return
				}
				commit := rng.IntN(2) == 0
				var err error
				if commit {
					err = e.CommitBatch(ctx, holding, nil)
				} else {
					err = e.ReleaseBatch(ctx, holding, nil)
				}
				if err != nil {
					t.Fatalf("settling %d claims (commit %v): %v", len(holding), commit, err)
				}
				for _, c := range holding {
					delete(m.held, string(c.Key))
					if commit {
						m.committed[string(c.Key)] = true
					}
				}
				holding = holding[:0]
			}
			rounds := 300
			if testing.Short() {
				rounds = 100
			}
			for round := range rounds {
				n := 1 + rng.IntN(8)
				keys := make([][]byte, n)
				for i := range keys {
					keys[i] = []byte(fmt.Sprintf("k%d", rng.IntN(5)))
				}
				first := map[string]int{}
				for i, k := range keys {
					if _, ok := first[string(k)]; !ok {
						first[string(k)] = i
					}
				}
				fail := func(op string, i int, got, want engine.Outcome) {
					t.Helper()
					t.Fatalf("round %d %s %q: position %d (%s) = %v, want %v", round, op, keys, i, keys[i], got, want)
				}
				state := func(k string) engine.Outcome {
					switch {
					case m.held[k]:
						return engine.InFlight
					case m.committed[k]:
						return engine.Duplicate
					}
					return engine.New
				}
				switch op := rng.IntN(5); op {
				case 0: // ClaimBatch
					out := make([]engine.Claim, n)
					if err := e.ClaimBatch(ctx, keys, nil, out); err != nil {
						t.Fatal(err)
					}
					for i, k := range keys {
						want := state(string(k))
						if first[string(k)] != i && want == engine.New {
							want = engine.InFlight
						}
						if out[i].Outcome != want {
							fail("ClaimBatch", i, out[i].Outcome, want)
						}
					}
					for i, k := range keys {
						if out[i].Outcome == engine.New {
							m.held[string(k)] = true
							holding = append(holding, out[i])
						}
					}
					if rng.IntN(3) > 0 {
						settle()
					}
				case 1: // MarkBatch
					out := make([]engine.Outcome, n)
					if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
						t.Fatal(err)
					}
					for i, k := range keys {
						want := state(string(k))
						if first[string(k)] != i && want == engine.New {
							want = engine.Duplicate
						}
						if out[i] != want {
							fail("MarkBatch", i, out[i], want)
						}
					}
					for _, k := range keys {
						if !m.held[string(k)] {
							m.committed[string(k)] = true
						}
					}
				case 2: // LookupBatch
					out := make([]engine.KeyInfo, n)
					if err := e.LookupBatch(ctx, keys, out); err != nil {
						t.Fatal(err)
					}
					for i, k := range keys {
						if want := state(string(k)); out[i].Outcome != want {
							fail("LookupBatch", i, out[i].Outcome, want)
						}
					}
				case 3: // ForgetBatch
					out := make([]engine.KeyInfo, n)
					err := e.ForgetBatch(ctx, keys, out)
					anyHeld := false
					for i, k := range keys {
						want := state(string(k))
						anyHeld = anyHeld || want == engine.InFlight
						if out[i].Outcome != want {
							fail("ForgetBatch", i, out[i].Outcome, want)
						}
					}
					if anyHeld != errors.Is(err, engine.ErrInFlight) || (err != nil && !anyHeld) {
						t.Fatalf("round %d ForgetBatch %q: %v with a held key %v", round, keys, err, anyHeld)
					}
					for _, k := range keys {
						if !m.held[string(k)] {
							delete(m.committed, string(k))
						}
					}
				case 4: // AdvanceBatch
					if !advance {
						continue
					}
					settle() // Advance's claims are held apart
					versions := make([]uint64, n)
					for i := range versions {
						versions[i] = 1 + rng.Uint64N(4)
					}
					out := make([]engine.Claim, n)
					if err := e.AdvanceBatch(ctx, keys, versions, out); err != nil {
						t.Fatal(err)
					}
					var news []engine.Claim
					for i, k := range keys {
						stored := m.version[string(k)]
						want := engine.New
						switch {
						case versions[i] == stored:
							want = engine.Duplicate
						case versions[i] < stored:
							want = engine.Stale
						}
						if f := first[string(k)]; f != i && (want == engine.New || versions[f] > stored) {
							// After a New first occurrence, or offering more
							// than the version it read: wait for the entity.
							want = engine.InFlight
						}
						if out[i].Outcome != want {
							t.Fatalf("round %d AdvanceBatch %q %v (stored %v): position %d = %v, want %v", round, keys, versions, m.version, i, out[i].Outcome, want)
						}
						if want == engine.New {
							news = append(news, out[i])
						}
					}
					for _, c := range news {
						m.version[string(c.Key)] = versions[slices.IndexFunc(keys, func(k []byte) bool { return string(k) == string(c.Key) })]
					}
					if err := e.CommitBatch(ctx, news, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			settle()
		})
	}
}
