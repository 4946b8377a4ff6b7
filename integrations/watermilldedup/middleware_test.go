package watermilldedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/watermilldedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

func openEngine(t *testing.T, o engine.Options) *engine.Engine {
	t.Helper()
	if o.Tiers == engine.Default && o.Backend == nil {
		o.Backend = embedded.Dir(t.TempDir())
	}
	if o.ExpectedKeys == 0 {
		o.ExpectedKeys = 10_000
	}
	o.Logger = quietEngine
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func newMiddleware(t *testing.T, e *engine.Engine, o watermilldedup.Options) *watermilldedup.Middleware {
	t.Helper()
	if o.Logger == nil {
		o.Logger = watermill.NopLogger{}
	}
	m, err := watermilldedup.New(e, &o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func msg(uuid, payload string) *message.Message {
	return message.NewMessage(uuid, []byte(payload))
}

// ledger returns the records under ledger/ the engine holds.
func ledger(t *testing.T, e *engine.Engine) []string {
	t.Helper()
	var keys []string
	if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
		keys = append(keys, string(k))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// counter is a handler that counts its runs, writes ledger/<uuid>/<run>,
// produces two messages (a new UUID each, metadata, a payload), and fails
// while fail says so.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
	fail func(m *message.Message, run int) error
}

func (c *counter) handle(m *message.Message) ([]*message.Message, error) {
	c.mu.Lock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[m.UUID]++
	run := c.runs[m.UUID]
	c.mu.Unlock()
	if err := watermilldedup.AddWrites(m.Context(), engine.Write{Key: fmt.Appendf(nil, "ledger/%s/%d", m.UUID, run), Value: m.Payload}); err != nil {
		return nil, err
	}
	if c.fail != nil {
		if err := c.fail(m, run); err != nil {
			return nil, err
		}
	}
	a := message.NewMessage(watermill.NewUUID(), append([]byte("out-a:"), m.Payload...))
	a.Metadata.Set("in", m.UUID)
	a.Metadata.Set("kind", "a")
	b := message.NewMessage(watermill.NewUUID(), nil)
	return []*message.Message{a, b}, nil
}

func (c *counter) count(uuid string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[uuid]
}

func sameMessages(t *testing.T, got, want []*message.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.UUID != w.UUID || !bytes.Equal(g.Payload, w.Payload) || !maps.Equal(g.Metadata, w.Metadata) {
			t.Fatalf("message %d: %s %q %v, want %s %q %v", i, g.UUID, g.Payload, g.Metadata, w.UUID, w.Payload, w.Metadata)
		}
	}
}

// TestNewThenDuplicateReplays: a New message runs its handler once, its
// record is committed with the mark, its produced messages are returned;
// the same UUID again (a redelivery, a producer's re-send), in this engine
// or after it was closed and opened again, does not run the handler and
// returns the first run's produced messages, UUIDs included.
func TestNewThenDuplicateReplays(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, engine.Options{Backend: embedded.Dir(dir)})
	m := newMiddleware(t, e, watermilldedup.Options{})
	var c counter
	h := m.Middleware(c.handle)
	first, err := h(msg("order-1", "books"))
	if err != nil || len(first) != 2 {
		t.Fatalf("%d messages, %v", len(first), err)
	}
	again, err := h(msg("order-1", "books"))
	if err != nil {
		t.Fatal(err)
	}
	sameMessages(t, again, first)
	if n := c.count("order-1"); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	if got := ledger(t, e); len(got) != 1 || got[0] != "ledger/order-1/1" {
		t.Fatalf("ledger %v", got)
	}
	if s := m.Stats(); s.Messages != 2 || s.New != 1 || s.Duplicates != 1 || s.Replayed != 2 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}

	// Durable: a new process (engine) replays the same messages.
	e.Close()
	e2 := openEngine(t, engine.Options{Backend: embedded.Dir(dir)})
	h2 := newMiddleware(t, e2, watermilldedup.Options{}).Middleware(c.handle)
	again, err = h2(msg("order-1", "books"))
	if err != nil {
		t.Fatal(err)
	}
	sameMessages(t, again, first)
	if n := c.count("order-1"); n != 1 {
		t.Fatalf("handler ran %d times after a reopen", n)
	}
	// A handler without produced messages stores none and replays none.
	none := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for range 2 {
		if out, err := newMiddleware(t, e2, watermilldedup.Options{}).Middleware(none)(msg("quiet", "")); err != nil || out != nil {
			t.Fatalf("%v %v", out, err)
		}
	}
}

