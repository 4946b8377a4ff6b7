package engine_test

import (
	"io"
	"log"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// fakeClock is an injected clock that tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var quiet = log.New(io.Discard, "", 0)

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
		if os.Getenv("ENGINE_LOG") != "" {
			o.Logger = log.New(os.Stderr, "engine: ", 0)
		}
	}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
