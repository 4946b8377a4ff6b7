package enginetest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Quiet discards the engine's logs.
var Quiet = slog.New(slog.DiscardHandler)

// Clock is an injected clock that tests move by hand.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at 2026-11-29 10:00 UTC.
func NewClock() *Clock {
	return &Clock{t: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)}
}

// ClockAt returns a Clock at t.
func ClockAt(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set puts the clock at t (a clock stepping back, or far ahead).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// ExpectedKeys is what Open sizes a test engine's filters for when o
// does not say: with the default, 10 M keys a partition, Bloom-only
// allocates a filter ring of about 148 MiB at the first key and writes it
// at Close, which under -race took 21 s of a test that marks 66 keys (the
// embedded store's ring grows from about a MiB). A test of the default
// sizing opens its engine with engine.Open.
const ExpectedKeys = 10_000

// Open opens an engine of o, failing t if it cannot: quiet unless
// ENGINE_LOG is set, its filters sized for ExpectedKeys unless o sets
// them, and bloom-only with its filters in memory when o gives it no
// Backend.
func Open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	if o.ExpectedKeys == 0 {
		o.ExpectedKeys = ExpectedKeys
	}
	if o.Tiers == engine.BloomOnly && o.Backend == nil {
		o.Backend = &embedded.Backend{}
	}
	if o.Logger == nil {
		o.Logger = Quiet
		if os.Getenv("ENGINE_LOG") != "" {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
	}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// OpenRedis opens an engine of o over the Redis tier on c, its keys under
// prefix (a fresh one when prefix is empty), failing t if it cannot.
func OpenRedis(t testing.TB, c goredis.UniversalClient, prefix string, o engine.Options) *engine.Engine {
	t.Helper()
	if prefix == "" {
		prefix = fmt.Sprintf("t-%d:", time.Now().UnixNano())
	}
	o.Backend = RedisBackend(c, prefix)
	return Open(t, o)
}

// Ptr returns a pointer to a copy of v.
func Ptr[T any](v T) *T { return &v }

// RedisBackend is the Redis tier over c, its keys under prefix.
func RedisBackend(c goredis.UniversalClient, prefix string) *redis.Backend {
	return redis.NewBackend(c, redis.Config{Prefix: prefix})
}

// PGBackend is the PostgreSQL tier over db, its rows in table.
func PGBackend(db postgres.DB, table string) *postgres.Backend {
	return postgres.NewBackend(db, postgres.Config{Table: table})
}

// SetInArchive sets the function the archiver calls at each stage of
// archiving a partition (nil: none).
func SetInArchive(f func(stage string)) {
	if f == nil {
		hooks.InArchive.Store(nil)
		return
	}
	hooks.InArchive.Store(&f)
}

// ForgetResult is what a Forget returned.
type ForgetResult struct {
	Info engine.KeyInfo
	Err  error
}

// ForgetAsync runs e.Forget(key) on a goroutine of its own.
func ForgetAsync(e *engine.Engine, key []byte) <-chan ForgetResult {
	forgot := make(chan ForgetResult, 1)
	go func() {
		info, err := e.Forget(context.Background(), key)
		forgot <- ForgetResult{info, err}
	}()
	return forgot
}

// HookClock is a Clock that runs fn on the n-th Now() after it is armed.
type HookClock struct {
	*Clock
	mu    sync.Mutex
	n     int
	fn    func()
	fired atomic.Bool
}

// Arm makes the n-th Now() from here run fn.
func (c *HookClock) Arm(n int, fn func()) {
	c.mu.Lock()
	c.n, c.fn = n, fn
	c.mu.Unlock()
}

// Fired reports whether an armed fn ran.
func (c *HookClock) Fired() bool { return c.fired.Load() }

// Now returns the clock's time, first running fn on the armed reading.
func (c *HookClock) Now() time.Time {
	c.mu.Lock()
	var fn func()
	if c.n > 0 {
		c.n--
		if c.n == 0 {
			fn, c.fn = c.fn, nil
		}
	}
	c.mu.Unlock()
	if fn != nil {
		c.fired.Store(true)
		fn()
	}
	return c.Clock.Now()
}

// LoseMarkReply marks key through e while Redis is paused between the
// mark's claim and its commit (the clock hook fires on the commit's clock
// reading), so the commit fails by a 150 ms deadline and is applied when
// Redis resumes after pause. It fails the test unless the mark failed that
// way, and returns once Redis has resumed and applied it.
//
// reading is the clock reading the pause falls on: 1 for a mark in one step
// (Redis without MaxAttempts: the pause precedes the mark, which waits in
// Redis's socket and is applied when it resumes), 2 for a claim and its
// commit (MaxAttempts: the pause falls between them).
func LoseMarkReply(t *testing.T, e *engine.Engine, clock *HookClock, srv *redistest.Server, key []byte, pause time.Duration, reading int) {
	t.Helper()
	clock.Arm(reading, func() {
		srv.Pause()
		time.AfterFunc(pause, srv.Resume)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	o, err := e.MarkIfAbsent(ctx, key)
	cancel()
	if !clock.Fired() {
		t.Fatal("hook did not fire")
	}
	if err == nil {
		t.Fatalf("mark against a paused Redis succeeded (%v): the lost reply was not exercised", o)
	}
	time.Sleep(pause + 300*time.Millisecond)
}

// RaceEnabled reports whether the test binary was built with -race, whose
// sync.Pool drops items on purpose (allocation counts mean nothing then)
// and which slows a run several times.
func RaceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}
