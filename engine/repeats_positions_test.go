package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

func bs(keys ...string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// TestRepeatsEveryPosition: a key repeated in a batch gets the same
// answer at every position (ClaimBatch: New once and InFlight after it),
// in every configuration, answered from memory (the engine that wrote the
// state) and from the slower tier (another process, or a reopen).
func TestRepeatsEveryPosition(t *testing.T) {
	ctx := context.Background()
	d1, d2 := engine.DigestOf([]byte("one")), engine.DigestOf([]byte("two"))
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			o := engine.Options{MaxAttempts: 1, Lease: time.Minute, NoSharedCache: cfg.shared}
			e, other, _ := cfg.open(t, o)
			defer e.Close()
			for p := 1; p <= 2; p++ {
				k := func(s string) string { return fmt.Sprintf("%s-%d", s, p) }
				for _, key := range []string{k("c"), k("cf"), k("cm")} {
					var out [1]engine.Claim
					if err := e.ClaimBatch(ctx, bs(key), []engine.Digest{d1}, out[:]); err != nil || out[0].Outcome != engine.New {
						t.Fatalf("%s: %v %v", key, out[0].Outcome, err)
					}
					out[0].Result = []byte("R")
					{
						if err := e.Commit(ctx, out[0]); err != nil {
							t.Fatal(err)
						}
					}
				}
				c, err := e.Claim(ctx, []byte(k("p")))
				if err != nil || c.Outcome != engine.New {
					t.Fatal(c.Outcome, err)
				}
				if err := e.Release(ctx, c); err != nil {
					t.Fatal(err)
				}
				if info, err := e.Lookup(ctx, []byte(k("p"))); err != nil || info.Outcome != engine.Poison {
					t.Fatalf("poison setup: %v %v", info.Outcome, err)
				}
				if c, err := e.Claim(ctx, []byte(k("h"))); err != nil || c.Outcome != engine.New {
					t.Fatal(c.Outcome, err)
				}
			}
			for p := 1; p <= 2; p++ {
				x := e
				where := "memory of the writer"
				if p == 2 {
					x, where = other(), "slower tier"
					if !cfg.shared && cfg.name != "memory" {
						if c, err := x.Claim(ctx, []byte("h-2")); err != nil || c.Outcome != engine.New {
							t.Fatal(c.Outcome, err)
						}
					}
				}
				k := func(s string) string { return fmt.Sprintf("%s-%d", s, p) }
				t.Run(where, func(t *testing.T) {
					same := func(op string, keys []string, got []string, want map[string]string) {
						t.Helper()
						for i, key := range keys {
							if w, ok := want[key]; ok && got[i] != w {
								t.Errorf("%s %v: position %d (%s) = %s, want %s", op, keys, i, key, got[i], w)
							}
						}
						for i := range keys {
							for j := range i {
								if keys[i] == keys[j] && got[i] != got[j] && !(op == "ClaimBatch" && strings.HasPrefix(got[j], "new")) {
									t.Errorf("%s %v: key %s answered %s at %d and %s at %d", op, keys, keys[i], got[j], j, got[i], i)
								}
							}
						}
					}
					fresh := k("fresh")
					keys := []string{k("c"), fresh, k("c"), k("h"), fresh, k("h"), k("c")} // poison: TestPoisonRepeats
					// LookupBatch
					infos := make([]engine.KeyInfo, len(keys))
					if err := x.LookupBatch(ctx, bs(keys...), infos); err != nil {
						t.Fatalf("LookupBatch: %v", err)
					}
					got := make([]string, len(keys))
					for i, in := range infos {
						got[i] = fmt.Sprintf("%v/%q/%d", in.Outcome, in.Result, in.Attempts)
					}
					same("LookupBatch", keys, got, map[string]string{k("c"): `duplicate/"R"/0`, fresh: `new/""/0`})
					// ClaimBatch, with digests that conflict at one position.
					claims := make([]engine.Claim, len(keys))
					digests := make([]engine.Digest, len(keys))
					for i := range digests {
						digests[i] = d1
					}
					if err := x.ClaimBatch(ctx, bs(keys...), digests, claims); err != nil {
						t.Fatalf("ClaimBatch: %v", err)
					}
					for i, c := range claims {
						got[i] = fmt.Sprintf("%v/%q", c.Outcome, c.Result)
						if c.Outcome == engine.InFlight && keys[i] == fresh {
							got[i] = "new/\"\"" // a repeat of the New one
						}
					}
					same("ClaimBatch", keys, got, map[string]string{k("c"): `duplicate/"R"`, k("h"): `in-flight/""`, fresh: `new/""`})
					for i, c := range claims {
						if c.Outcome == engine.New {
							_ = x.Release(ctx, c)
							_ = i
						}
					}
					// ClaimBatch where every position conflicts.
					for i := range digests {
						digests[i] = d2
					}
					if err := x.ClaimBatch(ctx, bs(k("c"), k("c"), k("c")), digests[:3], claims[:3]); err != nil {
						t.Fatal(err)
					}
					for i := range 3 {
						if claims[i].Outcome != engine.Conflict {
							t.Errorf("ClaimBatch of a committed key with another digest, position %d: %v, want Conflict", i, claims[i].Outcome)
						}
					}
					// MarkBatch
					fm := k("freshmark")
					mkeys := []string{k("cm"), fm, k("cm"), k("h"), fm, k("h"), fm}
					outs := make([]engine.Outcome, len(mkeys))
					if err := x.MarkBatch(ctx, bs(mkeys...), nil, outs); err != nil {
						t.Fatalf("MarkBatch: %v", err)
					}
					for i, o := range outs {
						got[i] = o.String()
						if keys := mkeys; keys[i] == fm && i > 1 && o == engine.Duplicate {
							got[i] = "new" // repeats of the New one
						}
					}
					same("MarkBatch", mkeys, got[:len(mkeys)], map[string]string{k("cm"): "duplicate", k("h"): "in-flight", fm: "new"})
					if outs[4] != engine.Duplicate || outs[6] != engine.Duplicate {
						t.Errorf("MarkBatch: repeats of a key marked New: %v, %v, want Duplicate", outs[4], outs[6])
					}
					// ForgetBatch
					{
						fkeys := []string{k("cf"), k("h"), k("cf"), k("h"), k("cf")}
						finfos := make([]engine.KeyInfo, len(fkeys))
						err := x.ForgetBatch(ctx, bs(fkeys...), finfos)
						if !errors.Is(err, engine.ErrInFlight) {
							t.Errorf("ForgetBatch with a held key: %v, want ErrInFlight", err)
						}
						for i, in := range finfos {
							got[i] = fmt.Sprintf("%v/%q", in.Outcome, in.Result)
						}
						same("ForgetBatch", fkeys, got[:len(fkeys)], map[string]string{k("cf"): `duplicate/"R"`, k("h"): `in-flight/""`})
						if in, err := x.Lookup(ctx, []byte(k("cf"))); err != nil || in.Outcome != engine.New {
							t.Errorf("after ForgetBatch: %v %v, want New", in.Outcome, err)
						}
					}
				})
			}
		})
	}
}

