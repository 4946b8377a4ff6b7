package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestFailOpenClosedCalls: with FailOpen and the shared tier down,
// every call whose promise is not "at least once" fails closed with
// ErrUnavailable, in combination with NoSharedCache on and off, in a
// named namespace (with its own window where the tier supports one), and
// through the batch and namespace forms of each call.
func TestFailOpenClosedCalls(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("redis", "postgres") {
		for _, nocache := range []bool{true, false} {
			for _, nswin := range []bool{false, true} {
				if nswin && cfg.name == "postgres" {
					continue // refused by Validate
				}
				t.Run(fmt.Sprintf("%s/nocache=%v/nswindow=%v", cfg.name, nocache, nswin), func(t *testing.T) {
					o := engine.Options{FailOpen: true, NoSharedCache: nocache, Lease: time.Minute, MaxAttempts: 3}
					if nswin {
						o.Namespaces = map[string]engine.NamespaceOptions{"pay": {Window: time.Hour}}
					}
					e, other, f := cfg.open(t, o)
					defer e.Close()
					ns, err := e.Namespace("pay")
					if err != nil {
						t.Fatal(err)
					}
					advance := cfg.name == "redis"
					tok, err := e.IssueToken(ctx, 10*time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					pre, err := ns.Claim(ctx, []byte("pre"))
					if err != nil || pre.Outcome != engine.New {
						t.Fatalf("pre: %v %v", pre.Outcome, err)
					}
					ext, _ := ns.Claim(ctx, []byte("ext"))
					var adv engine.Claim
					if advance {
						if adv, err = ns.Advance(ctx, []byte("ent"), 3); err != nil || adv.Outcome != engine.New {
							t.Fatalf("advance: %v %v", adv.Outcome, err)
						}
					}
					f.set(faultDown, "", 0)

					// What FailOpen is for: a claim New, its commit OK.
					during, err := ns.Claim(ctx, []byte("during"))
					if err != nil || during.Outcome != engine.New {
						t.Fatalf("claim during the outage: %v %v", during.Outcome, err)
					}
					if err := e.Commit(ctx, during); err != nil {
						t.Fatalf("fail-open commit: %v", err)
					}
					failed := func(name string, err error) {
						t.Helper()
						if !errors.Is(err, engine.ErrUnavailable) {
							t.Errorf("%s during the outage: %v, want ErrUnavailable", name, err)
						}
					}
					_, err = ns.Lookup(ctx, []byte("never"))
					failed("ns.Lookup", err)
					out := make([]engine.KeyInfo, 3)
					err = ns.LookupBatch(ctx, [][]byte{[]byte("x"), []byte("y"), []byte("x")}, out)
					failed("ns.LookupBatch", err)
					_, err = e.Lookup(ctx, []byte("never"))
					failed("e.Lookup", err)
					if nocache {
						_, err = ns.Forget(ctx, []byte("never"))
						failed("ns.Forget", err)
						err = ns.ForgetBatch(ctx, [][]byte{[]byte("x"), []byte("x")}, make([]engine.KeyInfo, 2))
						failed("ns.ForgetBatch", err)
						// The key committed fail-open: stored nowhere, so
						// Lookup has nothing to read it from.
						info, err := ns.Lookup(ctx, []byte("during"))
						failed(fmt.Sprintf("Lookup of a key committed fail-open (answered %v)", info.Outcome), err)
					}
					failed("Extend", e.Extend(ctx, &ext, 2*time.Minute))
					_, err = e.IssueToken(ctx, time.Minute)
					failed("IssueToken", err)
					failed("ConsumeToken", e.ConsumeToken(ctx, tok))
					if advance {
						_, err = ns.Advance(ctx, []byte("ent2"), 1)
						failed("ns.Advance", err)
						err = ns.AdvanceBatch(ctx, [][]byte{[]byte("a"), []byte("b"), []byte("a")}, []uint64{1, 2, 3}, make([]engine.Claim, 3))
						failed("ns.AdvanceBatch", err)
						_, err = e.Advance(ctx, []byte("ent3"), 1)
						failed("e.Advance", err)
						// The Advance claim's commit, through the queue,
						// racing ordinary commits of fail-open claims.
						var wg sync.WaitGroup
						var advErr error
						wg.Add(1)
						e.CommitAsync(ctx, adv, func(err error) { advErr = err; wg.Done() })
						for i := range 8 {
							c, err := ns.Claim(ctx, fmt.Appendf(nil, "q%d", i))
							if err != nil || c.Outcome != engine.New {
								t.Fatalf("claim q%d: %v %v", i, c.Outcome, err)
							}
							wg.Add(1)
							e.CommitAsync(ctx, c, func(err error) {
								if err != nil && !errors.Is(err, engine.ErrUnavailable) {
									t.Errorf("ordinary queued commit: %v", err)
								}
								wg.Done()
							})
						}
						wg.Wait()
						failed("CommitAsync of an Advance claim", advErr)
						failed("CommitBatch of an Advance claim beside ordinary ones", e.CommitBatch(ctx, []engine.Claim{pre, adv}, nil))
					}
					f.off()

					b := other()
					if err := b.ConsumeToken(ctx, tok); err != nil {
						t.Errorf("the token, consumed by another process after the outage: %v", err)
					}
					if advance {
						bns, _ := b.Namespace("pay")
						_ = e.Release(ctx, adv)
						if c, err := bns.Advance(ctx, []byte("ent"), 2); err != nil || c.Version != 0 {
							t.Errorf("the entity after a failed commit of version 3: %v stored %d %v, want no stored version", c.Outcome, c.Version, err)
						}
						for _, ent := range []string{"ent2", "ent3", "a", "b"} {
							if c, err := bns.Advance(ctx, []byte(ent), 1); err != nil || c.Outcome != engine.New {
								t.Errorf("entity %s, advanced during the outage: %v %v, want New (nothing held, nothing stored)", ent, c.Outcome, err)
							}
						}
					}
					if c, err := e.Claim(ctx, []byte("ext")); err != nil || c.Outcome != engine.New {
						t.Errorf("ext in the default namespace: %v %v, want New (another namespace's key)", c.Outcome, err)
					}
				})
			}
		}
	}
}

// TestFailOpenReleaseAndLate: claims answered fail-open and then
// released (during the outage and after it) leave nothing held, in this
// process or the tier; a fail-open claim committed after the outage while
// another process committed the key meanwhile is fenced (ErrLeaseLost),
// not acknowledged twice; a DoResult during the outage runs and returns
// its result.
func TestFailOpenReleaseAndLate(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("redis", "postgres") {
		for _, nocache := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/nocache=%v", cfg.name, nocache), func(t *testing.T) {
				e, other, f := cfg.open(t, engine.Options{FailOpen: true, NoSharedCache: nocache, Lease: time.Minute, MaxAttempts: 2})
				defer e.Close()
				b := other()
				f.set(faultDown, "", 0)
				c1, err := e.Claim(ctx, []byte("r1"))
				if err != nil || c1.Outcome != engine.New {
					t.Fatalf("r1: %v %v", c1.Outcome, err)
				}
				c2, _ := e.Claim(ctx, []byte("r2"))
				c3, _ := e.Claim(ctx, []byte("r3"))
				relDuring := e.Release(ctx, c1)
				o, res, err := e.DoResult(ctx, []byte("do"), func(context.Context) ([]byte, error) { return []byte("resp"), nil })
				if err != nil || o != engine.New || string(res) != "resp" {
					t.Errorf("DoResult during the outage: %v %q %v", o, res, err)
				}
				f.off()
				if relDuring == nil {
					if c, err := e.Claim(ctx, []byte("r1")); err != nil || c.Outcome != engine.New {
						t.Errorf("r1 released (nil) during the outage, claimed again: %v %v, want New", c.Outcome, err)
					} else {
						_ = e.Release(ctx, c)
					}
				} else if !errors.Is(relDuring, engine.ErrUnavailable) {
					t.Errorf("release during the outage: %v", relDuring)
				}
				if err := e.Release(ctx, c2); err != nil {
					t.Errorf("release of a fail-open claim after the outage: %v", err)
				}
				if c, err := e.Claim(ctx, []byte("r2")); err != nil || c.Outcome != engine.New {
					t.Errorf("r2 after its release: %v %v, want New", c.Outcome, err)
				}
				if c, err := b.Claim(ctx, []byte("r2")); err != nil || c.Outcome != engine.InFlight {
					t.Errorf("r2 claimed by e again, from b: %v %v, want InFlight", c.Outcome, err)
				}
				// r3: another process takes and commits it; e's late commit
				// must not succeed too.
				bc, err := b.Claim(ctx, []byte("r3"))
				if err != nil || bc.Outcome != engine.New {
					t.Fatalf("b's claim of r3: %v %v", bc.Outcome, err)
				}
				if err := b.Commit(ctx, bc); err != nil {
					t.Fatal(err)
				}
				if err := e.Commit(ctx, c3); !errors.Is(err, engine.ErrLeaseLost) {
					t.Errorf("e's late commit of r3 after b committed it: %v, want ErrLeaseLost", err)
				}
			})
		}
	}
}

