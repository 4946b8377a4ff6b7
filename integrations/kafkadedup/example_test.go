package kafkadedup_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/kafkadedup"
)

// A consumer-group member that charges each order once. The charge record
// is written in the same atomic batch as the order's mark and the
// partition's offset; a producer retry of order-1 is skipped. (An
// in-process cluster stands in for your brokers here.)
func Example() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	produce(brokers, "order-1", "order-2", "order-1") // the last one: a producer retry

	dir, err := os.MkdirTemp("", "billing")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	member, err := kafkadedup.New(&kafkadedup.Options{
		Group:  "billing",
		Dir:    dir, // one engine directory per partition; Exports: a shared directory for handoffs
		Engine: engine.Options{MaxAttempts: 5},
		Reject: func(_ context.Context, r *kgo.Record, why error) { log.Printf("dead-letter %s: %v", r.Key, why) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer member.Close()
	cl, err := kgo.NewClient(append(member.Opts(),
		kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close() // leaving the group flushes (and exports) every partition

	charge := func(_ context.Context, r *kgo.Record) ([]engine.Write, error) {
		fmt.Printf("charging %s\n", r.Key)
		return []engine.Write{{Key: append([]byte("charged/"), r.Key...), Value: r.Value}}, nil
	}
	ctx := context.Background()
	for {
		fetches := cl.PollFetches(ctx)
		if err := member.Process(ctx, cl, fetches, charge); err != nil {
			log.Print(err)
		}
		cl.AllowRebalance()
		if next, ok := member.Offset("orders", 0); ok && next == 3 {
			break
		}
	}
	fmt.Println("duplicates skipped:", member.Stats().Duplicates)
	// Output:
	// charging order-1
	// charging order-2
	// duplicates skipped: 1
}

func produce(brokers []string, keys ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for _, k := range keys {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(k), Value: []byte(k)}).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
}
