package rabbitmqtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/rabbittest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// The end-to-end test runs real consumer processes (this test binary,
// re-executed) against the RabbitMQ server of this machine, kills them with
// SIGKILL at random moments and restarts them, and checks every effect.

const (
	// splitLedgerEnv makes the atomic consumer write its effect apart from
	// its commit: the check that the test can see a repeated effect.
	splitLedgerEnv = "TIERDEDUP_SPLIT_LEDGER"
)

// rabbitChild consumes queue until killed. Mode "redis": Do with a file
// ledger written by the handler (the effect), dedup shared in Redis. Mode
// "atomic": the ledger entry is written by CommitBatchWith in the same
// atomic step as the commit, dedup in a Pebble directory. Mode
// "atomic-async": the same write through CommitBatchAsync, the message
// acked in its done, the next message handled meanwhile. Every phase is
// logged on stdout before it starts: C claim, E effect, M commit, A ack.
func rabbitChild(spec string) int {
	f := strings.Split(spec, "|")
	mode, queue, store, ledgerPath := f[0], f[1], f[2], f[3]
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex // the dones of async commits log too
	say := func(phase, id string) { mu.Lock(); fmt.Fprintln(out, phase, id); out.Flush(); mu.Unlock() }
	fail := func(err error) int { say("ERR", err.Error()); return 1 }

	var e *engine.Engine
	var err error
	if mode == "redis" {
		c := goredis.NewClient(&goredis.Options{Addr: store})
		defer c.Close()
		e, err = engine.Open(&engine.Options{Backend: redisBackend(c, queue+":"), Lease: 3 * time.Second, Logger: quiet})
	} else {
		e, err = engine.Open(&engine.Options{Backend: embedded.Dir(store), ExpectedKeys: 100_000, Lease: 3 * time.Second, Logger: quiet})
	}
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	ledger, err := os.OpenFile(ledgerPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fail(err)
	}
	conn, err := amqp.Dial(rabbittest.URL)
	if err != nil {
		return fail(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(err)
	}
	_ = ch.Qos(32, 0, false)
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	seq := 0
	for d := range deliveries {
		id := d.MessageId
		if d.Redelivered {
			say("R", id)
		}
		say("C", id)
		c, err := e.Claim(ctx, []byte(id))
		if err != nil {
			return fail(err)
		}
		switch c.Outcome {
		case engine.Duplicate:
			say("D", id)
			_ = d.Ack(false)
			continue
		case engine.InFlight: // another consumer holds it, or held it before dying
			time.Sleep(20 * time.Millisecond)
			say("N", id)
			_ = d.Nack(false, true)
			continue
		case engine.New:
		default:
			return fail(fmt.Errorf("outcome %v", c.Outcome))
		}
		if mode == "redis" {
			say("E", id)
			time.Sleep(200 * time.Microsecond) // the handler's work
			if _, err := fmt.Fprintln(ledger, id); err != nil {
				return fail(err)
			}
			say("M", id)
			if err := e.Commit(ctx, c); err != nil {
				return fail(err)
			}
		} else {
			// The effect is an append: one record per application, so a
			// repeat is counted, never overwritten.
			seq++
			effect := []engine.Write{{Key: fmt.Appendf(nil, "ledger/%s/%d-%d", id, os.Getpid(), seq), Value: []byte{1}}}
			if os.Getenv(splitLedgerEnv) != "" {
				// Deliberately broken: the effect and the mark in two
				// writes, so a kill between them repeats the effect.
				say("E", id)
				if err := e.CommitBatchWith(ctx, nil, nil, effect); err != nil {
					return fail(err)
				}
				say("M", id)
				if err := e.Commit(ctx, c); err != nil {
					return fail(err)
				}
			} else if mode == "atomic-async" {
				// One message at a time without waiting for the disk:
				// the effect and the mark go into the commit queue as one
				// write, and the message is acked once it is durable.
				say("M", id)
				d := d
				e.CommitBatchAsync(ctx, []engine.Claim{c}, effect, func(err error) {
					if err != nil {
						say("ERR", err.Error())
						return
					}
					say("A", id)
					_ = d.Ack(false)
				})
				continue
			} else {
				say("M", id) // effect and commit are one atomic write
				if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, effect); err != nil {
					return fail(err)
				}
			}
		}
		say("A", id)
		if err := d.Ack(false); err != nil {
			return fail(err)
		}
	}
	return 0
}

type consumer struct {
	mode, queue, store, ledger string
	child                      *crashtest.Child
	mu                         sync.Mutex
	// The consumer handles one message at a time, so its last logged line
	// says which message it was inside and in which phase.
	lastID, lastPhase string
}

