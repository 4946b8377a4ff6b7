package watermilldedup_test

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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/watermilldedup"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/internal/rabbittest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The kill tests run a Watermill router in child processes (this test
// binary, re-executed by crashtest) that consume a RabbitMQ queue of this
// machine through watermill-amqp, SIGKILL them at random moments and
// restart them, and count every message's effects in a ledger that can see
// a repeat: one record per application of the handler.

const ()

// TestMain sends a consumer process to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{"consumer": child})
}

// raceEnabled reports whether the test binary was built with -race
// (enginetest.RaceEnabled).
var raceEnabled = enginetest.RaceEnabled

// The consumer's modes: this package's Middleware with the effect in the
// commit, or Watermill's Deduplicator with the effect in an fsynced file.
const (
	modeTierdedup = "tierdedup"
	modeWatermill = "watermill"
)

type childSpec struct {
	Mode            string
	Topic, OutTopic string
	Dir             string // the engine's directory (modeTierdedup)
	Ledger          string // the ledger file (modeWatermill)
	Lease           time.Duration
	Handlers        int
}

// Messages m-<n> with n%failEvery == failAt fail on their first delivery
// (a transient error); those with n%slowEvery == slowAt take 1.5 leases.
const (
	failEvery, failAt = 250, 7
	slowEvery, slowAt = 1500, 3
)

var errInjected = errors.New("injected transient failure")

// syncDelay is how long each fsync of a consumer takes at least, as a
// disk's does (this machine's virtual disk may take next to nothing): an
// implementation that wrote its effect and its mark apart must show a
// repeat here, and it can only if a kill may land between the two writes.
const syncDelay = 3 * time.Millisecond

// slowSyncs is an errorfs injector that makes every sync take syncDelay.
func slowSyncs(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		time.Sleep(syncDelay)
	}
	return nil
}

type ranKey struct{}

