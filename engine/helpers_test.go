package engine_test

import (
	"io"
	"log"
	"os"
	"os/exec"
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

// startChild re-executes this test binary with env set (TestMain sends it to
// the child's code) and returns it started, with its stdout.
func startChild(t *testing.T, env string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdout
}
