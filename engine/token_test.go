package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestTokens: a token is consumed exactly once; a second use, an expired
// token and one never issued are each their own error; the state survives
// a restart (Default) and is shared (Redis, PostgreSQL: consumed by another
// process); a reserved namespace name is refused to callers.
func TestTokens(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis", "postgres") { // memory-only refuses (TestTokenRefused)
		t.Run(cfg.name, func(t *testing.T) {
			clock := newClock()
			o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute}
			if !cfg.shared {
				o.Clock = clock // the shared tiers expire by the server's clock
			}
			o.NoSharedCache = cfg.shared
			e, other, _ := cfg.open(t, o)
			defer e.Close()
			tok, err := e.IssueToken(ctx, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			short, err := e.IssueToken(ctx, 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			unused, _ := e.IssueToken(ctx, 10*time.Minute)
			if len(tok) != 22 || tok == short || strings.ContainsAny(tok, "+/=") {
				t.Fatalf("tokens %q, %q", tok, short)
			}
			b := other() // a restart, another process, or the same engine
			if err := b.ConsumeToken(ctx, tok); err != nil {
				t.Fatalf("first use: %v", err)
			}
			for _, x := range []*engine.Engine{b, e} {
				if x == e && cfg.name == "default" {
					continue // closed by the restart
				}
				if err := x.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
					t.Fatalf("second use: %v, want ErrTokenUsed", err)
				}
			}
			forged := []byte(tok)
			forged[3] ^= 1
			for _, bad := range []string{string(forged), "", "not-a-token", tok + "A"} {
				if err := b.ConsumeToken(ctx, bad); !errors.Is(err, engine.ErrTokenUnknown) {
					t.Fatalf("token %q: %v, want ErrTokenUnknown", bad, err)
				}
			}
			if o.Clock != nil {
				clock.Add(3 * time.Minute)
				if err := b.ConsumeToken(ctx, short); !errors.Is(err, engine.ErrTokenExpired) {
					t.Fatalf("expired token: %v, want ErrTokenExpired", err)
				}
				if err := b.ConsumeToken(ctx, unused); err != nil {
					t.Fatalf("a token within its ttl: %v", err)
				}
			}
			for _, ttl := range []time.Duration{0, -time.Second, 2 * time.Hour} {
				if _, err := b.IssueToken(ctx, ttl); !errors.Is(err, engine.ErrOptions) {
					t.Fatalf("ttl %v: %v, want ErrOptions", ttl, err)
				}
			}
			if _, err := b.Namespace("\x00token/used"); !errors.Is(err, engine.ErrNamespace) {
				t.Fatalf("a reserved namespace name: %v", err)
			}
		})
	}
}

// TestTokenRace: of many concurrent uses of one token exactly one
// succeeds; every other is ErrTokenUsed, or ErrInFlight while the winner's
// use is being made durable, and a retry of those is ErrTokenUsed.
func TestTokenRace(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{NoSharedCache: cfg.shared})
			defer e.Close()
			for range 50 {
				tok, err := e.IssueToken(ctx, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				var ok, used, busy atomic.Int32
				var wg sync.WaitGroup
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						switch err := e.ConsumeToken(ctx, tok); {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, engine.ErrTokenUsed):
							used.Add(1)
						case errors.Is(err, engine.ErrInFlight):
							busy.Add(1)
						default:
							t.Error(err)
						}
					}()
				}
				wg.Wait()
				if ok.Load() != 1 || used.Load()+busy.Load() != 7 {
					t.Fatalf("%d uses succeeded, %d refused as used, %d as in flight", ok.Load(), used.Load(), busy.Load())
				}
				if err := e.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
					t.Fatalf("a retry once the racers returned: %v, want ErrTokenUsed", err)
				}
			}
		})
	}
}

// TestTokenRefused: memory-only (which could forget a token's use at
// eviction while its issue stays, and let it be used twice) and bloom-only
// issue and consume no tokens.
func TestTokenRefused(t *testing.T) {
	for _, tiers := range []engine.Tiers{engine.MemoryOnly, engine.BloomOnly} {
		e := open(t, engine.Options{Tiers: tiers, ExpectedKeys: 1000})
		if _, err := e.IssueToken(context.Background(), time.Minute); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%v IssueToken: %v, want ErrOptions", tiers, err)
		}
		if err := e.ConsumeToken(context.Background(), "AAAAAAAAAAAAAAAAAAAAAA"); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%v ConsumeToken: %v, want ErrOptions", tiers, err)
		}
		e.Close()
	}
}

// TestTokenHasOneSpelling: every string within one edit of a real token
// (each character replaced by every other of base64's alphabets, a
// character removed or added, padding, a line break) is ErrTokenUnknown
// and does not consume it, then the token itself is consumed once. The
// lenient decoder read some of them as the same 128 bits (the last
// character's unused bits, line breaks).
func TestTokenHasOneSpelling(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000})
	defer e.Close()
	tok, err := e.IssueToken(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=\r\n. "
	var near []string
	for i := range len(tok) {
		for _, r := range alphabet {
			if byte(r) != tok[i] {
				near = append(near, tok[:i]+string(r)+tok[i+1:])
			}
			near = append(near, tok[:i]+string(r)+tok[i:]) // inserted
		}
		near = append(near, tok[:i]+tok[i+1:]) // removed
	}
	near = append(near, tok+"==", tok+"\n", " "+tok, strings.ToUpper(tok), tok+tok)
	for _, s := range near {
		if err := e.ConsumeToken(ctx, s); !errors.Is(err, engine.ErrTokenUnknown) {
			t.Fatalf("%q beside %q: %v, want ErrTokenUnknown", s, tok, err)
		}
	}
	if err := e.ConsumeToken(ctx, tok); err != nil {
		t.Fatalf("the token after %d neighbours: %v", len(near), err)
	}
}

// steppingClock moves on by step at every reading once armed: a call that
// reads the clock more than once sees each of its steps take longer than
// the lease, as a call stalled by a pause or a slow disk would.
type steppingClock struct {
	fakeClock
	step atomic.Int64
}

func (c *steppingClock) Now() time.Time {
	if s := c.step.Load(); s > 0 {
		c.fakeClock.Add(time.Duration(s))
	}
	return c.fakeClock.Now()
}

// TestTokenStallIsNotAUse: a ConsumeToken whose own use outlives the Lease
// between its claim and its commit is ErrInFlight (nothing was decided,
// retry), never ErrTokenUsed; the next call consumes it, and only once.
func TestTokenStallIsNotAUse(t *testing.T) {
	ctx := context.Background()
	clock := &steppingClock{fakeClock: *newClock()}
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Clock: clock,
		Window: 24 * time.Hour, Partition: time.Hour, Lease: time.Minute})
	defer e.Close()
	tok, err := e.IssueToken(ctx, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clock.step.Store(int64(time.Minute + time.Second))
	err = e.ConsumeToken(ctx, tok)
	clock.step.Store(0)
	if !errors.Is(err, engine.ErrInFlight) {
		t.Fatalf("a use that stalled past its lease: %v, want ErrInFlight", err)
	}
	if err := e.ConsumeToken(ctx, tok); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if err := e.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
		t.Fatalf("after the retry: %v, want ErrTokenUsed", err)
	}
}
