package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestAdversarialDurableClaimNamespaceWindowExtend: durable claims (Extend past the partition) in a namespace with a
// window of its own (NamespaceOptions.Window, shorter than Window). Extend takes
// any d shorter than the engine's Window, so one heartbeat can keep a
// claim alive longer than its namespace's window + a partition without
// moving its attempt to a later partition. Abandoned (Close), the claim
// must count at the next Open: Poison with MaxAttempts 1.
func TestAdversarialDurableClaimNamespaceWindowExtend(t *testing.T) {
	for _, mode := range []string{"one-long-extend", "heartbeats"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			clock := newClock()
			o := durableOpts(dir, 1, clock)
			o.Window, o.Partition, o.Lease = 24*time.Hour, time.Hour, 10*time.Minute
			o.Namespaces = map[string]engine.NamespaceOptions{"short": {Window: 2 * time.Hour}}
			e := open(t, o)
			ns, err := e.Namespace("short")
			if err != nil {
				t.Fatal(err)
			}
			c, err := ns.Claim(ctx, []byte("long-handler"))
			if err != nil || c.Outcome != engine.New {
				t.Fatalf("first claim: %v %v", c.Outcome, err)
			}
			other := make([]engine.Outcome, 1)
			if mode == "one-long-extend" {
				if err := e.Extend(ctx, &c, 6*time.Hour); err != nil {
					t.Fatal(err)
				}
				for step := range 10 { // 5 hours, the lease still alive
					clock.Add(30 * time.Minute)
					if err := ns.MarkBatch(ctx, [][]byte{fmt.Appendf(nil, "other-%d", step)}, nil, other); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				for step := range 15 { // 5 hours of heartbeats
					if err := e.Extend(ctx, &c, 30*time.Minute); err != nil {
						t.Fatalf("heartbeat %d: %v", step, err)
					}
					clock.Add(20 * time.Minute)
					if err := ns.MarkBatch(ctx, [][]byte{fmt.Appendf(nil, "other-%d", step)}, nil, other); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Still held by this engine: InFlight.
			if c2, err := ns.Claim(ctx, []byte("long-handler")); err != nil || c2.Outcome != engine.InFlight {
				t.Fatalf("claim while the first is alive: %v %v, want InFlight", c2.Outcome, err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = open(t, o)
			defer e.Close()
			ns, _ = e.Namespace("short")
			c3, err := ns.Claim(ctx, []byte("long-handler"))
			if err != nil {
				t.Fatal(err)
			}
			if c3.Outcome != engine.Poison {
				t.Fatalf("a durable claim kept alive 5 h in a 2 h namespace window, abandoned by Close: %v at the next Open, want Poison (MaxAttempts 1: its handler would run twice)", c3.Outcome)
			}
		})
	}
}