// TestHandlerErrorReleases: a failing handler's error reaches the router
// (which nacks) unchanged, its records are not committed, and its claim is
// released: the redelivery runs the handler again and commits.
func TestHandlerErrorReleases(t *testing.T) {
	e := openEngine(t, engine.Options{})
	m := newMiddleware(t, e, watermilldedup.Options{})
	boom := errors.New("downstream unavailable")
	c := counter{fail: func(_ *message.Message, run int) error {
		if run == 1 {
			return boom
		}
		return nil
	}}
	h := m.Middleware(c.handle)
	if _, err := h(msg("o", "x")); !errors.Is(err, boom) {
		t.Fatalf("%v, want the handler's error", err)
	}
	if out, err := h(msg("o", "x")); err != nil || len(out) != 2 {
		t.Fatalf("redelivery: %d messages, %v", len(out), err)
	}
	if n := c.count("o"); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	if got := ledger(t, e); len(got) != 1 || got[0] != "ledger/o/2" {
		t.Fatalf("ledger %v: want the second run's record alone", got)
	}
	if s := m.Stats(); s.New != 1 || s.Failed != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPanicReleases: a panicking handler's claim is released and the panic
// goes on to the caller; the redelivery runs the handler (New, not
// InFlight).
func TestPanicReleases(t *testing.T) {
	e := openEngine(t, engine.Options{})
	m := newMiddleware(t, e, watermilldedup.Options{InFlightDelay: time.Millisecond})
	c := counter{fail: func(_ *message.Message, run int) error {
		if run == 1 {
			panic("handler bug")
		}
		return nil
	}}
	h := m.Middleware(c.handle)
	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = h(msg("p", "x"))
		t.Fatal("no panic")
	}()
	if _, err := h(msg("p", "x")); err != nil {
		t.Fatal(err)
	}
	if n := c.count("p"); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	if got := ledger(t, e); len(got) != 1 {
		t.Fatalf("ledger %v", got)
	}
}

