package engine_test

import (
	"context"
	"log"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// A RabbitMQ consumer that acts once per message: manual acks, a prefetch
// window, the handler wrapped in Do. The message is acked only after Do
// committed (process, then Commit, then ack); a failed handler is released
// and the message requeued, so the redelivery runs it again; a key another
// worker holds right now is requeued too; a poison message is dead-lettered.
func Example_rabbitMQ() {
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir("/var/lib/orders-consumer/dedup"), MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close()

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(64, 0, false); err != nil { // prefetch
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("orders", "", false /* manual ack */, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		key := []byte(d.MessageId) // or a business key from the body: orders.Namespace
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		outcome, err := dedup.Do(ctx, key, func(ctx context.Context) error {
			return handleOrder(ctx, d.Body)
		})
		cancel()
		switch {
		case err != nil, outcome == engine.InFlight:
			_ = d.Nack(false, true) // released (or held elsewhere): redeliver
		case outcome == engine.Conflict, outcome == engine.Poison:
			_ = d.Nack(false, false) // to the dead-letter exchange
		default: // New (handled and committed) or Duplicate (handled before)
			_ = d.Ack(false)
		}
	}
}

func handleOrder(context.Context, []byte) error { return nil }

// A RabbitMQ consumer that handles one message at a time at batch speed:
// it claims, runs the handler, and hands the commit to the engine's commit
// queue with CommitAsync, acking the message in done, once the commit is
// durable; the next message is handled meanwhile, and commits waiting
// together share one fsync. A failed handler releases the claim and
// requeues the message; a failed commit requeues it too (its redelivery
// finds the commit, if it landed, as a Duplicate).
func Example_rabbitMQAsync() {
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir("/var/lib/orders-consumer/dedup")})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close() // writes every pending commit and runs its done first

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(1024, 0, false); err != nil { // room for the commits in flight
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("orders", "", false /* manual ack */, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for d := range deliveries {
		c, err := dedup.Claim(ctx, []byte(d.MessageId))
		switch {
		case err != nil, c.Outcome == engine.InFlight:
			_ = d.Nack(false, true)
			continue
		case c.Outcome == engine.Duplicate:
			_ = d.Ack(false)
			continue
		case c.Outcome != engine.New: // Conflict or Poison
			_ = d.Nack(false, false) // to the dead-letter exchange
			continue
		}
		if err := handleOrder(ctx, d.Body); err != nil {
			_ = dedup.Release(ctx, c)
			_ = d.Nack(false, true)
			continue
		}
		dedup.CommitAsync(ctx, c, func(err error) {
			if err != nil {
				_ = d.Nack(false, true)
				return
			}
			_ = d.Ack(false) // durable: ack
		})
	}
}