func (c *consumer) start(t *testing.T, events chan<- [2]string) {
	t.Helper()
	c.mu.Lock()
	c.lastID, c.lastPhase = "", ""
	c.mu.Unlock()
	// It runs until killed (or the test ends).
	c.child = crashtest.Start(t, "rabbit", strings.Join([]string{c.mode, c.queue, c.store, c.ledger}, "|"), &crashtest.Options{Timeout: crashtest.NoTimeout, OnLine: func(line string) {
		phase, id, ok := strings.Cut(line, " ")
		if !ok {
			return
		}
		if phase != "R" {
			c.mu.Lock()
			c.lastID, c.lastPhase = id, phase
			c.mu.Unlock()
		}
		events <- [2]string{phase, id}
	}})
}

// kill SIGKILLs the consumer and returns the message it was inside and the
// phase it had entered ("" if it was between messages).
func (c *consumer) kill() (string, string) {
	_ = c.child.Kill()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.lastPhase {
	case "A", "D", "N", "":
		return "", "" // between messages
	}
	return c.lastID, c.lastPhase
}

func TestRabbitMQRedelivery(t *testing.T) {
	for _, mode := range []string{"redis", "atomic", "atomic-async"} {
		t.Run(mode, func(t *testing.T) { runRabbit(t, mode) })
	}
}

func runRabbit(t *testing.T, mode string) {
	conn := rabbittest.Dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("tierdedup-e2e-%s-%d", mode, time.Now().UnixNano())
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()

	// Publish N messages, and again a tenth of them, as a retrying producer.
	// Under -race 5,000, for the races; CI runs the 20,000 in its pass
	// without -race.
	n := 20_000
	if raceEnabled() {
		n = 5_000
	}
	rng := rand.New(rand.NewPCG(7, uint64(len(mode))))
	publish := func(i int) {
		id := "m-" + strconv.Itoa(i)
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		publish(i)
		if rng.IntN(10) == 0 {
			publish(i)
		}
	}

	dir := t.TempDir()
	consumers := 2
	var store string
	if mode == "redis" {
		store = redistest.Start(t).Addr
	} else {
		consumers = 1 // a Pebble directory belongs to one process
		store = filepath.Join(dir, "dedup")
	}
	events := make(chan [2]string, 4096)
	cs := make([]*consumer, consumers)
	for i := range cs {
		cs[i] = &consumer{mode: mode, queue: queue, store: store, ledger: filepath.Join(dir, fmt.Sprintf("ledger-%d", i))}
		cs[i].start(t, events)
	}
	acked := map[string]bool{}
	var redeliveries, duplicates int
	drain := func(d time.Duration) {
		deadline := time.After(d)
		for {
			select {
			case ev := <-events:
				switch ev[0] {
				case "A", "D":
					acked[ev[1]] = true
					if ev[0] == "D" {
						duplicates++
					}
				case "R":
					redeliveries++
				case "ERR":
					t.Fatalf("consumer failed: %s", ev[1])
				}
			case <-deadline:
				return
			}
		}
	}
	// Kill a consumer at a random moment, several times; the phase log
	// says where each kill fell.
	mayRepeat := map[string]bool{} // killed between its effect and its commit
	kills := map[string]int{}
	for k := range 12 {
		drain(time.Duration(150+rng.IntN(400)) * time.Millisecond)
		c := cs[k%consumers]
		id, phase := c.kill()
		kills[phase]++
		if phase == "E" || phase == "M" && mode == "redis" {
			mayRepeat[id] = true
		}
		c.start(t, events)
	}
	deadline := time.Now().Add(90 * time.Second)
	for len(acked) < n && time.Now().Before(deadline) {
		drain(200 * time.Millisecond)
	}
	drain(500 * time.Millisecond)
	for _, c := range cs {
		c.kill()
	}
	if len(acked) < n {
		t.Fatalf("only %d of %d messages were acknowledged", len(acked), n)
	}

	effects := map[string]int{}
	if mode == "redis" {
		for i := range cs {
			b, err := os.ReadFile(cs[i].ledger)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			for _, id := range strings.Fields(string(b)) {
				effects[id]++
			}
		}
	} else {
		e := open(t, engine.Options{Backend: &embedded.Backend{Dir: store, FS: vfs.Default}, ExpectedKeys: 100_000})
		if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
			id, _, _ := strings.Cut(strings.TrimPrefix(string(k), "ledger/"), "/")
			effects[id]++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		e.Close()
	}
	residue := 0
	for i := range n {
		id := "m-" + strconv.Itoa(i)
		switch c := effects[id]; {
		case c == 0:
			t.Errorf("%s: effect missing", id)
		case c > 1 && !mayRepeat[id]:
			t.Errorf("%s: effect %d times, but no kill fell between its effect and its commit", id, c)
		case c > 1:
			residue += c - 1
		}
	}
	if mode != "redis" && residue > 0 {
		t.Errorf("%d repeated effects with the ledger in the commit: want exactly once (each message's effect counted from its appended records)", residue)
	}
	t.Logf("%s: %d messages (+ republished copies), kills by phase %v, %d redeliveries, %d duplicates absorbed, %d repeated effects (the at-least-once residue)",
		mode, n, kills, redeliveries, duplicates, residue)
}
