package watermilldedup

import (
	"context"
	"sync"

	"github.com/tierdedup/tierdedup/engine"
)

type collectorKey struct{}

// collector gathers a New message's records for its commit.
type collector struct {
	writable bool
	mu       sync.Mutex
	writes   []engine.Write
	closed   bool
}

// close ends the collection and returns the records.
func (c *collector) close() []engine.Write {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return c.writes
}

// AddWrites adds records to the commit of the message whose handler runs
// with ctx (msg.Context() inside a handler behind the Middleware, for a New
// message): the records and the message's mark become durable in one
// atomic write of the engine's embedded store, before the message is acked,
// or not at all (the handler failed, panicked or lost its claim, or the
// process died first). An effect written this way happens exactly once.
// Read the records back with engine.ScanWrites; their keyspace is the
// caller's, apart from the dedup keys, and never expires.
//
// The records' bytes must stay unchanged until the handler returned and
// are the commit's from then on. AddWrites is safe for concurrent use by
// the handler's goroutines; after the handler returned it fails with
// ErrNoClaim, as it does with a context the Middleware did not set up. An
// engine with a shared Backend (Redis, PostgreSQL) has no such records:
// ErrWrites.
func AddWrites(ctx context.Context, w ...engine.Write) error {
	c, _ := ctx.Value(collectorKey{}).(*collector)
	if c == nil {
		return ErrNoClaim
	}
	if !c.writable {
		return ErrWrites
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrNoClaim
	}
	c.writes = append(c.writes, w...)
	return nil
}
