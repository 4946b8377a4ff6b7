package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// needCalls makes, for each Need, a call that needs it; each returns the
// call's error.
var needCalls = map[engine.Need]func(ctx context.Context, e *engine.Engine) error{
	engine.NeedLookup: func(ctx context.Context, e *engine.Engine) error {
		_, err := e.Lookup(ctx, []byte("need-lookup"))
		return err
	},
	engine.NeedForget: func(ctx context.Context, e *engine.Engine) error {
		_, err := e.Forget(ctx, []byte("need-forget"))
		return err
	},
	engine.NeedAdvance: func(ctx context.Context, e *engine.Engine) error {
		c, err := e.Advance(ctx, []byte("need-advance"), 1)
		if err == nil && c.Outcome == engine.New {
			err = e.Release(ctx, c)
		}
		return err
	},
	engine.NeedResults: func(ctx context.Context, e *engine.Engine) error {
		_, _, err := e.DoResult(ctx, []byte("need-results"), func(context.Context) ([]byte, error) { return []byte("r"), nil })
		return err
	},
	engine.NeedTokens: func(ctx context.Context, e *engine.Engine) error {
		_, err := e.IssueToken(ctx, time.Minute)
		return err
	},
	engine.NeedExtend: func(ctx context.Context, e *engine.Engine) error {
		c, err := e.Claim(ctx, []byte("need-extend"))
		if err != nil || c.Outcome != engine.New {
			return err
		}
		err = e.Extend(ctx, &c, time.Second)
		return errors.Join(err, e.Release(ctx, c))
	},
	engine.NeedWrites: func(ctx context.Context, e *engine.Engine) error {
		return e.ScanWrites([]byte("w"), func(k, v []byte) error { return nil })
	},
	engine.NeedHandoff: func(ctx context.Context, e *engine.Engine) error {
		return e.Compact(ctx)
	},
}

// TestNeedsRefusedAtOpen: for every configuration and every Need, Open
// with that Need refuses (ErrOptions naming it) exactly the
// configurations whose call of it is refused, and the call refuses with
// the same error; Open with every need a configuration serves succeeds.
// Anchors: bloom-only serves no Lookup, memory-only no tokens, the
// embedded default everything, Redis Forget only with NoSharedCache;
// Redis with FailOpen and PostgreSQL as the calls decide.
func TestNeedsRefusedAtOpen(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	configs := []struct {
		name   string
		opts   func(t *testing.T) engine.Options
		serves engine.Need // anchors: what it must serve
		lacks  engine.Need // anchors: what it must refuse
	}{
		{"memory", func(*testing.T) engine.Options { return engine.Options{Tiers: engine.MemoryOnly} },
			engine.NeedLookup | engine.NeedForget | engine.NeedResults, engine.NeedTokens | engine.NeedWrites | engine.NeedHandoff},
		{"bloom", func(t *testing.T) engine.Options {
			o := engine.Options{Tiers: engine.BloomOnly}
			setDir(&o, t.TempDir())
			return o
		},
			0, engine.NeedLookup | engine.NeedForget | engine.NeedTokens},
		{"default", func(t *testing.T) engine.Options {
			var o engine.Options
			setDir(&o, t.TempDir())
			return o
		}, engine.Need(0xff), 0},
		{"redis", func(t *testing.T) engine.Options {
			return engine.Options{Backend: redisBackend(srv.Client(t), fmt.Sprintf("needs-%d:", time.Now().UnixNano()))}
		}, engine.NeedAdvance | engine.NeedTokens | engine.NeedExtend, engine.NeedForget | engine.NeedWrites | engine.NeedHandoff},
		{"redis-failopen", func(t *testing.T) engine.Options {
			return engine.Options{Backend: redisBackend(srv.Client(t), fmt.Sprintf("needs-f-%d:", time.Now().UnixNano())), FailOpen: true, NoSharedCache: true}
		}, engine.NeedForget | engine.NeedTokens | engine.NeedExtend, engine.NeedWrites | engine.NeedHandoff},
		{"postgres", func(t *testing.T) engine.Options {
			pool := postgresPool(t)
			return engine.Options{Backend: pgBackend(pool, pgTable(t, pool, "needs")), NoSharedCache: true}
		}, engine.NeedForget | engine.NeedTokens | engine.NeedResults, engine.NeedWrites | engine.NeedHandoff},
		{"redis-uncached", func(t *testing.T) engine.Options {
			return engine.Options{Backend: redisBackend(srv.Client(t), fmt.Sprintf("needs-u-%d:", time.Now().UnixNano())), NoSharedCache: true}
		}, engine.NeedForget, 0},
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			open := func(needs engine.Need) (*engine.Engine, error) {
				o := cfg.opts(t)
				o.Logger, o.Needs = quiet, needs
				return engine.Open(&o)
			}
			var served engine.Need
			for need, call := range needCalls {
				e, err := open(0)
				if err != nil {
					t.Fatal(err)
				}
				callErr := call(ctx, e)
				serveErr := e.Serves(need)
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				refused := errors.Is(callErr, engine.ErrOptions)
				if refused != (serveErr != nil) {
					t.Fatalf("%s: the call answered %v, Serves %v: they must agree", need, callErr, serveErr)
				}
				if !refused && callErr != nil {
					t.Fatalf("%s: the call failed: %v", need, callErr)
				}
				e, err = open(need)
				switch {
				case refused && !errors.Is(err, engine.ErrOptions):
					t.Fatalf("Open with Needs %s: %v, want ErrOptions (the call is refused: %v)", need, err, callErr)
				case refused && err.Error() != serveErr.Error():
					t.Fatalf("Open with Needs %s refused with %q, the engine's Serves with %q", need, err, serveErr)
				case refused && !strings.Contains(err.Error(), need.String()):
					t.Fatalf("Open's refusal %q does not name %s", err, need)
				case !refused && err != nil:
					t.Fatalf("Open with Needs %s: %v (the call is served)", need, err)
				case !refused:
					served |= need
					if err := e.Close(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if cfg.serves&served != cfg.serves&0xff || cfg.lacks&served != 0 {
				t.Fatalf("serves %s, want at least %s and none of %s", served, cfg.serves&0xff, cfg.lacks)
			}
			e, err := open(served)
			if err != nil {
				t.Fatalf("Open with every need it serves (%s): %v", served, err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := engine.Open(&engine.Options{Tiers: engine.MemoryOnly, Needs: 1 << 15}); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("Open with an unknown need: %v, want ErrOptions", err)
	}
}