// TestInFlight: a key another worker holds is not handled: after
// InFlightDelay the middleware returns ErrInFlight (the router nacks);
// once that worker committed, the redelivery is a Duplicate.
func TestInFlight(t *testing.T) {
	e := openEngine(t, engine.Options{})
	const delay = 80 * time.Millisecond
	m := newMiddleware(t, e, watermilldedup.Options{InFlightDelay: delay})
	ctx := context.Background()
	held, err := e.Claim(ctx, []byte("held"))
	if err != nil || held.Outcome != engine.New {
		t.Fatal(held.Outcome, err)
	}
	var c counter
	h := m.Middleware(c.handle)
	start := time.Now()
	if _, err := h(msg("held", "x")); !errors.Is(err, watermilldedup.ErrInFlight) {
		t.Fatalf("%v, want ErrInFlight", err)
	}
	if d := time.Since(start); d < delay {
		t.Fatalf("answered after %v, want ≥ InFlightDelay %v", d, delay)
	}
	if err := e.Commit(ctx, held); err != nil {
		t.Fatal(err)
	}
	if out, err := h(msg("held", "x")); err != nil || out != nil {
		t.Fatalf("%v %v, want a Duplicate without outputs", out, err)
	}
	if n := c.count("held"); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
	if s := m.Stats(); s.InFlight != 1 || s.Duplicates != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// failingPublisher fails every publish.
type failingPublisher struct{ calls atomic.Int32 }

func (p *failingPublisher) Publish(string, ...*message.Message) error {
	p.calls.Add(1)
	return errors.New("broker down")
}
func (p *failingPublisher) Close() error { return nil }

// TestRejects: a handler that fails MaxAttempts times makes its key
// Poison, a key re-sent with another payload is a Conflict, a message
// without a usable key is not run: each goes to Reject, then to the
// dead-letter topic with its reason, and is acked (nil error); with a
// dead-letter publish failing it is nacked; without a dead-letter topic it
// is acked after Reject.
func TestRejects(t *testing.T) {
	e := openEngine(t, engine.Options{MaxAttempts: 2, MaxKeySize: 16})
	dl := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer dl.Close()
	var mu sync.Mutex
	var rejected []string
	reject := func(m *message.Message, why error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(why, watermilldedup.ErrPoison):
			rejected = append(rejected, m.UUID+":poison")
		case errors.Is(why, watermilldedup.ErrConflict):
			rejected = append(rejected, m.UUID+":conflict")
		case errors.Is(why, watermilldedup.ErrKey) && errors.Is(why, engine.ErrEmptyKey):
			rejected = append(rejected, m.UUID+":empty")
		case errors.Is(why, watermilldedup.ErrKey) && errors.Is(why, engine.ErrKeyTooLong):
			rejected = append(rejected, m.UUID+":long")
		case errors.Is(why, watermilldedup.ErrKey):
			rejected = append(rejected, m.UUID+":key-func")
		default:
			rejected = append(rejected, m.UUID+":"+why.Error())
		}
	}
	m := newMiddleware(t, e, watermilldedup.Options{
		Reject: reject, DeadLetter: dl, DeadLetterTopic: "dead",
		Digest: func(m *message.Message) engine.Digest { return engine.DigestOf(m.Payload) },
		Key: func(m *message.Message) ([]byte, error) {
			if m.Metadata.Get("no-key") != "" {
				return nil, errors.New("no order id")
			}
			return []byte(m.UUID), nil
		},
	})
	boom := errors.New("always fails")
	c := counter{fail: func(m *message.Message, _ int) error {
		if m.UUID == "bad" {
			return boom
		}
		return nil
	}}
	h := m.Middleware(c.handle)
	for range 2 {
		if _, err := h(msg("bad", "x")); !errors.Is(err, boom) {
			t.Fatal(err)
		}
	}
	if out, err := h(msg("bad", "x")); err != nil || out != nil {
		t.Fatalf("poison: %v %v, want acked after the dead letter", out, err)
	}
	if _, err := h(msg("c", "first")); err != nil {
		t.Fatal(err)
	}
	if out, err := h(msg("c", "second")); err != nil || out != nil {
		t.Fatalf("conflict: %v %v", out, err)
	}
	noKey := msg("k", "x")
	noKey.Metadata.Set("no-key", "1")
	for _, in := range []*message.Message{msg("", "x"), msg("0123456789abcdefXYZ", "x"), noKey} {
		if out, err := h(in); err != nil || out != nil {
			t.Fatalf("no key %q: %v %v", in.UUID, out, err)
		}
	}
	if c.count("bad") != 2 || c.count("c") != 1 || c.count("") != 0 || c.count("k") != 0 || c.count("0123456789abcdefXYZ") != 0 {
		t.Fatalf("runs %v", c.runs)
	}
	want := []string{"bad:poison", "c:conflict", ":empty", "0123456789abcdefXYZ:long", "k:key-func"}
	if fmt.Sprint(rejected) != fmt.Sprint(want) {
		t.Fatalf("rejected %v, want %v", rejected, want)
	}
	dead, err := dl.Subscribe(context.Background(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for range want {
		select {
		case d := <-dead:
			d.Ack()
			kinds = append(kinds, d.UUID+":"+d.Metadata.Get(watermilldedup.RejectedKey))
			if d.Metadata.Get(watermilldedup.ReasonKey) == "" {
				t.Errorf("dead letter %s without a reason: %v", d.UUID, d.Metadata)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("dead letters: %v", kinds)
		}
	}
	slices.Sort(kinds) // a persistent GoChannel replays in no order
	if want := "[0123456789abcdefXYZ:key :key bad:poison c:conflict k:key]"; fmt.Sprint(kinds) != want {
		t.Fatalf("dead letters %v, want %s", kinds, want)
	}
	if s := m.Stats(); s.Rejected != 5 || s.DeadLettered != 5 {
		t.Fatalf("stats %+v", s)
	}

	// A dead-letter publish that fails nacks the message (it comes back,
	// is rejected again); without a dead-letter topic, Reject then ack.
	fp := &failingPublisher{}
	m2 := newMiddleware(t, e, watermilldedup.Options{DeadLetter: fp, DeadLetterTopic: "dead", Digest: func(m *message.Message) engine.Digest { return engine.DigestOf(m.Payload) }})
	if _, err := m2.Middleware(c.handle)(msg("c", "third")); err == nil || !errors.Is(err, watermilldedup.ErrConflict) || fp.calls.Load() != 1 {
		t.Fatalf("%v (%d publishes), want a nack naming the conflict", err, fp.calls.Load())
	}
	m3 := newMiddleware(t, e, watermilldedup.Options{Reject: reject})
	if out, err := m3.Middleware(c.handle)(msg("bad", "x")); err != nil || out != nil {
		t.Fatalf("%v %v", out, err)
	}
	if n := len(rejected); n != 6 || rejected[5] != "bad:poison" {
		t.Fatalf("rejected %v", rejected)
	}
}

// TestOutputsTooLarge: produced messages that do not fit the engine's
// MaxResultSize could not be replayed: nothing is committed, the claim is
// released, and the error matches engine.ErrResultTooLarge.
func TestOutputsTooLarge(t *testing.T) {
	e := openEngine(t, engine.Options{MaxResultSize: 64})
	m := newMiddleware(t, e, watermilldedup.Options{})
	var runs atomic.Int32
	h := m.Middleware(func(in *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("x"), 100))}, nil
	})
	for range 2 {
		_, err := h(msg("big", "x"))
		if !errors.Is(err, watermilldedup.ErrOutputsTooLarge) || !errors.Is(err, engine.ErrResultTooLarge) {
			t.Fatalf("%v, want ErrOutputsTooLarge", err)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs: the claim was not released", runs.Load())
	}
}

// fakeClock is an engine clock that jumps when told.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestLeaseKeptAndLost: a handler running until its claim was extended
// four times (every half lease: two leases) keeps it and commits; a
// handler whose claim ends
// under it (the engine's clock jumps past the lease, another worker takes
// the key over) sees its context canceled, commits nothing, and the
// middleware returns ErrLeaseLost.
func TestLeaseKeptAndLost(t *testing.T) {
	clock := &fakeClock{}
	// A beat comes when half the lease is left: a lease of 500 ms takes
	// a 250 ms scheduling stall under -race on a loaded machine.
	const lease = 500 * time.Millisecond
	e := openEngine(t, engine.Options{Lease: lease, Clock: clock})
	m := newMiddleware(t, e, watermilldedup.Options{})
	h := m.Middleware(func(in *message.Message) ([]*message.Message, error) {
		for deadline := time.Now().Add(10 * time.Second); m.Stats().Extends < 4; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%d extends in 10 s", m.Stats().Extends)
				break
			}
		}
		return nil, watermilldedup.AddWrites(in.Context(), engine.Write{Key: []byte("ledger/slow"), Value: []byte{1}})
	})
	if _, err := h(msg("slow", "x")); err != nil {
		t.Fatal(err)
	}
	if s := m.Stats(); s.Extends < 4 || s.New != 1 {
		t.Fatalf("stats %+v: want ≥ 4 extends", s)
	}

	var other engine.Claim
	h = m.Middleware(func(in *message.Message) ([]*message.Message, error) {
		clock.off.Add(int64(time.Minute))
		var err error
		if other, err = e.Claim(context.Background(), []byte("stall")); err != nil || other.Outcome != engine.New {
			t.Errorf("takeover: %v %v", other.Outcome, err)
		}
		select {
		case <-in.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the handler's context was not canceled")
		}
		return nil, watermilldedup.AddWrites(in.Context(), engine.Write{Key: []byte("ledger/stall"), Value: []byte{1}})
	})
	if _, err := h(msg("stall", "x")); !errors.Is(err, watermilldedup.ErrLeaseLost) || !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("%v, want ErrLeaseLost", err)
	}
	if err := e.Commit(context.Background(), other); err != nil {
		t.Fatalf("the worker that took the key over: %v", err)
	}
	if got := ledger(t, e); len(got) != 1 || got[0] != "ledger/slow" {
		t.Fatalf("ledger %v: the stalled handler's record was committed", got)
	}
	if s := m.Stats(); s.LeaseLost != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestAddWritesOutsideHandler: AddWrites needs the context of a New
