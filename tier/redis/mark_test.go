package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestUnmarkFencesADelayedMark: Unmark of a mark Redis has not applied yet
// (it waits in the server's input, a paused server) leaves a fence the
// mark cannot pass, so it is never applied after its caller was told it
// failed; Unmark of an applied mark undoes it. Every other caller takes
// the fence as a free key: Lookup answers Absent, a claim and another
// mark are Acquired. Without MaxAttempts only: with it, the engine claims
// and commits in two steps (CanMark).
func TestUnmarkFencesADelayedMark(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("um-%d:", time.Now().UnixNano())})
	if !s.CanMark() || newStore(t, c, redis.Options{Prefix: "um-attempts:", MaxAttempts: 2}).CanMark() {
		t.Fatal("CanMark: want true without MaxAttempts, false with it")
	}
	mark := func(r redis.Request) tier.Status {
		t.Helper()
		out := make([]redis.Result, 1)
		if err := s.Mark(ctx, []redis.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Status
	}
	unmark := func(r redis.Request) tier.Status {
		t.Helper()
		out := make([]redis.Status, 1)
		if err := s.Unmark(ctx, []redis.Request{r}, time.Minute, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	look := func(r redis.Request) tier.Status {
		t.Helper()
		out := make([]redis.Result, 1)
		if err := s.Lookup(ctx, []redis.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Status
	}
	// Applied, then undone.
	a := req("applied", tok(1))
	if st := mark(a); st != tier.Acquired {
		t.Fatalf("mark: %v", st)
	}
	if st := unmark(a); st != tier.OK || look(a) != tier.Absent {
		t.Fatalf("unmark of an applied mark: %v, then %v", st, look(a))
	}
	// Not applied yet: fenced. The delayed mark finds the key taken.
	d := req("delayed", tok(2))
	if st := unmark(d); st != tier.Lost {
		t.Fatalf("unmark of a mark not applied: %v, want Lost (nothing undone)", st)
	}
	if st := look(d); st != tier.Absent {
		t.Fatalf("Lookup over a fence: %v, want Absent", st)
	}
	if n, err := c.Exists(ctx, s.Key("", d.Key)).Result(); err != nil || n != 1 {
		t.Fatalf("no fence left (%d, %v)", n, err)
	}
	// The delayed request itself, a plain SET NX of the committed value,
	// as Mark sent it: refused by the fence.
	value := string(append([]byte{'D'}, d.Token[:]...))
	if old, err := c.SetArgs(ctx, s.Key("", d.Key), value, goredis.SetArgs{Mode: "NX", Get: true, TTL: time.Hour}).Result(); err != nil || old[0] != 'X' {
		t.Fatalf("the delayed mark over its fence: old %q, %v; want the fence kept", old, err)
	}
	if v, _ := c.Get(ctx, s.Key("", d.Key)).Result(); v[0] != 'X' {
		t.Fatalf("the key holds %q after the delayed mark, want the fence", v)
	}
	// Another caller takes a fenced key as free.
	o := req("delayed-other", tok(3))
	if st := unmark(o); st != tier.Lost {
		t.Fatal(st)
	}
	if st := mark(req("delayed-other", tok(4))); st != tier.Acquired {
		t.Fatalf("another mark over a fence: %v, want Acquired", st)
	}
	if got := claim(t, s, req("fenced-claim", tok(5)), time.Minute); got.Status != tier.Acquired {
		t.Fatal(got.Status)
	}
	f := req("fenced-claim2", tok(6))
	unmark(f)
	if got := claim(t, s, req("fenced-claim2", tok(7)), time.Minute); got.Status != tier.Acquired {
		t.Fatalf("a claim over a fence: %v, want Acquired", got.Status)
	}
}
