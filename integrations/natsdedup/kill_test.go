package natsdedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/natsdedup"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestMain sends a consumer process (this test binary, re-executed by
// crashtest.Start) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{"consumer": child})
}

type childSpec struct {
	URL     string
	Dir     string
	AckWait time.Duration
}

// child consumes the durable consumer "work" until killed. The effect of a
// message is a ledger record ledger/<id>/<pid>-<seq>, one per application,
// written with the mark. A message whose data ends
// in "slow" takes 1.5 ack waits. It prints "R id" for a redelivery, "D" for
// a duplicate absorbed.
func child(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	say := crashtest.Say()
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(spec.Dir), ExpectedKeys: 100_000, Lease: spec.AckWait, Logger: quietEngine})
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	defer e.Close()
	nc, err := nats.Connect(spec.URL)
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	js, err := jetstream.New(nc)
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cons, err := js.Consumer(ctx, "ORDERS", "work")
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	c, err := natsdedup.New(e, &natsdedup.Options{AckWait: spec.AckWait, InFlightDelay: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	pid, seq := os.Getpid(), 0
	handle := func(_ context.Context, m jetstream.Msg) ([]engine.Write, error) {
		seq++
		if strings.HasSuffix(string(m.Data()), "slow") {
			time.Sleep(3 * spec.AckWait / 2)
		}
		return []engine.Write{{Key: fmt.Appendf(nil, "ledger/%s/%d-%d", m.Headers().Get(nats.MsgIdHdr), pid, seq), Value: []byte{1}}}, nil
	}
	before := c.Stats()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
			say("R %s", m.Headers().Get(nats.MsgIdHdr))
		}
		c.Handle(ctx, m, handle)
		if s := c.Stats(); s.Duplicates > before.Duplicates {
			say("D")
			before = s
		}
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	<-ctx.Done()
	cc.Stop()
	return 0
}

// TestKills: one consumer process with its engine directory, SIGKILLed at
// random moments at least 10 times and restarted, handles 20,000 messages
// of which a tenth are re-sent past JetStream's duplicate window, and some
// run longer than the ack wait (kept in progress, their claims extended).
// With the effect written in the commit batch, every message's effect is in
// the ledger exactly once.
func TestKills(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run; CI runs it without -short")
	}
	runKills(t)
}

func runKills(t *testing.T) (repeated int) {
	srv := startNATS(t)
	const ackWait = 2 * time.Second
	_, js, cons := stream(t, srv.URL, ackWait)
	dir := t.TempDir()
	spec, _ := json.Marshal(childSpec{URL: srv.URL, Dir: filepath.Join(dir, "dedup"), AckWait: ackWait})

	var mu sync.Mutex
	var redeliveries, dups int
	var proc *crashtest.Child
	start := func() {
		// It runs until killed, or stopped at the end.
		proc = crashtest.Start(t, "consumer", string(spec), &crashtest.Options{Timeout: crashtest.NoTimeout, OnLine: func(line string) {
			mu.Lock()
			switch f := strings.Fields(line); f[0] {
			case "R":
				redeliveries++
			case "D":
				dups++
			case "ERR":
				t.Errorf("consumer: %s", line)
			}
			mu.Unlock()
		}})
	}
	start()

	const n = 20_000
	rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
	ids := make([]string, 0, n)
	produced := make(chan struct{})
	seed := rng.Uint64()
	go func() {
		defer close(produced)
		prng := rand.New(rand.NewPCG(seed, 5))
		for i := range n {
			id := "m-" + strconv.Itoa(i)
			data := id
			if prng.IntN(2000) == 0 {
				data += "-slow"
			}
			pub(t, js, id, data)
			// A re-send of a message published at least 500 earlier: past
			// the stream's duplicate window.
			if i > 500 && prng.IntN(10) == 0 {
				old := "m-" + strconv.Itoa(prng.IntN(i-500))
				pub(t, js, old, old)
			}
			if i%1000 == 0 {
				time.Sleep(150 * time.Millisecond)
			}
		}
	}()
	for i := range n {
		ids = append(ids, "m-"+strconv.Itoa(i))
	}
	kills := 0
	for finished := false; !finished || kills < 10; {
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		_ = proc.Kill()
		kills++
		start()
		select {
		case <-produced:
			finished = true
		default:
		}
	}
	waitAcked(t, cons, 3*time.Minute)
	if err := proc.Stop(syscall.SIGTERM, time.Minute); errors.Is(err, crashtest.ErrNotStopped) {
		t.Error(err)
	}

	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "dedup")), ExpectedKeys: 100_000, Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	effects := map[string]int{}
	if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
		id, _, _ := strings.Cut(strings.TrimPrefix(string(k), "ledger/"), "/")
		effects[id]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, id := range ids {
		switch c := effects[id]; {
		case c == 0:
			missing++
		case c > 1:
			repeated += c - 1
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d messages have no effect", missing, n)
	}
	if repeated > 0 {
		t.Errorf("%d repeated effects with the ledger in the commit batch: want exactly once", repeated)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d messages (+ re-sends past the stream's duplicate window), %d SIGKILLs, %d redeliveries, %d duplicates absorbed, %d repeated effects",
		n, kills, redeliveries, dups, repeated)
	return repeated
}

func pub(t *testing.T, js jetstream.JetStream, id, data string) {
	msg := &nats.Msg{Subject: "orders.new", Data: []byte(data), Header: nats.Header{}}
	msg.Header.Set(nats.MsgIdHdr, id)
	for try := 0; ; try++ {
		_, err := js.PublishMsg(context.Background(), msg)
		if err == nil {
			return
		}
		if try == 5 {
			t.Error(err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