// message's running handler.
func TestAddWritesOutsideHandler(t *testing.T) {
	w := engine.Write{Key: []byte("ledger/x"), Value: []byte{1}}
	if err := watermilldedup.AddWrites(context.Background(), w); !errors.Is(err, watermilldedup.ErrNoClaim) {
		t.Fatalf("%v, want ErrNoClaim", err)
	}
	e := openEngine(t, engine.Options{})
	var kept context.Context
	h := newMiddleware(t, e, watermilldedup.Options{}).Middleware(func(in *message.Message) ([]*message.Message, error) {
		kept = in.Context()
		return nil, nil
	})
	in := msg("a", "x")
	if _, err := h(in); err != nil {
		t.Fatal(err)
	}
	if err := watermilldedup.AddWrites(kept, w); !errors.Is(err, watermilldedup.ErrNoClaim) {
		t.Fatalf("after the handler returned: %v, want ErrNoClaim", err)
	}
	if in.Context() != context.Background() {
		t.Fatal("the message's context was not given back")
	}
}

// TestRefusesEngines: memory-only and bloom-only engines are refused with
// ErrEngine (FailOpen: TestSharedTier); bad options with ErrOptions.
func TestRefusesEngines(t *testing.T) {
	for name, o := range map[string]engine.Options{
		"memory-only": {Tiers: engine.MemoryOnly},
		"bloom-only":  {Tiers: engine.BloomOnly, Backend: &embedded.Backend{}},
	} {
		e := openEngine(t, o)
		if _, err := watermilldedup.New(e, nil); !errors.Is(err, watermilldedup.ErrEngine) {
			t.Errorf("%s: %v, want ErrEngine", name, err)
		}
	}
	e := openEngine(t, engine.Options{})
	for name, o := range map[string]watermilldedup.Options{
		"negative delay":       {InFlightDelay: -1},
		"huge commit timeout":  {CommitTimeout: 100 * 24 * time.Hour},
		"dead letter no topic": {DeadLetter: &failingPublisher{}},
		"topic no dead letter": {DeadLetterTopic: "dead"},
	} {
		if _, err := watermilldedup.New(e, &o); !errors.Is(err, watermilldedup.ErrOptions) {
			t.Errorf("%s: %v, want ErrOptions", name, err)
		}
	}
	if _, err := watermilldedup.New(nil, nil); !errors.Is(err, watermilldedup.ErrOptions) {
		t.Errorf("no engine: %v", err)
	}
}

