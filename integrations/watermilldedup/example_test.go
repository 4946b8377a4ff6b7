package watermilldedup_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/watermilldedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// A Watermill router that charges each order once and publishes one
// receipt for it. The charge is a record committed with the order's mark
// (AddWrites); the receipt, a produced message, is stored with the mark
// too, so when the producer sends order 1 again (a retry whose ack it
// lost), the handler does not run and the router publishes the same
// receipt, same UUID, again: downstream dedups it by UUID.
func Example() {
	dir, err := os.MkdirTemp("", "watermilldedup-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close() // after the router closed

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	orders, err := watermilldedup.New(dedup, &watermilldedup.Options{
		Namespace: "billing",
		Reject:    func(msg *message.Message, why error) { log.Printf("dropping order %s: %v", msg.UUID, why) },
	})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(orders.Middleware)
	router.AddHandler("billing", "orders", pubSub, "receipts", pubSub, func(msg *message.Message) ([]*message.Message, error) {
		fmt.Printf("charging order %s: %s\n", msg.UUID, msg.Payload)
		charge := engine.Write{Key: []byte("charged/" + msg.UUID), Value: msg.Payload}
		if err := watermilldedup.AddWrites(msg.Context(), charge); err != nil {
			return nil, err // nacked; the claim is released and the redelivery runs again
		}
		receipt := message.NewMessage(watermill.NewUUID(), []byte("receipt for "+msg.UUID))
		return []*message.Message{receipt}, nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	receipts, err := pubSub.Subscribe(ctx, "receipts")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	receiptOf := map[string]string{} // order → its receipt's UUID
	for _, order := range []struct{ id, body string }{{"1", "2 books"}, {"2", "1 lamp"}, {"1", "2 books"}} {
		if err := pubSub.Publish("orders", message.NewMessage(order.id, []byte(order.body))); err != nil {
			log.Fatal(err)
		}
		select {
		case r := <-receipts:
			r.Ack()
			if uuid, ok := receiptOf[order.id]; ok {
				fmt.Printf("%s (replayed, same UUID: %t)\n", r.Payload, r.UUID == uuid)
				continue
			}
			receiptOf[order.id] = r.UUID
			fmt.Printf("%s\n", r.Payload)
		case <-time.After(10 * time.Second):
			log.Fatal("no receipt")
		}
	}
	s := orders.Stats()
	fmt.Printf("new %d, duplicates %d, replayed %d\n", s.New, s.Duplicates, s.Replayed)
	// Output:
	// charging order 1: 2 books
	// receipt for 1
	// charging order 2: 1 lamp
	// receipt for 2
	// receipt for 1 (replayed, same UUID: true)
	// new 2, duplicates 1, replayed 1
}

// The same middleware on RabbitMQ through watermill-amqp: durable queues,
// the message's UUID in a header (so a redelivery and a producer's re-send
// keep it), publishes confirmed by the broker before the router acks, and
// rejected messages (poison, conflict, no key) dead-lettered to a queue of
// their own.
func Example_rabbitMQ() {
	const lease = 30 * time.Second
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir("/var/lib/billing/dedup"), Lease: lease, MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close() // after the router closed

	logger := watermill.NewStdLogger(false, false)
	cfg := amqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	cfg.Consume.Qos.PrefetchCount = 16
	cfg.Publish.ConfirmDelivery = true // a produced message is the broker's before the input is acked
	cfg.Publish.ChannelPoolSize = 4
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := amqp.NewPublisher(cfg, logger)
	if err != nil {
		log.Fatal(err)
	}
	orders, err := watermilldedup.New(dedup, &watermilldedup.Options{
		Namespace:  "billing",
		DeadLetter: pub, DeadLetterTopic: "orders.dead",
		Digest: func(msg *message.Message) engine.Digest { return engine.DigestOf(msg.Payload) },
	})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: lease}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(orders.Middleware)
	router.AddHandler("billing", "orders", sub, "receipts", pub, func(msg *message.Message) ([]*message.Message, error) {
		if err := watermilldedup.AddWrites(msg.Context(), engine.Write{Key: []byte("charged/" + msg.UUID), Value: msg.Payload}); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt for "+msg.UUID))}, nil
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
