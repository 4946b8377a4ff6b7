package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestFailOpenScope: FailOpen trades a duplicate effect for availability
// and nothing else. With the shared tier's commands failing, a FailOpen
// engine still answers claims and marks New (counted), but every call
// whose promise is not "at least once" fails closed with ErrUnavailable:
// IssueToken (a token stored nowhere), ConsumeToken (a use another
// process would not see), Advance and the Commit of an Advance claim made
// before the outage (an entity whose version moves back), a commit batch
// holding such a claim beside an ordinary one, Lookup, Forget and Extend.
// Once the tier is back, another process consumes the token the failed
// call did not, and sees no version the failed commit claimed.
func TestFailOpenScope(t *testing.T) {
	ctx := context.Background()
	for _, shared := range []string{"redis", "postgres"} {
		t.Run(shared, func(t *testing.T) {
			out := &faultInjector{}
			o := engine.Options{NoSharedCache: true, Lease: time.Minute}
			var healthy tier.Backend // the same tier, on a connection without faults
			switch shared {
			case "redis":
				srv := redistest.Start(t)
				c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
				c.AddHook(out)
				prefix := fmt.Sprintf("fo%d:", time.Now().UnixNano())
				o.Backend = redisBackend(c, prefix)
				plain := srv.Client(t)
				healthy = redisBackend(plain, prefix)
			case "postgres":
				p := postgresPool(t)
				table := pgTable(t, p, "failopen")
				o.Backend, healthy = pgBackend(faultDB{p, out}, table), pgBackend(p, table)
			}
			o.FailOpen = true
			a := open(t, o)
			defer a.Close()
			ref := o
			ref.FailOpen, ref.Backend = false, healthy
			b := open(t, ref) // another process, on a healthy connection
			defer b.Close()

			tok, err := a.IssueToken(ctx, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			advance := shared == "redis" // PostgreSQL refuses Advance
			var held, ordinary engine.Claim
			if advance {
				if held, err = a.Advance(ctx, []byte("order-1"), 5); err != nil || held.Outcome != engine.New {
					t.Fatalf("Advance before the outage: %v %v", held.Outcome, err)
				}
			}
			ext, err := a.Claim(ctx, []byte("extend-me"))
			if err != nil || ext.Outcome != engine.New {
				t.Fatalf("claim before the outage: %v %v", ext.Outcome, err)
			}
			if ordinary, err = a.Claim(ctx, []byte("ordinary")); err != nil || ordinary.Outcome != engine.New {
				t.Fatalf("claim before the outage: %v %v", ordinary.Outcome, err)
			}

			out.set(faultDown, "", 0)
			before := a.Stats().Calls.FailOpen
			closedCalls := map[string]func() error{
				"IssueToken":   func() error { _, err := a.IssueToken(ctx, time.Minute); return err },
				"ConsumeToken": func() error { return a.ConsumeToken(ctx, tok) },
				"Lookup":       func() error { _, err := a.Lookup(ctx, []byte("never-seen")); return err },
				"Forget":       func() error { _, err := a.Forget(ctx, []byte("forget-me")); return err },
				"Extend":       func() error { return a.Extend(ctx, &ext, time.Minute) },
			}
			if advance {
				closedCalls["Advance"] = func() error { _, err := a.Advance(ctx, []byte("order-2"), 1); return err }
				closedCalls["Commit of an Advance claim"] = func() error { return a.Commit(ctx, held) }
				closedCalls["CommitBatch with an Advance claim"] = func() error {
					return a.CommitBatch(ctx, []engine.Claim{ordinary, held}, nil)
				}
			}
			for name, call := range closedCalls {
				if err := call(); !errors.Is(err, engine.ErrUnavailable) {
					t.Errorf("%s during the outage: %v, want ErrUnavailable", name, err)
				}
			}
			if n := a.Stats().Calls.FailOpen; n != before {
				t.Errorf("Stats.Calls.FailOpen moved from %d to %d on calls that fail closed", before, n)
			}
			// What FailOpen is for still answers.
			if c, err := a.Claim(ctx, []byte("during")); err != nil || c.Outcome != engine.New {
				t.Errorf("a claim during the outage: %v %v, want New", c.Outcome, err)
			} else if err := a.Commit(ctx, c); err != nil {
				t.Errorf("its commit: %v", err)
			}
			if got, err := a.MarkIfAbsent(ctx, []byte("marked")); err != nil || got != engine.New {
				t.Errorf("a mark during the outage: %v %v, want New", got, err)
			}
			want := before + 3 // a claim, its commit, a one-step mark (Redis without MaxAttempts too)
			if n := a.Stats().Calls.FailOpen; n != want {
				t.Errorf("Stats.Calls.FailOpen = %d, want %d", n, want)
			}

			out.off()
			if err := b.ConsumeToken(ctx, tok); err != nil {
				t.Errorf("the token, consumed by another process once the tier is back: %v (the failed use must not have used it)", err)
			}
			if advance {
				if err := a.Release(ctx, held); err != nil {
					t.Errorf("releasing the Advance claim whose commit failed: %v", err)
				}
				if c, err := b.Advance(ctx, []byte("order-1"), 4); err != nil || c.Outcome != engine.New || c.Version != 0 {
					t.Errorf("version 4 after a failed commit of 5: %v (stored %d) %v, want New over none", c.Outcome, c.Version, err)
				}
			}
		})
	}
}

// TestFailOpenKeepsCapabilities: behind FailOpen's wrapper each shared
// tier keeps what the engine found it can do (partition drops, marks in
// one statement or script), as without it.
func TestFailOpenKeepsCapabilities(t *testing.T) {
	for name, backend := range map[string]func(t *testing.T) tier.Backend{
		"redis":    func(t *testing.T) tier.Backend { return redisBackend(redistest.Start(t).Client(t), "caps:") },
		"postgres": func(t *testing.T) tier.Backend { p := postgresPool(t); return pgBackend(p, pgTable(t, p, "caps")) },
	} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			closed := open(t, engine.Options{Backend: b})
			wantDropper, wantMarker := closed.Capabilities()
			_ = closed.Close()
			opened := open(t, engine.Options{Backend: b, FailOpen: true})
			defer opened.Close()
			if dropper, marker := opened.Capabilities(); dropper != wantDropper || marker != wantMarker || !marker {
				t.Fatalf("fail-open engine found dropper %v, marker %v; fail-closed %v, %v", dropper, marker, wantDropper, wantMarker)
			}
		})
	}
}
