package engine_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// engineCfg is one of the engine's configurations (enginetest.Configs, the
// one list) as these tests drive it: open returns an engine on fresh
// storage whose shared tier's commands pass through f (faults to inject,
// a slow tier), and other another engine on the same state: a second
// process of a shared tier, a reopen of a local durable one (which closes
// e first), the same engine for memory-only.
type engineCfg struct {
	name   string
	shared bool
	cfg    enginetest.Config
	open   func(t *testing.T, o engine.Options) (e *engine.Engine, other func() *engine.Engine, f *faultInjector)
}

// configs returns the configurations named, from the one list; none
// named: memory, default, redis and postgres (the exact ones, on one
// server each).
func configs(names ...string) []engineCfg {
	if len(names) == 0 {
		names = []string{"memory", "default", "redis", "postgres"}
	}
	var out []engineCfg
	for _, c := range enginetest.Pick(names...) {
		out = append(out, engineCfg{name: c.Name, shared: c.Shared, cfg: c, open: func(t *testing.T, o engine.Options) (*engine.Engine, func() *engine.Engine, *faultInjector) {
			return openConfig(t, c, o)
		}})
	}
	return out
}

// openConfig opens c on fresh storage (see engineCfg).
func openConfig(t *testing.T, c enginetest.Config, o engine.Options) (*engine.Engine, func() *engine.Engine, *faultInjector) {
	t.Helper()
	s := c.New(t, c.Name)
	f := &faultInjector{}
	if !c.Shared {
		o.FailOpen, o.NoSharedCache = false, false // refused without a shared tier
	}
	e := open(t, s.Wrapped(o, enginetest.Wrap{
		Redis:     &goredis.Options{MaxRetries: -1}, // a fault is the command's, not hidden by a retry
		RedisHook: f,
		DB:        func(p *pgxpool.Pool) postgres.DB { return faultDB{p, f} },
	}))
	switch {
	case c.Shared:
		return e, func() *engine.Engine {
			p := o
			p.FailOpen = false
			b := open(t, s.Options(p))
			t.Cleanup(func() { b.Close() })
			return b
		}, f
	case c.Durable:
		return e, func() *engine.Engine {
			if err := e.Close(); err != nil {
				t.Logf("closing before the reopen: %v", err)
			}
			e = open(t, s.Options(o))
			t.Cleanup(func() { e.Close() })
			return e
		}, f
	default:
		return e, func() *engine.Engine { return e }, f
	}
}
