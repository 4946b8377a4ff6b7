package natsdedup_test

import (
	"context"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/natsdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// A JetStream consumer that charges each order once: the key is the
// producer's Nats-Msg-Id, the charge record is committed with the mark,
// and the message is acked once both are durable. A handler that runs
// past half the ack wait keeps its message in progress and its claim
// extended; a key another worker holds is redelivered later; a poison or
// conflicting message is terminated after Reject dead-letters it.
func Example() {
	const ackWait = 30 * time.Second
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir("/var/lib/billing/dedup"), Lease: ackWait, MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close() // after the consumer stopped: writes the pending commits, then acks them

	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		log.Fatal(err)
	}
	orders, err := natsdedup.New(dedup, &natsdedup.Options{
		Namespace: "orders", AckWait: ackWait,
		Reject: func(m jetstream.Msg, why error) {
			log.Printf("dead-letter %s: %v", m.Headers().Get(nats.MsgIdHdr), why)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		orders.Handle(ctx, m, func(ctx context.Context, m jetstream.Msg) ([]engine.Write, error) {
			charge, err := chargeOrder(ctx, m.Data())
			if err != nil {
				return nil, err // released and redelivered
			}
			return []engine.Write{{Key: []byte("charged/" + m.Headers().Get(nats.MsgIdHdr)), Value: charge}}, nil
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	select {} // serve
}

func chargeOrder(context.Context, []byte) ([]byte, error) { return []byte("ok"), nil }
