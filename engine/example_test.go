package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The default configuration: exact and durable in one directory.
func Example() {
	dir, _ := os.MkdirTemp("", "tierdedup")
	defer os.RemoveAll(dir)

	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir)})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()

	ctx := context.Background()
	for _, id := range []string{"msg-1", "msg-2", "msg-1"} {
		outcome, err := e.Do(ctx, []byte(id), func(context.Context) error {
			fmt.Println("processing", id)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, outcome)
	}
	// Output:
	// processing msg-1
	// msg-1 new
	// processing msg-2
	// msg-2 new
	// msg-1 duplicate
}

// A consumer that reads a batch from its broker claims it in one call,
// processes the New messages, commits them with one fsync, then commits its
// offsets.
func ExampleEngine_ClaimBatch() {
	e, err := engine.Open(&engine.Options{Tiers: engine.MemoryOnly})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()

	batch := [][]byte{[]byte("a"), []byte("b"), []byte("a")}
	claims := make([]engine.Claim, len(batch))
	if err := e.ClaimBatch(ctx, batch, nil, claims); err != nil {
		log.Fatal(err)
	}
	for _, c := range claims {
		if c.Owned() {
			// process(c.Key) here
		}
		fmt.Printf("%s %v\n", c.Key, c.Outcome)
	}
	if err := e.CommitBatch(ctx, claims, nil); err != nil {
		log.Fatal(err)
	}
	again := make([]engine.Claim, len(batch))
	_ = e.ClaimBatch(ctx, batch, nil, again)
	fmt.Println("redelivered:", again[0].Outcome, again[1].Outcome, again[2].Outcome)
	// Output:
	// a new
	// b new
	// a in-flight
	// redelivered: duplicate duplicate duplicate
}

// Namespaces keep message IDs and business keys apart; a payload digest
// turns a reused key with other content into a Conflict.
func ExampleNamespace_MarkIfAbsent() {
	e, _ := engine.Open(&engine.Options{Tiers: engine.MemoryOnly})
	defer e.Close()
	ctx := context.Background()
	orders, _ := e.Namespace("orders")

	o1, _ := e.MarkIfAbsent(ctx, []byte("42"))
	o2, _ := orders.MarkIfAbsent(ctx, []byte("42"))
	o3, _ := orders.MarkIfAbsent(ctx, []byte("42"))
	fmt.Println(o1, o2, o3)

	c, _ := orders.ClaimDigest(ctx, []byte("43"), engine.DigestOf([]byte("amount=10")))
	_ = e.Commit(ctx, c)
	c, _ = orders.ClaimDigest(ctx, []byte("43"), engine.DigestOf([]byte("amount=99")))
	fmt.Println(c.Outcome)
	// Output:
	// new new duplicate
	// conflict
}

// An order's status machine fed by redelivered and reordered events:
// only an event newer than the applied one runs.
func ExampleEngine_Advance() {
	dir, _ := os.MkdirTemp("", "tierdedup")
	defer os.RemoveAll(dir)
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()

	ctx := context.Background()
	events := []struct {
		status  string
		version uint64
	}{{"created", 1}, {"paid", 2}, {"paid", 2}, {"shipped", 4}, {"packed", 3}, {"delivered", 5}}
	for _, ev := range events {
		c, err := e.Advance(ctx, []byte("order-42"), ev.version)
		if err != nil {
			log.Fatal(err)
		}
		if c.Outcome == engine.New {
			// Apply the status here, then make its version the stored one.
			if err := e.Commit(ctx, c); err != nil {
				log.Fatal(err)
			}
		}
		fmt.Printf("%-9s v%d: %v (stored v%d)\n", ev.status, ev.version, c.Outcome, c.Version)
	}
	// Output:
	// created   v1: new (stored v0)
	// paid      v2: new (stored v1)
	// paid      v2: duplicate (stored v2)
	// shipped   v4: new (stored v2)
	// packed    v3: stale (stored v4)
	// delivered v5: new (stored v4)
}

// An API handler that answers a retried request with the first response.
func ExampleEngine_DoResult() {
	e, err := engine.Open(&engine.Options{Tiers: engine.MemoryOnly})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()

	ctx := context.Background()
	charge := func(context.Context) ([]byte, error) {
		fmt.Println("charging the card")
		return []byte(`{"charge":"ch_1","amount":4200}`), nil
	}
	for range 2 { // the client retries with the same idempotency key
		outcome, resp, err := e.DoResult(ctx, []byte("idem-7f3a"), charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome, string(resp))
	}
	// Output:
	// charging the card
	// new {"charge":"ch_1","amount":4200}
	// duplicate {"charge":"ch_1","amount":4200}
}