// TestTokenLostReply: a ConsumeToken whose write reached the tier but
// whose reply was lost returns an error; its retry must then succeed (it
// is the same caller's use), never ErrTokenUsed, which says another call
// used the token. Same for FailOpen engines.
func TestTokenLostReply(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("redis", "postgres") {
		for _, fo := range []bool{false, true} {
			for skip := int64(0); skip < 3; skip++ {
				t.Run(fmt.Sprintf("%s/failopen=%v/skip=%d", cfg.name, fo, skip), func(t *testing.T) {
					e, other, f := cfg.open(t, engine.Options{FailOpen: fo, Lease: time.Minute})
					defer e.Close()
					tok, err := e.IssueToken(ctx, time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					f.set(faultLost, "token/used", 1)
					f.skip.Store(skip)
					first := e.ConsumeToken(ctx, tok)
					f.off()
					hit := f.hits.Load() > 0
					if first == nil {
						if err := e.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
							t.Fatalf("after a successful use: %v", err)
						}
						return
					}
					if !hit {
						t.Fatalf("failed without the fault: %v", first)
					}
					if errors.Is(first, engine.ErrTokenUsed) {
						t.Fatalf("the call whose reply was lost: ErrTokenUsed (nobody else used it)")
					}
					var retry error
					for range 20 {
						retry = e.ConsumeToken(ctx, tok)
						if !errors.Is(retry, engine.ErrInFlight) {
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
					if retry != nil {
						t.Errorf("first call %v; the same caller's retry: %v, want nil (no other call used the token)", first, retry)
					}
					if err := other().ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
						t.Errorf("another process after the retry: %v, want ErrTokenUsed", err)
					}
				})
			}
		}
	}
}

// TestFailOpenTokenUseOutage: with FailOpen, an outage that begins
// inside ConsumeToken (after its read of the issue, at its use's claim or
// its commit) fails the call closed (ErrUnavailable), and the token stays
// usable once the tier is back.
func TestFailOpenTokenUseOutage(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("redis", "postgres") {
		// Every step of the use, until a skip past its last one: the use
		// then succeeds untouched, which ends the sweep.
		past := false
		for skip := int64(0); !past; skip++ {
			if skip == 8 {
				t.Fatalf("%s: a use of more than 8 steps", cfg.name)
			}
			t.Run(fmt.Sprintf("%s/skip=%d", cfg.name, skip), func(t *testing.T) {
				e, other, f := cfg.open(t, engine.Options{FailOpen: true, Lease: time.Minute})
				defer e.Close()
				tok, err := e.IssueToken(ctx, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				f.set(faultDown, "token/used", 0)
				f.skip.Store(skip)
				err = e.ConsumeToken(ctx, tok)
				f.off()
				if f.hits.Load() == 0 {
					if err != nil {
						t.Fatalf("without a fault: %v", err)
					}
					if skip == 0 {
						t.Fatal("the use reached the tier in no step the fault counts")
					}
					past = true
					return
				}
				if !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("a use during the outage: %v, want ErrUnavailable", err)
				}
				// The caller's retry, once the tier is back: the failed
				// use's claim, which its give-back could not reach the
				// tier to free, must not make the token unusable for
				// the lease (the retry is this engine's own use).
				if uerr := e.ConsumeToken(ctx, tok); uerr != nil {
					t.Errorf("the caller's retry once the tier is back: %v, want nil", uerr)
				}
				if uerr := other().ConsumeToken(ctx, tok); !errors.Is(uerr, engine.ErrTokenUsed) {
					t.Errorf("another engine after the retry: %v, want ErrTokenUsed", uerr)
				}
			})
		}
	}
}
