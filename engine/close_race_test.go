package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestCloseRace: calls racing Close either complete or leave nothing
// held: another engine on the same state (another process of a shared
// tier, or the reopened directory) finds each key as the call's answer
// says (a failed MarkBatch marked nothing and holds nothing; a failed
// ConsumeToken did not use the token and holds no use; a failed Forget
// forgot nothing and holds nothing; a failed Advance holds nothing). No
// call and no Close hangs.
func TestCloseRace(t *testing.T) {
	for _, cfg := range configs("default", "redis", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			rounds := 12
			if testing.Short() {
				rounds = 3
			}
			for round := range rounds {
				closeRaceRound(t, cfg, round, 0)
				if t.Failed() {
					return
				}
			}
			if !cfg.shared {
				return
			}
			for round := range rounds / 2 {
				closeRaceRound(t, cfg, round, 5*time.Millisecond) // a slow tier: calls are mid-flight when Close runs
				if t.Failed() {
					return
				}
			}
		})
	}
}

func closeRaceRound(t *testing.T, cfg engineCfg, round int, slow time.Duration) {
	ctx := context.Background()
	e, other, f := cfg.open(t, engine.Options{Lease: 5 * time.Minute, NoSharedCache: cfg.shared})
	tok, err := e.IssueToken(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.MarkIfAbsent(ctx, []byte("fz")); err != nil {
		t.Fatal(err)
	}
	ca, err := e.Claim(ctx, []byte("ca"))
	if err != nil || ca.Outcome != engine.New {
		t.Fatal(ca.Outcome, err)
	}
	advance := cfg.name != "postgres"
	mkeys := bs("m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7")

	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		markErr  error
		marks    = make([]engine.Outcome, len(mkeys))
		issued   string
		issueErr error
		useErr   error
		fgErr    error
		advClaim engine.Claim
		advErr   error
		advFreed bool
		asyncErr = make(chan error, 1)
		doErr    error
	)
	run := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn()
		}()
	}
	run(func() { markErr = e.MarkBatch(ctx, mkeys, nil, marks) })
	run(func() { issued, issueErr = e.IssueToken(ctx, time.Hour) })
	run(func() { useErr = e.ConsumeToken(ctx, tok) })
	run(func() { _, fgErr = e.Forget(ctx, []byte("fz")) })
	if advance {
		run(func() {
			advClaim, advErr = e.Advance(ctx, []byte("ent"), 1)
			if advErr == nil && advClaim.Outcome == engine.New {
				advFreed = e.Release(ctx, advClaim) == nil
			}
		})
	}
	run(func() { e.CommitAsync(ctx, ca, func(err error) { asyncErr <- err }) })
	run(func() {
		_, doErr = e.Do(ctx, []byte("do"), func(ctx context.Context) error {
			// An engine call from inside the handler, while Close runs.
			_, err := e.MarkIfAbsent(ctx, []byte("inner"))
			if err != nil && !errors.Is(err, engine.ErrClosed) {
				return err
			}
			return nil
		})
	})
	f.delay.Store(int64(slow))
	close(start)
	time.Sleep(time.Duration(rand.IntN(3000))*time.Microsecond + slow*time.Duration(rand.IntN(4)))
	within(t, 20*time.Second, "Close racing calls", func() {
		if err := e.Close(); err != nil {
			t.Errorf("round %d: Close: %v", round, err)
		}
	})
	within(t, 20*time.Second, "calls racing Close", wg.Wait)
	var aerr error
	select {
	case aerr = <-asyncErr:
	case <-time.After(10 * time.Second):
		t.Fatalf("round %d: a CommitAsync done never ran", round)
	}
	_ = doErr
	t.Logf("round %d: mark %v, issue %v, use %v, forget %v, advance %v/%v freed %v, async %v, do %v", round, markErr, issueErr, useErr, fgErr, advClaim.Outcome, advErr, advFreed, aerr, doErr)

	f.delay.Store(0)
	x := other()
	defer x.Close()
	look := func(key string) engine.Outcome {
		t.Helper()
		in, err := x.Lookup(ctx, []byte(key))
		if err != nil {
			t.Fatalf("round %d: Lookup(%s): %v", round, key, err)
		}
		return in.Outcome
	}
	// MarkBatch: done whole or not at all.
	for i, k := range mkeys {
		got := look(string(k))
		switch {
		case markErr == nil && marks[i] == engine.New && got != engine.Duplicate:
			t.Errorf("round %d: MarkBatch answered New for %s, other engine sees %v", round, k, got)
		case markErr != nil && got != engine.New:
			t.Errorf("round %d: MarkBatch failed (%v), other engine sees %s %v (a failed mark must mark and hold nothing)", round, markErr, k, got)
		}
	}
	// ConsumeToken.
	uerr := x.ConsumeToken(ctx, tok)
	switch {
	case useErr == nil && !errors.Is(uerr, engine.ErrTokenUsed):
		t.Errorf("round %d: ConsumeToken succeeded, other engine's use: %v, want ErrTokenUsed", round, uerr)
	case useErr != nil && uerr != nil:
		t.Errorf("round %d: ConsumeToken failed (%v), other engine's use: %v, want nil (the failed call neither used nor holds it)", round, useErr, uerr)
	}
	// IssueToken.
	if issueErr == nil {
		if err := x.ConsumeToken(ctx, issued); err != nil {
			t.Errorf("round %d: a token IssueToken returned during Close: other engine's use %v", round, err)
		}
	}
	// Forget.
	switch got := look("fz"); {
	case fgErr == nil && got != engine.New:
		t.Errorf("round %d: Forget succeeded, other engine sees %v", round, got)
	case fgErr != nil && got != engine.Duplicate:
		t.Errorf("round %d: Forget failed (%v), other engine sees %v, want duplicate", round, fgErr, got)
	}
	// Advance.
	if advance && (advErr != nil || advFreed) {
		if c, err := x.Advance(ctx, []byte("ent"), 1); err != nil || c.Outcome != engine.New {
			t.Errorf("round %d: Advance failed (%v) or was released, other engine: %v %v, want New", round, advErr, c.Outcome, err)
		}
	}
	// CommitAsync.
	if aerr == nil && look("ca") != engine.Duplicate {
		t.Errorf("round %d: CommitAsync done nil, other engine does not see the commit", round)
	}
	_ = fmt.Sprint()
}