// child runs a router with spec.Handlers handlers on spec.Topic, each its
// own AMQP consumer, behind the mode's dedup middleware, until SIGTERM (a
// graceful stop) or SIGKILL. The handler's effect is a ledger record <id>
// <pid>-<seq>, one per application; it produces one message (a new UUID,
// the input's id as payload) to spec.OutTopic, published with confirms. It
// prints "UP" once its router runs; "S id" when a message enters the
// middlewares, "R id" if it is a redelivery, then "A id" when it leaves
// them handled, "D id" when acked without running its handler (a
// duplicate absorbed) or "N id" with an error (nacked); "F id" for an
// injected failure, "ERR ..." for what must not happen.
func child(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	say := crashtest.Say()
	fail := func(err error) int { say("ERR %v", err); return 1 }
	logger := watermill.NopLogger{}

	pid, seq := os.Getpid(), atomic.Int64{}
	var dedup message.HandlerMiddleware
	var effect func(ctx context.Context, id string) error
	switch spec.Mode {
	case modeTierdedup:
		e, err := engine.Open(&engine.Options{
			Backend:      &embedded.Backend{Dir: spec.Dir, FS: faultfs.Wrap(vfs.Default, errorfs.InjectorFunc(slowSyncs))},
			ExpectedKeys: 100_000, Lease: spec.Lease, MaxAttempts: 5, Logger: quietEngine,
		})
		if err != nil {
			return fail(err)
		}
		defer e.Close()
		m, err := watermilldedup.New(e, &watermilldedup.Options{
			InFlightDelay: 50 * time.Millisecond, Logger: logger,
			Reject: func(m *message.Message, why error) { say("ERR rejected %s: %v", m.UUID, why) },
		})
		if err != nil {
			return fail(err)
		}
		dedup = m.Middleware
		effect = func(ctx context.Context, id string) error {
			return watermilldedup.AddWrites(ctx, engine.Write{Key: fmt.Appendf(nil, "ledger/%s/%d-%d", id, pid, seq.Add(1)), Value: []byte{1}})
		}
	case modeWatermill:
		f, err := os.OpenFile(spec.Ledger, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		// Watermill's Deduplicator with its default repository (a map in
		// memory, one minute window), keyed by UUID as this package is:
		// its default key, an Adler-32 of the payload, would also drop
		// distinct messages whose short payloads share a checksum.
		d := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
		dedup = d.Middleware
		// The best a handler can do without an atomic commit: append its
		// record (one write) and fsync it before returning.
		effect = func(_ context.Context, id string) error {
			if _, err := fmt.Fprintf(f, "%s %d-%d\n", id, pid, seq.Add(1)); err != nil {
				return err
			}
			err := f.Sync()
			time.Sleep(syncDelay) // the same disk as the engine's
			return err
		}
	default:
		return fail(fmt.Errorf("mode %q", spec.Mode))
	}

	cfg := amqp.NewDurableQueueConfig(rabbittest.URL)
	cfg.Consume.Qos.PrefetchCount = 8
	cfg.Publish.ConfirmDelivery = true
	cfg.Publish.ChannelPoolSize = spec.Handlers
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		return fail(err)
	}
	pub, err := amqp.NewPublisher(cfg, logger)
	if err != nil {
		return fail(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger)
	if err != nil {
		return fail(err)
	}
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			say("S %s", m.UUID)
			if amqp.IsMessageRedelivered(m) {
				say("R %s", m.UUID)
			}
			var ran atomic.Bool
			m.SetContext(context.WithValue(m.Context(), ranKey{}, &ran))
			outs, err := h(m)
			switch {
			case err != nil:
				say("N %s", m.UUID)
			case !ran.Load():
				say("D %s", m.UUID)
			default:
				say("A %s", m.UUID)
			}
			return outs, err
		}
	}
	router.AddMiddleware(observe, dedup)
	handler := func(m *message.Message) ([]*message.Message, error) {
		id := m.UUID
		n, err := strconv.Atoi(strings.TrimPrefix(id, "m-"))
		if err != nil {
			say("ERR message %q", id)
			return nil, err
		}
		if r, ok := m.Context().Value(ranKey{}).(*atomic.Bool); ok {
			r.Store(true)
		}
		if n%failEvery == failAt && !amqp.IsMessageRedelivered(m) {
			say("F %s", id)
			return nil, errInjected
		}
		if n%slowEvery == slowAt {
			time.Sleep(3 * spec.Lease / 2)
		}
		if err := effect(m.Context(), id); err != nil {
			say("ERR effect %s: %v", id, err)
			return nil, err
		}
		o := message.NewMessage(watermill.NewUUID(), []byte(id))
		return []*message.Message{o}, nil
	}
	for i := range spec.Handlers {
		router.AddHandler(fmt.Sprintf("h%d", i), spec.Topic, sub, spec.OutTopic, pub, handler)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		if err := router.Close(); err != nil {
			say("ERR close: %v", err)
		}
	}()
	go func() {
		<-router.Running()
		say("UP")
	}()
	if err := router.Run(context.Background()); err != nil {
		return fail(err)
	}
	<-ctx.Done()
	_ = pub.Close()
	_ = sub.Close()
	return 0
}

// killResult is what a kill run saw.
type killResult struct {
	n, resends, kills                     int
	redeliveries, absorbed, injected      int
	missing, repeated                     int
	outputs, noOutput, rerun, republished int
}