// TestSharedTier: over Redis, FailOpen is refused; without it the
// middleware replays produced messages from the shared tier, and AddWrites
// answers ErrWrites (a shared tier writes no records with a commit).
func TestSharedTier(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	fo := openEngine(t, engine.Options{Backend: redis.NewBackend(c, redis.Config{Prefix: "failopen:"}), FailOpen: true})
	if _, err := watermilldedup.New(fo, nil); !errors.Is(err, watermilldedup.ErrEngine) || !strings.Contains(err.Error(), "FailOpen") {
		t.Fatalf("FailOpen: %v, want ErrEngine", err)
	}
	shared := openEngine(t, engine.Options{Backend: redis.NewBackend(c, redis.Config{Prefix: "shared:"})})
	var runs atomic.Int32
	h := newMiddleware(t, shared, watermilldedup.Options{}).Middleware(func(in *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if err := watermilldedup.AddWrites(in.Context(), engine.Write{Key: []byte("k"), Value: []byte{1}}); !errors.Is(err, watermilldedup.ErrWrites) {
			t.Errorf("AddWrites on a shared tier: %v, want ErrWrites", err)
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("out"))}, nil
	})
	first, err := h(msg("r", "x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := h(msg("r", "x"))
	if err != nil {
		t.Fatal(err)
	}
	sameMessages(t, again, first)
	if runs.Load() != 1 {
		t.Fatalf("%d runs", runs.Load())
	}
}

// TestRouter: through a Watermill router and GoChannel, a handler that
// fails its first delivery is nacked, redelivered and run again; a message
// re-sent with the same UUID is acked without running, and the router
// publishes the produced messages of the first run again, same UUIDs.
func TestRouter(t *testing.T) {
	e := openEngine(t, engine.Options{})
	m := newMiddleware(t, e, watermilldedup.Options{})
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer ps.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(m.Middleware)
	c := counter{fail: func(m *message.Message, run int) error {
		if m.UUID == "flaky" && run == 1 {
			return errors.New("first try fails")
		}
		return nil
	}}
	router.AddHandler("h", "in", ps, "out", ps, c.handle)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := ps.Subscribe(ctx, "out")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	byInput := map[string][]string{} // input UUID → produced "a" UUIDs, in order
	receive := func(n int) {
		for range n {
			select {
			case o := <-out:
				o.Ack()
				if o.Metadata.Get("kind") == "a" {
					byInput[o.Metadata.Get("in")] = append(byInput[o.Metadata.Get("in")], o.UUID)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("produced messages: %v", byInput)
			}
		}
	}
	for _, id := range []string{"a", "flaky", "a", "flaky"} {
		if err := ps.Publish("in", msg(id, "p-"+id)); err != nil {
			t.Fatal(err)
		}
		receive(2)
	}
	if c.count("a") != 1 || c.count("flaky") != 2 {
		t.Fatalf("runs %v", c.runs)
	}
	for id, uuids := range byInput {
		if len(uuids) != 2 || uuids[0] != uuids[1] {
			t.Fatalf("%s: produced %v, want one message published twice with one UUID", id, uuids)
		}
	}
	if got := ledger(t, e); fmt.Sprint(got) != "[ledger/a/1 ledger/flaky/2]" {
		t.Fatalf("ledger %v", got)
	}
	if s := m.Stats(); s.New != 2 || s.Duplicates != 2 || s.Failed != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPoisonKeysAreWatermills: the dead-letter metadata keys spelled out
// here are Watermill's poison-queue keys, so a tool reading a PoisonQueue's
// topic reads this package's dead letters too.
func TestPoisonKeysAreWatermills(t *testing.T) {
	for _, k := range []struct{ ours, theirs string }{
		{watermilldedup.ReasonKey, middleware.ReasonForPoisonedKey},
		{watermilldedup.TopicKey, middleware.PoisonedTopicKey},
		{watermilldedup.HandlerKey, middleware.PoisonedHandlerKey},
		{watermilldedup.SubscriberKey, middleware.PoisonedSubscriberKey},
	} {
		if k.ours != k.theirs {
			t.Errorf("key %q, Watermill's is %q", k.ours, k.theirs)
		}
	}
}