// TestAdvanceRepeats: an entity repeated in an AdvanceBatch with the
// same version gets the same answer at every position when that answer is
// a verdict (Duplicate, Stale); a fresh one is New once and InFlight after.
func TestAdvanceRepeats(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{Lease: time.Minute})
			defer e.Close()
			c, err := e.Advance(ctx, []byte("ent"), 5)
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			if err := e.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
			for round := range 2 {
				x := e
				if round == 1 {
					x = other()
				}
				for _, tc := range []struct {
					v    uint64
					want engine.Outcome
				}{{5, engine.Duplicate}, {3, engine.Stale}} {
					out := make([]engine.Claim, 3)
					if err := x.AdvanceBatch(ctx, bs("ent", "ent", "ent"), []uint64{tc.v, tc.v, tc.v}, out); err != nil {
						t.Fatal(err)
					}
					for i := range out {
						if out[i].Outcome != tc.want {
							t.Errorf("AdvanceBatch [ent×3] version %d (stored 5): position %d = %v, want %v", tc.v, i, out[i].Outcome, tc.want)
						}
					}
				}
				out := make([]engine.Claim, 3)
				if err := x.AdvanceBatch(ctx, bs("ent", "ent", "ent"), []uint64{9, 9, 9}, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Outcome != engine.New || out[1].Outcome != engine.InFlight || out[2].Outcome != engine.InFlight {
					t.Errorf("AdvanceBatch [ent×3] version 9: %v %v %v, want New InFlight InFlight", out[0].Outcome, out[1].Outcome, out[2].Outcome)
				}
				if out[0].Outcome == engine.New {
					_ = x.Release(ctx, out[0])
				}
			}
		})
	}
}