// runKills publishes n messages m-<i> to a new durable queue, a tenth of
// them published again later with the same UUID (a producer's retry, which
// the broker sees as another message), while one consumer process in mode
// handles them with four handlers and is SIGKILLed at random moments at
// least ten times and restarted. Once every message is acked it counts the
// effects in the ledger and the produced messages per input.
func runKills(t *testing.T, mode string) killResult {
	conn := rabbittest.Dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	topic := fmt.Sprintf("tierdedup-watermill-%s-%d", mode, time.Now().UnixNano())
	outTopic := topic + "-out"
	for _, q := range []string{topic, outTopic} {
		// As watermill-amqp's durable queue config declares it.
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c, err := amqp091.Dial(rabbittest.URL)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		dch, err := c.Channel()
		if err != nil {
			t.Error(err)
			return
		}
		for _, q := range []string{topic, outTopic} {
			if _, err := dch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
	})
	inspect := func() amqp091.Queue {
		q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}

	const lease = 2 * time.Second
	dir := t.TempDir()
	spec, _ := json.Marshal(childSpec{
		Mode: mode, Topic: topic, OutTopic: outTopic, Lease: lease, Handlers: 4,
		Dir: filepath.Join(dir, "dedup"), Ledger: filepath.Join(dir, "ledger"),
	})
	var mu sync.Mutex
	var res killResult
	var proc *crashtest.Child
	// The current consumer's messages inside the middlewares, and when it
	// last printed.
	var gen, inside int
	var last time.Time
	start := func() {
		mu.Lock()
		gen++
		g := gen
		inside, last = 0, time.Now()
		mu.Unlock()
		// It runs until killed, or stopped at the end.
		proc = crashtest.Start(t, "consumer", string(spec), &crashtest.Options{Timeout: crashtest.NoTimeout, StderrApart: true, OnLine: func(line string) {
			mu.Lock()
			defer mu.Unlock()
			f, _, _ := strings.Cut(line, " ")
			if g == gen {
				last = time.Now()
				switch f {
				case "S":
					inside++
				case "A", "D", "N":
					inside--
				}
			}
			switch f {
			case "S", "A", "N", "UP":
			case "R":
				res.redeliveries++
			case "D":
				res.absorbed++
			case "F":
				res.injected++
			default:
				t.Errorf("consumer: %s", line)
			}
		}})
	}
	start()

	// Under -race 5,000 messages, for the races; 10,000 without.
	n := 10_000
	if raceEnabled() {
		n = 5_000
	}
	res.n = n
	pub, err := amqp.NewPublisher(amqp.NewDurableQueueConfig(rabbittest.URL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	rng := rand.New(rand.NewPCG(13, uint64(time.Now().UnixNano())))
	seed := rng.Uint64()
	produced := make(chan int)
	go func() {
		resends := 0
		defer func() { produced <- resends }()
		prng := rand.New(rand.NewPCG(seed, 5))
		batch := make([]*message.Message, 0, 100)
		flush := func() {
			if err := pub.Publish(topic, batch...); err != nil {
				t.Error(err)
			}
			batch = batch[:0]
		}
		for i := range n {
			id := "m-" + strconv.Itoa(i)
			batch = append(batch, message.NewMessage(id, []byte(id)))
			// A re-send of a message published at least 500 earlier.
			if i > 500 && prng.IntN(10) == 0 {
				old := "m-" + strconv.Itoa(prng.IntN(i-500))
				batch = append(batch, message.NewMessage(old, []byte(old)))
				resends++
			}
			if len(batch) >= 100 {
				flush()
				time.Sleep(time.Duration(150+prng.IntN(100)) * time.Millisecond)
			}
		}
		flush()
	}()
	for finished := false; !finished || res.kills < 10; {
		time.Sleep(time.Duration(300+rng.IntN(900)) * time.Millisecond)
		_ = proc.Kill()
		res.kills++
		start()
		select {
		case res.resends = <-produced:
			finished = true
		default:
		}
	}

	// Drain: once the queue is empty and the consumer idle (no message
	// inside its middlewares, nothing printed for a second, its router up
	// for as long), stop it;
	// its unacked messages, if any, come back to the queue, and a new
	// consumer takes them.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		for {
			q := inspect()
			mu.Lock()
			idle := inside <= 0 && time.Since(last) > time.Second
			mu.Unlock()
			if q.Messages == 0 && idle {
				break
			}
			if time.Now().After(deadline) {
				// A hung consumer: its goroutines, for the failure.
				proc.Signal(syscall.SIGQUIT)
				_ = proc.Wait()
				t.Fatalf("messages left: %+v; the consumer's stacks:\n%s", q, proc.Stderr())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := proc.Stop(syscall.SIGTERM, time.Minute); errors.Is(err, crashtest.ErrNotStopped) {
			t.Error(err)
		}
		q := inspect()
		for q.Consumers > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			q = inspect()
		}
		if q.Messages == 0 && q.Consumers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages left: %+v", q)
		}
		start()
	}

	effects := map[string]int{}
	switch mode {
	case modeTierdedup:
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "dedup")), ExpectedKeys: 100_000, Logger: quietEngine})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
			id, _, _ := strings.Cut(strings.TrimPrefix(string(k), "ledger/"), "/")
			effects[id]++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		e.Close()
	case modeWatermill:
		b, err := os.ReadFile(filepath.Join(dir, "ledger"))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			id, _, _ := strings.Cut(line, " ")
			effects[id]++
		}
	}
	for i := range n {
		switch c := effects["m-"+strconv.Itoa(i)]; {
		case c == 0:
			res.missing++
		case c > 1:
			res.repeated += c - 1
		}
	}

	// The produced messages: per input, how many and with which UUIDs.
	outs := map[string]map[string]int{}
	q, err := ch.QueueDeclarePassive(outTopic, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(outTopic, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range q.Messages {
		select {
		case d := <-deliveries:
			uuid, _ := d.Headers[amqp.DefaultMessageUUIDHeaderKey].(string)
			in := string(d.Body)
			if outs[in] == nil {
				outs[in] = map[string]int{}
			}
			outs[in][uuid]++
			res.outputs++
		case <-time.After(30 * time.Second):
			t.Fatalf("read %d of %d produced messages", res.outputs, q.Messages)
		}
	}
	for i := range n {
		o := outs["m-"+strconv.Itoa(i)]
		switch {
		case len(o) == 0:
			res.noOutput++
		case len(o) > 1:
			res.rerun++ // produced by more than one run of the handler
		}
		for _, c := range o {
			res.republished += c - 1
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s (queue %s): %d messages + %d re-sent with their UUID, %d SIGKILLs, %d redeliveries, %d duplicates absorbed, %d injected failures; "+
		"effects: %d missing, %d repeated; produced: %d messages, %d inputs without one, %d inputs with more than one UUID, %d published again with the same UUID",
		mode, topic, res.n, res.resends, res.kills, res.redeliveries, res.absorbed, res.injected,
		res.missing, res.repeated, res.outputs, res.noOutput, res.rerun, res.republished)
	return res
}

// TestKills: a Watermill router behind this package's Middleware, its
// effect written with AddWrites, its process SIGKILLed at least ten times
// while it handles thousands of messages (a tenth re-sent with the same
// UUID, some failing once, some running past the lease): every message
// has exactly one effect, and exactly one produced message UUID, published
// at least once.
func TestKills(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run; CI runs it without -short")
	}
	res := runKills(t, modeTierdedup)
	if res.kills < 10 {
		t.Errorf("%d kills, want ≥ 10", res.kills)
	}
	if res.missing > 0 || res.repeated > 0 {
		t.Errorf("%d messages without their effect, %d repeated effects: want exactly once", res.missing, res.repeated)
	}
	if res.noOutput > 0 || res.rerun > 0 {
		t.Errorf("%d inputs without a produced message, %d with produced messages from more than one run: want each input's one run's messages", res.noOutput, res.rerun)
	}
	if res.absorbed == 0 || res.injected == 0 || res.redeliveries == 0 {
		t.Errorf("the run did not exercise duplicates (%d), failures (%d) or redeliveries (%d)", res.absorbed, res.injected, res.redeliveries)
	}
}

// TestKillsWatermillDeduplicatorRepeats is the control: the same run
// (broker, kills, messages, handler) with Watermill's own
// middleware.Deduplicator, its default in-memory repository, in place of
// this package's Middleware, and the effect appended and fsynced to a file
// by the handler. It repeats effects (its keys die with each process: a
// redelivery or a re-send after a restart runs again) and loses messages
// (it marks a message before its handler runs, so the redelivery of a
// failed one is taken for a duplicate). The test fails if it does not.
func TestKillsWatermillDeduplicatorRepeats(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run; CI runs it without -short")
	}
	res := runKills(t, modeWatermill)
	if res.repeated == 0 {
		t.Errorf("Watermill's Deduplicator repeated no effect over %d kills: the kill test cannot see a repeat", res.kills)
	}
	if res.missing == 0 {
		t.Errorf("Watermill's Deduplicator lost no message over %d injected failures: the kill test cannot see a loss", res.injected)
	}
}
