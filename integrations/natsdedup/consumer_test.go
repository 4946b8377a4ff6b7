package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/natsdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

// stream creates stream ORDERS (subjects orders.>, a short duplicate
// window, so that the test's re-sends reach the consumer) and a durable
// pull consumer with ackWait.
func stream(t *testing.T, url string, ackWait time.Duration) (*nats.Conn, jetstream.JetStream, jetstream.Consumer) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, cons
}

func publish(t *testing.T, js jetstream.JetStream, id, data string) {
	t.Helper()
	msg := &nats.Msg{Subject: "orders.new", Data: []byte(data), Header: nats.Header{}}
	if id != "" {
		msg.Header.Set(nats.MsgIdHdr, id)
	}
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// waitAcked waits until the consumer has nothing pending or unacked.
func waitAcked(t *testing.T, cons jetstream.Consumer, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		info, err := cons.Info(context.Background())
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages left: %+v %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutcomes: each outcome gets its acknowledgement. A handled message
// is acked after its commit; a re-send past JetStream's duplicate window is
// a Duplicate, acked unhandled; a handler running for two and a half ack
// waits keeps its message (InProgress) and its claim (Extend), so it is
// not delivered again meanwhile; a handler that keeps failing is retried
// until Poison, then terminated; a key another worker holds is delayed
// until that worker commits; a message without a key, and one re-sent with
// another payload, are terminated.
func TestOutcomes(t *testing.T) {
	srv := startNATS(t)
	// InProgress comes every half ack wait: 800 ms takes a 400 ms stall
	// of the handler's process under -race on a loaded machine.
	const ackWait = 800 * time.Millisecond
	_, js, cons := stream(t, srv.URL, ackWait)
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(t.TempDir()), Lease: ackWait, MaxAttempts: 2, Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var mu sync.Mutex
	var handled, rejected []string
	deliveries := map[string]int{}
	c, err := natsdedup.New(e, &natsdedup.Options{
		AckWait: ackWait, InFlightDelay: 100 * time.Millisecond, Logger: quiet,
		Digest: func(m jetstream.Msg) engine.Digest { return engine.DigestOf(m.Data()) },
		Reject: func(m jetstream.Msg, why error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(why, natsdedup.ErrPoison):
				rejected = append(rejected, string(m.Data())+":poison")
			case errors.Is(why, natsdedup.ErrConflict):
				rejected = append(rejected, string(m.Data())+":conflict")
			case errors.Is(why, engine.ErrEmptyKey):
				rejected = append(rejected, string(m.Data())+":no-key")
			default:
				rejected = append(rejected, string(m.Data())+":"+why.Error())
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Another worker holds "held" until the test commits it, extending
	// its claim meanwhile.
	held, err := e.Claim(ctx, []byte("held"))
	if err != nil || held.Outcome != engine.New {
		t.Fatal(held.Outcome, err)
	}
	commitHeld := make(chan chan error)
	go func() {
		for {
			select {
			case done := <-commitHeld:
				done <- e.Commit(ctx, held)
				return
			case <-time.After(ackWait / 4):
				if err := e.Extend(ctx, &held, ackWait); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		deliveries[string(m.Data())]++
		mu.Unlock()
		c.Handle(ctx, m, func(_ context.Context, m jetstream.Msg) ([]engine.Write, error) {
			mu.Lock()
			handled = append(handled, string(m.Data()))
			mu.Unlock()
			switch string(m.Data()) {
			case "fail":
				return nil, errors.New("fails")
			case "slow":
				time.Sleep(5 * ackWait / 2)
			}
			return []engine.Write{{Key: append([]byte("ledger/"), m.Data()...), Value: []byte{1}}}, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	publish(t, js, "a", "a")
	publish(t, js, "slow", "slow")
	publish(t, js, "fail", "fail")
	publish(t, js, "held", "held")
	publish(t, js, "", "no-key")
	publish(t, js, "c1", "x")
	time.Sleep(200 * time.Millisecond) // past the stream's duplicate window
	publish(t, js, "a", "a")
	publish(t, js, "c1", "y")
	time.Sleep(3 * ackWait)
	done := make(chan error)
	commitHeld <- done
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitAcked(t, cons, 20*time.Second)

	mu.Lock()
	defer mu.Unlock()
	count := func(s string) (n int) {
		for _, h := range handled {
			if h == s {
				n++
			}
		}
		return n
	}
	for _, want := range []struct {
		data string
		n    int
	}{{"a", 1}, {"slow", 1}, {"fail", 2}, {"held", 0}, {"x", 1}, {"y", 0}, {"no-key", 0}} {
		if got := count(want.data); got != want.n {
			t.Errorf("%q handled %d times, want %d (handled: %v)", want.data, got, want.n, handled)
		}
	}
	if deliveries["slow"] != 1 {
		t.Errorf("the slow message was delivered %d times: its handler did not keep it in progress", deliveries["slow"])
	}
	// A message buffered in the client past its ack wait is delivered
	// again, so one message may be rejected more than once.
	slices.Sort(rejected)
	rejected = slices.Compact(rejected)
	if want := []string{"fail:poison", "no-key:no-key", "y:conflict"}; !slices.Equal(rejected, want) {
		t.Errorf("rejected %v, want %v", rejected, want)
	}
	s := c.Stats()
	if s.Extends < 2 || s.InFlight < 1 || s.Duplicates < 2 || s.New != 3 {
		t.Errorf("stats %+v: want ≥ 2 extends, ≥ 1 in flight, ≥ 2 duplicates (a, held), 3 new (a, slow, x)", s)
	}
}

// TestPanickingHandler: a handler that panics (recovered by the caller)
// has its claim released and its message redelivered at once: the next
// delivery handles it, within an ack wait, and no heartbeat outlives the
// handler.
func TestPanickingHandler(t *testing.T) {
	const ackWait = 2 * time.Second
	js, cons, c := consumerOf(t, ackWait)
	ctx := context.Background()
	var calls atomic.Int32
	handled := make(chan struct{}, 1)
	panicked := make(chan any, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		defer func() {
			if r := recover(); r != nil {
				panicked <- r
			}
		}()
		c.Handle(ctx, m, func(context.Context, jetstream.Msg) ([]engine.Write, error) {
			if calls.Add(1) == 1 {
				panic("handler bug")
			}
			handled <- struct{}{}
			return nil, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	start := time.Now()
	publish(t, js, "p", "p")
	if r := <-panicked; r != "handler bug" {
		t.Fatalf("the panic that reached the caller: %v", r)
	}
	select {
	case <-handled:
	case <-time.After(ackWait):
		t.Fatalf("after a panic the message was not handled again within an ack wait (%d calls, stats %+v)", calls.Load(), c.Stats())
	}
	waitAcked(t, cons, 10*time.Second)
	if s := c.Stats(); s.Extends != 0 {
		t.Fatalf("%d lease extensions after %v: a heartbeat outlived its handler", s.Extends, time.Since(start))
	}
}

// TestCommitOutlivesHandleContext: a caller that cancels Handle's context
// as Handle returns (defer cancel()) still has its message committed and
// acked once: the commit is written after Handle returned, outside the
// caller's cancellation; the handler runs once.
func TestCommitOutlivesHandleContext(t *testing.T) {
	const ackWait = 2 * time.Second
	js, cons, c := consumerOf(t, ackWait)
	var calls atomic.Int32
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c.Handle(ctx, m, func(context.Context, jetstream.Msg) ([]engine.Write, error) {
			calls.Add(1)
			return nil, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	for i := range 5 {
		publish(t, js, fmt.Sprint("c", i), "c")
	}
	waitAcked(t, cons, 10*time.Second)
	time.Sleep(ackWait) // a redelivery of a message whose commit failed would come now
	if n := calls.Load(); n != 5 {
		t.Fatalf("the handler ran %d times for 5 messages (stats %+v)", n, c.Stats())
	}
	if s := c.Stats(); s.New != 5 || s.Failed != 0 {
		t.Fatalf("stats %+v, want 5 new, none failed", s)
	}
}

// consumerOf starts a NATS server with the test's stream, and a Consumer
// on an embedded engine whose lease is the ack wait.
func consumerOf(t *testing.T, ackWait time.Duration) (jetstream.JetStream, jetstream.Consumer, *natsdedup.Consumer) {
	t.Helper()
	srv := startNATS(t)
	_, js, cons := stream(t, srv.URL, ackWait)
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(t.TempDir()), Lease: ackWait, Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	c, err := natsdedup.New(e, &natsdedup.Options{AckWait: ackWait, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, c
}
