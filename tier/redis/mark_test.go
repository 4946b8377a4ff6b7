package redis_test

import (
	"context"
	"fmt"
	"strings"
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

// TestMarkSettlesAfterAForget: a mark whose reply was lost is settled by
// the claim script, which must answer as the mark's one copy applied: the
// copy committed, a Forget removed the commit, and then (a) nobody took
// the key, (b) another mark committed it, (c) another call claimed and
// released it. In each the mark answers acquired (New) and writes
// nothing: the Forget's removal stands, and the other mark's commit.
// A mark nobody forgot is settled as before: its own commit, or a mark
// made now.
func TestMarkSettlesAfterAForget(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("settle-%d:", time.Now().UnixNano())})
	settle := func(r redis.Request) redis.Result {
		t.Helper()
		out := make([]redis.Result, 1)
		if err := s.SettleMarks(ctx, []redis.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// applied writes a mark's commit as its SET NX does.
	applied := func(r redis.Request) {
		t.Helper()
		v := string(append([]byte{'D'}, r.Token[:]...))
		if err := c.Set(ctx, s.Key("", r.Key), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	forget := func(key string) {
		t.Helper()
		out := make([]redis.Result, 1)
		if err := s.Forget(ctx, []redis.Request{req(key, tok(99))}, out); err != nil || out[0].Status != tier.Committed {
			t.Fatalf("Forget: %v, %v", out[0].Status, err)
		}
	}
	value := func(key string) string {
		v, err := c.Get(ctx, s.Key("", []byte(key))).Result()
		if err == goredis.Nil {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// (a) Forgotten, nobody took the key since: the fence remains.
	a := req("a", tok(1))
	applied(a)
	forget("a")
	if got := settle(a); got.Status != tier.Acquired {
		t.Fatalf("(a) settled %v, want Acquired", got.Status)
	}
	if v := value("a"); v == "" || v[0] != 'X' {
		t.Fatalf("(a) the key holds %q after settling, want the Forget's fence (nothing marked again)", v)
	}

	// (b) Forgotten, then marked by another call.
	b, other := req("b", tok(2)), req("b", tok(3))
	applied(b)
	forget("b")
	out := make([]redis.Result, 1)
	if err := s.Mark(ctx, []redis.Request{other}, out); err != nil || out[0].Status != tier.Acquired {
		t.Fatalf("(b) the other mark: %v, %v", out[0].Status, err)
	}
	if got := settle(b); got.Status != tier.Acquired {
		t.Fatalf("(b) settled %v (token %x), want Acquired: the mark committed before the Forget", got.Status, got.Token)
	}
	if v := value("b"); v != string(append([]byte{'D'}, other.Token[:]...)) {
		t.Fatalf("(b) the key holds %q, want the other mark's commit kept", v)
	}

	// (c) Forgotten, then claimed and released by another call: free.
	cr, claimer := req("c", tok(4)), req("c", tok(5))
	applied(cr)
	forget("c")
	if got := claim(t, s, claimer, time.Minute); got.Status != tier.Acquired {
		t.Fatal(got.Status)
	}
	st := make([]redis.Status, 1)
	if err := s.Release(ctx, 0, []redis.Request{claimer}, false, st); err != nil || st[0] != tier.OK {
		t.Fatalf("(c) release: %v, %v", st[0], err)
	}
	if got := settle(cr); got.Status != tier.Acquired {
		t.Fatalf("(c) settled %v, want Acquired", got.Status)
	}
	if v := value("c"); v != "" && v[0] != 'X' {
		t.Fatalf("(c) the key holds %q, want it free (or the release's fence): the Forget removed the mark's commit", v)
	}

	// Not forgotten: its own commit, or (never applied) marked now.
	d := req("d", tok(6))
	applied(d)
	if got := settle(d); got.Status != tier.Committed || got.Token != d.Token {
		t.Fatalf("own commit settled as %v %x", got.Status, got.Token)
	}
	e := req("e", tok(7))
	if got := settle(e); got.Status != tier.Acquired || value("e") != string(append([]byte{'D'}, e.Token[:]...)) {
		t.Fatalf("a mark never applied: settled %v, key %q; want Acquired and marked", got.Status, value("e"))
	}
}

// TestMarkIsSentOnce: go-redis resends a command whose reply it lost
// (MaxRetries); a mark's SET NX must reach the server once, its lost reply
// settled by the store. The server is paused past several read timeouts
// while a Mark waits, then resumed: one SET reached it, and the mark is
// New with its commit in place.
func TestMarkIsSentOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := srv.ClientWith(t, &goredis.Options{ReadTimeout: 30 * time.Millisecond, MaxRetries: 20, MaxRetryBackoff: 10 * time.Millisecond})
	s := newStore(t, c, redis.Options{Prefix: "once:"})
	admin := srv.Client(t)
	sets := func() int64 {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_set:") {
				fmt.Sscanf(strings.TrimPrefix(line, "cmdstat_set:"), "calls=%d", &n)
			}
		}
		return n
	}
	before := sets()
	r := req("once", tok(1))
	srv.Pause()
	done := make(chan error, 1)
	out := make([]redis.Result, 1)
	go func() { done <- s.Mark(ctx, []redis.Request{r}, out) }()
	time.Sleep(200 * time.Millisecond) // several read timeouts
	srv.Resume()
	if err := <-done; err != nil {
		t.Fatalf("Mark: %v", err)
	}
	if out[0].Status != tier.Acquired && (out[0].Status != tier.Committed || out[0].Token != r.Token) {
		t.Fatalf("Mark answered %v (token %x), want its own mark", out[0].Status, out[0].Token)
	}
	if n := sets() - before; n != 1 {
		t.Fatalf("the server ran %d SETs for one mark, want 1 (the client resent it)", n)
	}
	v, err := admin.Get(ctx, s.Key("", r.Key)).Result()
	if err != nil || v != string(append([]byte{'D'}, r.Token[:]...)) {
		t.Fatalf("the key holds %q (%v), want the mark's commit", v, err)
	}
}

// TestLateCopiesOfAnEndedCall: a copy of a call's message that reaches
// the server after the call ended (released, given back) must take
// nothing: (a) a copy of a mark's settling script after the mark was
// given back (Unmark) must not mark the key again; (b) a copy of a
// claim after its release must not hold the key; (c) a give-back over
// another call's fence keeps that fence (its content is the other call's)
// at least as long as its own would last, so the mark's SET NX arriving
// later finds the key taken.
func TestLateCopiesOfAnEndedCall(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("late-%d:", time.Now().UnixNano())})
	look := func(r redis.Request) tier.Status {
		t.Helper()
		out := make([]redis.Result, 1)
		if err := s.Lookup(ctx, []redis.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Status
	}
	unmark := func(r redis.Request, fence time.Duration) tier.Status {
		t.Helper()
		out := make([]redis.Status, 1)
		if err := s.Unmark(ctx, []redis.Request{r}, fence, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// (a)
	a := req("a", tok(1))
	out := make([]redis.Result, 1)
	if err := s.Mark(ctx, []redis.Request{a}, out); err != nil || out[0].Status != tier.Acquired {
		t.Fatalf("(a) mark: %v %v", out[0].Status, err)
	}
	if st := unmark(a, time.Minute); st != tier.OK {
		t.Fatalf("(a) unmark: %v", st)
	}
	if err := s.SettleMarks(ctx, []redis.Request{a}, out); err != nil {
		t.Fatal(err)
	}
	if st := look(a); st != tier.Absent {
		t.Fatalf("(a) after a late copy of the given-back mark's settling script: %v, want Absent", st)
	}
	// (b)
	b := req("b", tok(2))
	if got := claim(t, s, b, time.Minute); got.Status != tier.Acquired {
		t.Fatal(got.Status)
	}
	st := make([]redis.Status, 1)
	if err := s.Release(ctx, 0, []redis.Request{b}, false, st); err != nil || st[0] != tier.OK {
		t.Fatalf("(b) release: %v %v", st[0], err)
	}
	claim(t, s, b, time.Minute) // the late copy
	if got := claim(t, s, req("b", tok(3)), time.Minute); got.Status != tier.Acquired {
		t.Fatalf("(b) another claim after a late copy of the released claim: %v, want Acquired", got.Status)
	}
	// (c)
	other, late := req("c", tok(4)), req("c", tok(5))
	if got := claim(t, s, other, time.Minute); got.Status != tier.Acquired {
		t.Fatal(got.Status)
	}
	if err := s.Release(ctx, 0, []redis.Request{other}, false, st); err != nil || st[0] != tier.OK {
		t.Fatalf("(c) release: %v %v", st[0], err)
	}
	key := s.Key("", late.Key)
	before, _ := c.Get(ctx, key).Result()
	unmark(late, 5*time.Minute)
	after, _ := c.Get(ctx, key).Result()
	if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl < 4*time.Minute || after != before {
		t.Fatalf("(c) a give-back over another call's fence: %q (was %q), TTL %v, %v; want it kept, for the give-back's 5m", after, before, ttl, err)
	}
	value := string(append([]byte{'D'}, late.Token[:]...))
	if err := c.SetArgs(ctx, key, value, goredis.SetArgs{Mode: "NX", TTL: time.Hour}).Err(); err != goredis.Nil {
		t.Fatalf("(c) the late mark's SET NX: %v, want refused", err)
	}
}

// TestLateSettleAfterGiveBackAndAnotherCall: a mark's SET was never
// applied and its settling script's reply was lost; the call was given
// back (Unmark's fence); another call claimed the key (a fence is free to
// it) and released it (its own fence). A copy of the settling script that
// arrives now must write nothing: the call that sent it failed.
func TestLateSettleAfterGiveBackAndAnotherCall(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("late-settle-%d:", time.Now().UnixNano())})
	a, b := req("k", tok(1)), req("k", tok(2))
	st := make([]redis.Status, 1)
	if err := s.Unmark(ctx, []redis.Request{a}, time.Minute, st); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, s, b, time.Minute); got.Status != tier.Acquired {
		t.Fatalf("b's claim over a's fence: %v", got.Status)
	}
	if err := s.Release(ctx, 0, []redis.Request{b}, false, st); err != nil || st[0] != tier.OK {
		t.Fatalf("b's release: %v %v", st[0], err)
	}
	out := make([]redis.Result, 1)
	if err := s.SettleMarks(ctx, []redis.Request{a}, out); err != nil {
		t.Fatal(err)
	}
	look := make([]redis.Result, 1)
	if err := s.Lookup(ctx, []redis.Request{req("k", tok(3))}, look); err != nil {
		t.Fatal(err)
	}
	if look[0].Status != tier.Absent {
		t.Fatalf("after the late settling script of the given-back mark: %v, want Absent (its call failed)", look[0].Status)
	}
}
