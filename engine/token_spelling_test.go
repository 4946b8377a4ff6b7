package engine_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// tokenNeighbours are strings that differ from tok but that a lenient
// decoder would read as tok's 128 bits, or nearly: other spellings of the
// same value and malformed strings around it.
func tokenNeighbours(tok string) []string {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		panic(err)
	}
	var n []string
	last := len(tok) - 1
	for _, r := range b64url {
		if byte(r) != tok[last] {
			n = append(n, tok[:last]+string(r)) // same top bits: same value for a lenient decoder
		}
	}
	n = append(n,
		tok+"=", tok+"==", tok+"A", tok[:last], " "+tok, tok+" ", tok+"\n", tok+"\r\n",
		tok[:11]+"\n"+tok[11:], tok[:11]+"\r"+tok[11:], strings.ToUpper(tok), strings.ToLower(tok),
		base64.StdEncoding.EncodeToString(raw), base64.URLEncoding.EncodeToString(raw),
		base64.RawStdEncoding.EncodeToString(raw), tok+"\x00", "\x00"+tok, tok[:last]+"\u00e9",
		strings.NewReplacer("-", "+", "_", "/").Replace(tok),
	)
	var out []string
	for _, s := range n {
		if s != tok {
			out = append(out, s)
		}
	}
	return out
}

// TestTokenCanonical: every string but the one IssueToken returned
// is ErrTokenUnknown, before and after the token is used, and none of them
// consumes it.
func TestTokenCanonical(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{Lease: time.Minute})
			defer e.Close()
			tok, err := e.IssueToken(ctx, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if len(tok) != 22 {
				t.Fatalf("token %q: %d characters", tok, len(tok))
			}
			nb := tokenNeighbours(tok)
			check := func(phase string) {
				for _, s := range nb {
					if err := e.ConsumeToken(ctx, s); !errors.Is(err, engine.ErrTokenUnknown) {
						t.Errorf("%s: ConsumeToken(%q) (token %q): %v, want ErrTokenUnknown", phase, s, tok, err)
					}
				}
			}
			check("before use")
			x := other()
			if err := x.ConsumeToken(ctx, tok); err != nil {
				t.Fatalf("the real token after its neighbours: %v", err)
			}
			if cfg.name == "default" {
				e = x
			}
			check("after use")
			if err := x.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
				t.Errorf("second use: %v", err)
			}
		})
	}
}

// TestTokenRaceAcrossProcesses: eight concurrent uses of one token,
// from two engines on one shared tier: exactly one succeeds, the others are
// ErrTokenUsed or ErrInFlight, and once all have returned every use is
// ErrTokenUsed.
func TestTokenRaceAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("redis", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			a, other, _ := cfg.open(t, engine.Options{Lease: time.Minute})
			defer a.Close()
			b := other()
			for round := range 20 {
				tok, err := a.IssueToken(ctx, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				wins := 0
				for i := range 8 {
					x := a
					if i%2 == 1 {
						x = b
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						err := x.ConsumeToken(ctx, tok)
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							wins++
						case errors.Is(err, engine.ErrTokenUsed), errors.Is(err, engine.ErrInFlight):
						default:
							t.Errorf("round %d: %v", round, err)
						}
					}()
				}
				wg.Wait()
				if wins != 1 {
					t.Fatalf("round %d: %d uses succeeded", round, wins)
				}
				for _, x := range []*engine.Engine{a, b} {
					if err := x.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
						t.Fatalf("round %d: after the race: %v", round, err)
					}
				}
			}
		})
	}
}

// TestTokenDeadlines: ConsumeToken given ever longer deadlines, as a
// caller retrying after timeouts: no call may be ErrTokenUsed before one
// call has returned nil (no other call used it), and exactly one returns
// nil.
func TestTokenDeadlines(t *testing.T) {
	for _, cfg := range configs("default", "redis", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute})
			defer e.Close()
			for round := range 10 {
				tok, err := e.IssueToken(context.Background(), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				used := false
				for d := time.Microsecond * time.Duration(1+round*7); d < 5*time.Second; d = d * 3 / 2 {
					ctx, cancel := context.WithTimeout(context.Background(), d)
					err := e.ConsumeToken(ctx, tok)
					cancel()
					if err == nil {
						used = true
						break
					}
					if errors.Is(err, engine.ErrTokenUsed) {
						t.Fatalf("round %d: deadline %v: ErrTokenUsed, but no call has used the token", round, d)
					}
				}
				if !used {
					t.Fatalf("round %d: never consumed", round)
				}
				if err := e.ConsumeToken(context.Background(), tok); !errors.Is(err, engine.ErrTokenUsed) {
					t.Fatalf("after the use: %v", err)
				}
			}
		})
	}
}

// TestTokenTTL: ttls outside (0, Window] are ErrOptions and issue
// nothing; a token expires exactly at its ttl.
func TestTokenTTL(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Clock: clock, Window: time.Hour, Partition: time.Minute, Lease: time.Second})
	defer e.Close()
	before := e.Stats()
	for _, ttl := range []time.Duration{0, -1, math.MinInt64, time.Hour + 1, math.MaxInt64} {
		if tok, err := e.IssueToken(ctx, ttl); !errors.Is(err, engine.ErrOptions) || tok != "" {
			t.Errorf("IssueToken(%v): %q %v, want ErrOptions", ttl, tok, err)
		}
	}
	if after := e.Stats(); after.Calls.Claims != before.Calls.Claims || after.Calls.Commits != before.Calls.Commits {
		t.Errorf("refused IssueTokens claimed or committed: %+v -> %+v", before, after)
	}
	tok, err := e.IssueToken(ctx, time.Hour)
	if err != nil {
		t.Fatalf("ttl = Window: %v", err)
	}
	short, err := e.IssueToken(ctx, time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Nanosecond)
	if err := e.ConsumeToken(ctx, short); !errors.Is(err, engine.ErrTokenExpired) {
		t.Errorf("1ns token 1ns later: %v, want ErrTokenExpired", err)
	}
	clock.Add(time.Hour - 2*time.Nanosecond)
	if err := e.ConsumeToken(ctx, tok); err != nil {
		t.Errorf("ttl Window, 1ns before its end: %v", err)
	}
	for _, s := range []string{"", "A", strings.Repeat("A", 22), strings.Repeat("\x00", 22), strings.Repeat("A", 1<<20)} {
		if err := e.ConsumeToken(ctx, s); !errors.Is(err, engine.ErrTokenUnknown) {
			t.Errorf("ConsumeToken(%.30q): %v, want ErrTokenUnknown", s, err)
		}
	}
	m := open(t, engine.Options{Tiers: engine.MemoryOnly})
	defer m.Close()
	if _, err := m.IssueToken(ctx, time.Minute); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("memory-only IssueToken: %v", err)
	}
	if err := m.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("memory-only ConsumeToken: %v", err)
	}
	_ = fmt.Sprint()
}