// TestCloseDoneAndHandlerCallEngine: a CommitAsync done and a Do
// handler that call the engine (Commit, Claim, MarkIfAbsent, IssueToken,
// ConsumeToken, CommitAsync) while Close runs: nothing deadlocks, and the
// calls return ErrClosed or succeed.
func TestCloseDoneAndHandlerCallEngine(t *testing.T) {
	for _, cfg := range configs("memory", "default", "redis", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			for round := range 8 {
				ctx := context.Background()
				e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute, NoSharedCache: cfg.shared})
				exact := cfg.name != "memory"
				var tok string
				if exact {
					var err error
					if tok, err = e.IssueToken(ctx, time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				var bad []error
				note := func(what string, err error) {
					if err != nil && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrLeaseLost) &&
						!errors.Is(err, engine.ErrOptions) && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						bad = append(bad, fmt.Errorf("%s: %w", what, err))
						mu.Unlock()
					}
				}
				for i := range 16 {
					c, err := e.Claim(ctx, fmt.Appendf(nil, "k%d", i))
					if err != nil || c.Outcome != engine.New {
						t.Fatal(c.Outcome, err)
					}
					c2, err := e.Claim(ctx, fmt.Appendf(nil, "j%d", i))
					if err != nil {
						t.Fatal(err)
					}
					wg.Add(1)
					e.CommitAsync(ctx, c, func(err error) {
						defer wg.Done()
						note("done's own commit", err)
						note("Commit from a done", e.Commit(ctx, c2))
						_, err = e.Claim(ctx, fmt.Appendf(nil, "d%d", i))
						note("Claim from a done", err)
						_, err = e.MarkIfAbsent(ctx, fmt.Appendf(nil, "dm%d", i))
						note("MarkIfAbsent from a done", err)
						if exact {
							_, err = e.IssueToken(ctx, time.Minute)
							note("IssueToken from a done", err)
							err = e.ConsumeToken(ctx, tok)
							if errors.Is(err, engine.ErrTokenUsed) || errors.Is(err, engine.ErrInFlight) {
								err = nil
							}
							note("ConsumeToken from a done", err)
						}
						c3, err := e.Claim(ctx, fmt.Appendf(nil, "da%d", i))
						if err == nil && c3.Outcome == engine.New {
							dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
							wg.Add(1)
							e.CommitAsync(dctx, c3, func(err error) { note("CommitAsync from a done", err); cancel(); wg.Done() })
						}
					})
				}
				for i := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, err := e.Do(ctx, fmt.Appendf(nil, "do%d", i), func(ctx context.Context) error {
							time.Sleep(time.Millisecond)
							_, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "in%d", i))
							if exact {
								_, ierr := e.IssueToken(ctx, time.Minute)
								note("IssueToken in a handler", ierr)
							}
							return err
						})
						note("Do", err)
					}()
				}
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				within(t, 20*time.Second, fmt.Sprintf("round %d: Close with dones and handlers calling the engine", round), func() {
					if err := e.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
				within(t, 20*time.Second, fmt.Sprintf("round %d: dones and handlers", round), wg.Wait)
				for _, err := range bad {
					t.Errorf("round %d: %v", round, err)
				}
			}
		})
	}
}