// TestCommitReleaseSameClaimTwice: CommitBatch and ReleaseBatch given
// the same claim twice answer alike in every configuration, and leave the
// key committed (or free).
func TestCommitReleaseSameClaimTwice(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	answers := map[string]string{}
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			c, err := e.Claim(ctx, []byte("k"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			errs := make([]error, 2)
			cerr := e.CommitBatch(ctx, []engine.Claim{c, c}, errs)
			commit := fmt.Sprintf("commit: %v [%v %v]", errors.Is(cerr, engine.ErrLeaseLost), errors.Is(errs[0], engine.ErrLeaseLost), errors.Is(errs[1], engine.ErrLeaseLost))
			if cerr != nil && !errors.Is(cerr, engine.ErrLeaseLost) {
				t.Errorf("CommitBatch [c c]: %v", cerr)
			}
			if errs[0] != nil && errs[1] != nil {
				t.Errorf("CommitBatch [c c]: neither position committed: %v", errs)
			}
			if in, err := e.Lookup(ctx, []byte("k")); err != nil || in.Outcome != engine.Duplicate {
				t.Errorf("after CommitBatch [c c]: %v %v", in.Outcome, err)
			}
			r, err := e.Claim(ctx, []byte("r"))
			if err != nil || r.Outcome != engine.New {
				t.Fatal(r.Outcome, err)
			}
			rerr := e.ReleaseBatch(ctx, []engine.Claim{r, r}, errs)
			release := fmt.Sprintf("release: %v [%v %v]", errors.Is(rerr, engine.ErrLeaseLost), errors.Is(errs[0], engine.ErrLeaseLost), errors.Is(errs[1], engine.ErrLeaseLost))
			if rerr != nil && !errors.Is(rerr, engine.ErrLeaseLost) {
				t.Errorf("ReleaseBatch [r r]: %v", rerr)
			}
			if in, err := e.Lookup(ctx, []byte("r")); err != nil || in.Outcome != engine.New {
				t.Errorf("after ReleaseBatch [r r]: %v %v", in.Outcome, err)
			}
			mu.Lock()
			answers[cfg.name] = commit + "; " + release
			mu.Unlock()
		})
	}
	var first string
	for _, name := range []string{"memory", "default", "redis", "postgres"} {
		a, ok := answers[name]
		if !ok {
			continue
		}
		t.Logf("%s: %s", name, a)
		if first == "" {
			first = a
		} else if a != first {
			t.Errorf("configurations disagree: %s answered %q, memory %q", name, a, first)
		}
	}
}

// TestPoisonRepeats: a poisoned key repeated in a ClaimBatch or a
// MarkBatch is Poison at every position (a consumer dead-letters each), as
// a committed key is Duplicate at every position.
func TestPoisonRepeats(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{MaxAttempts: 1, Lease: time.Minute})
			defer e.Close()
			c, err := e.Claim(ctx, []byte("p"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			if err := e.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			if cfg.name == "default" {
				e = other() // the count read from Pebble, not memory
			}
			claims := make([]engine.Claim, 2)
			if err := e.ClaimBatch(ctx, bs("p", "p"), nil, claims); err != nil {
				t.Fatal(err)
			}
			if claims[0].Outcome != engine.Poison || claims[1].Outcome != engine.Poison {
				t.Errorf("ClaimBatch [p p] of a poisoned key: %v %v, want poison poison", claims[0].Outcome, claims[1].Outcome)
			}
			outs := make([]engine.Outcome, 2)
			if err := e.MarkBatch(ctx, bs("p", "p"), nil, outs); err != nil {
				t.Fatal(err)
			}
			if outs[0] != engine.Poison || outs[1] != engine.Poison {
				t.Errorf("MarkBatch [p p] of a poisoned key: %v %v, want poison poison", outs[0], outs[1])
			}
			infos := make([]engine.KeyInfo, 2)
			if err := e.LookupBatch(ctx, bs("p", "p"), infos); err != nil {
				t.Fatal(err)
			}
			if infos[0].Outcome != engine.Poison || infos[1].Outcome != engine.Poison {
				t.Errorf("LookupBatch [p p]: %v %v", infos[0].Outcome, infos[1].Outcome)
			}
		})
	}
}
