package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Adversarial tests of the archive behind Redis (a PostgreSQL archive fed
// from the Redis archive log), through the public API. Real time: keys
// leave Redis 6 s after their commit (redisArchiveOptions).

// ra2Open opens an engine closed when the test ends (Close is idempotent,
// so a test may close it earlier).
func ra2Open(t *testing.T, o engine.Options) *engine.Engine {
	t.Helper()
	e := open(t, o)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// ra2WaitDrainer waits until e holds the drain lease.
func ra2WaitDrainer(t *testing.T, e *engine.Engine, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !e.Stats().Archive.Drainer; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("engine does not hold the drain lease after %v: %+v", within, *e.Stats().Archive)
		}
	}
}

// ra2WaitDrained waits until e read the log empty in a pass that began
// after the call (so what was appended before it is applied).
func ra2WaitDrained(t *testing.T, e *engine.Engine, within time.Duration) {
	t.Helper()
	since := e.Stats().Archive.LogPasses
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if a := e.Stats().Archive; a.LogPasses >= since+2 && a.LogEntries == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log not drained within %v: %+v", within, *e.Stats().Archive)
		}
	}
}

// ra2StallDrain holds prefix's drain lease as a dead drainer would, for a
// minute, so that no engine drains the archive log until the test deletes
// the returned key.
func ra2StallDrain(t *testing.T, c *goredis.Client, prefix string) string {
	t.Helper()
	lease := prefix + "\x00\xffdrain"
	if err := c.Set(context.Background(), lease, "a-dead-drainer", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	return lease
}

// forgetAtGate runs e.Forget(key) in the background (forgetAsync) and
// waits until it reaches gate (its archive query naming the key waits
// there); the channel gets the Forget's answer once the gate is released.
func forgetAtGate(t *testing.T, e *engine.Engine, key []byte, gate *gatedDB) <-chan forgetResult {
	t.Helper()
	forgot := forgetAsync(e, key)
	select {
	case <-gate.entered:
	case r := <-forgot:
		t.Fatalf("Forget returned without reading the archive for the key: %+v, %v", r.Info, r.Err)
	case <-time.After(10 * time.Second):
		t.Fatal("Forget never reached the archive")
	}
	return forgot
}

// ra2WaitGone waits until Redis no longer holds key (its TTL passed).
func ra2WaitGone(t *testing.T, c *goredis.Client, rkey string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		n, err := redisHeld(context.Background(), c, rkey)
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis still holds %q after %v (%d, %v)", rkey, within, n, err)
		}
	}
}

// redisHeld counts the keys of rkeys that hold a value in Redis other
// than a fence ('X' ‖ …: what a Forget leaves, which every script takes
// as free).
func redisHeld(ctx context.Context, c *goredis.Client, rkeys ...string) (int64, error) {
	vals, err := c.MGet(ctx, rkeys...).Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, v := range vals {
		if s, ok := v.(string); ok && !strings.HasPrefix(s, "X") {
			n++
		}
	}
	return n, nil
}

// ra2MustNew claims key in ns, wants New, and releases it.
func ra2MustNew(t *testing.T, e *engine.Engine, ns *engine.Namespace, key string) {
	t.Helper()
	ctx := context.Background()
	cl, err := ns.Claim(ctx, []byte(key))
	if err != nil || cl.Outcome != engine.New {
		t.Errorf("claim of %q in %q: %v, %v; want New", key, ns.Name(), cl.Outcome, err)
		return
	}
	if err := e.Release(ctx, cl); err != nil {
		t.Errorf("release of %q: %v", key, err)
	}
}

// TestRArchAttackCommitPaths commits keys through every commit path
// (Claim+Commit with a digest and a result, DoResult, MarkBatch with
// digests, CommitAsync and CommitBatchAsync then Flush), in namespaces
// (one with an archive window of its own, one with a short window, which
// is never archived), beside keys that must never reach the archive (a
// released claim, a failed Do, a commit whose lease was lost). Once Redis
// let them go: each committed key is Duplicate from the archive with its
// result and digest (Conflict for another digest), for Lookup, Claim, Mark
// and DoResult alike; the others are New; the namespace's archive window
// ends on time; Stats count exactly the archived commits.
func TestRArchAttackCommitPaths(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("paths-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.Namespaces = map[string]engine.NamespaceOptions{"short": {Window: 3 * time.Second}, "brief": {ArchiveWindow: 14 * time.Second}}
	e := ra2Open(t, o)
	ctx := context.Background()
	def, _ := e.Namespace("")
	orders, err := e.Namespace("orders")
	if err != nil {
		t.Fatal(err)
	}
	short, _ := e.Namespace("short")
	brief, _ := e.Namespace("brief")
	d1, d2 := engine.DigestOf([]byte("payload-1")), engine.DigestOf([]byte("payload-2"))
	archived := 0 // commits that reach the archive

	// A claim left past its lease (2 s) while the rest is set up.
	lost, err := e.Claim(ctx, []byte("lease-lost"))
	if err != nil || lost.Outcome != engine.New {
		t.Fatalf("lease-lost: %v, %v", lost.Outcome, err)
	}
	started := time.Now()

	cl, err := def.ClaimDigest(ctx, []byte("claim-res"), d1)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim-res: %v, %v", cl.Outcome, err)
	}
	cl.Result = []byte("r-claim")
	if err := e.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	archived++
	if out, res, err := e.DoResult(ctx, []byte("do-res"), func(context.Context) ([]byte, error) { return []byte("r-do"), nil }); err != nil || out != engine.New || string(res) != "r-do" {
		t.Fatalf("DoResult: %v %q %v", out, res, err)
	}
	archived++
	if out, err := e.Do(ctx, []byte("do-fail"), func(context.Context) error { return errors.New("handler failed") }); out != engine.New || err == nil {
		t.Fatalf("failing Do: %v, %v", out, err)
	}
	marks := keysOf("mark", 20)
	digests := make([]engine.Digest, len(marks))
	for i := range digests {
		digests[i] = d1
	}
	outs := make([]engine.Outcome, len(marks))
	if err := e.MarkBatch(ctx, marks, digests, outs); err != nil {
		t.Fatal(err)
	}
	for i, x := range outs {
		if x != engine.New {
			t.Fatalf("mark %d: %v", i, x)
		}
	}
	archived += len(marks)
	ac, err := e.Claim(ctx, []byte("async"))
	if err != nil || ac.Outcome != engine.New {
		t.Fatalf("async: %v, %v", ac.Outcome, err)
	}
	ac.Result = []byte("r-async")
	var asyncErr atomic.Value
	e.CommitAsync(ctx, ac, func(err error) {
		if err != nil {
			asyncErr.Store(err)
		}
	})
	archived++
	batch := keysOf("async-batch", 5)
	bcl := make([]engine.Claim, len(batch))
	if err := e.ClaimBatch(ctx, batch, nil, bcl); err != nil {
		t.Fatal(err)
	}
	e.CommitBatchAsync(ctx, bcl, nil, func(err error) {
		if err != nil {
			asyncErr.Store(err)
		}
	})
	archived += len(batch)
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err, _ := asyncErr.Load().(error); err != nil {
		t.Fatalf("async commit: %v", err)
	}
	oc, err := orders.Claim(ctx, []byte("o1"))
	if err != nil || oc.Outcome != engine.New {
		t.Fatalf("orders o1: %v, %v", oc.Outcome, err)
	}
	oc.Result = []byte("r-orders")
	if err := e.Commit(ctx, oc); err != nil {
		t.Fatal(err)
	}
	archived++
	if x, err := short.MarkIfAbsent(ctx, []byte("s1")); err != nil || x != engine.New {
		t.Fatalf("short s1: %v, %v", x, err)
	}
	if x, err := brief.MarkIfAbsent(ctx, []byte("b1")); err != nil || x != engine.New {
		t.Fatalf("brief b1: %v, %v", x, err)
	}
	archived++
	briefAt := time.Now()
	rel, err := e.Claim(ctx, []byte("released"))
	if err != nil || rel.Outcome != engine.New {
		t.Fatalf("released: %v, %v", rel.Outcome, err)
	}
	if err := e.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(started.Add(o.Lease + 300*time.Millisecond)))
	if err := e.Commit(ctx, lost); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("commit after the lease ended: %v, want ErrLeaseLost", err)
	}

	// Past Redis's window: the archive answers.
	committed := []([]byte){[]byte("claim-res"), []byte("do-res"), []byte("async")}
	committed = append(append(committed, marks...), batch...)
	infos := waitFromArchive(t, e, committed, 20*time.Second)
	// (Its 14 s leave room for a drain that lags seconds under -race.)
	if time.Since(briefAt) >= 12*time.Second {
		t.Fatalf("the archive answered only %v after the commits: the brief namespace's window is spent", time.Since(briefAt))
	}
	for i, in := range infos {
		if in.CommittedAt == 0 || in.CommittedBefore == 0 || in.CommittedAt >= in.CommittedBefore {
			t.Errorf("key %s: CommittedAt %d, CommittedBefore %d", committed[i], in.CommittedAt, in.CommittedBefore)
		}
	}
	if in := infos[0]; string(in.Result) != "r-claim" || in.Digest != d1 {
		t.Errorf("claim-res from the archive: %q %x", in.Result, in.Digest)
	}
	if in := infos[2]; string(in.Result) != "r-async" {
		t.Errorf("async from the archive: %q", in.Result)
	}
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", []byte("claim-res"))); err != nil || n != 0 {
		t.Fatalf("Redis still holds claim-res (%d, %v)", n, err)
	}
	// Claim agrees with Lookup: the result, the time (a result is dated),
	// Conflict for another digest.
	if x, err := def.ClaimDigest(ctx, []byte("claim-res"), d1); err != nil || x.Outcome != engine.Duplicate || string(x.Result) != "r-claim" || x.CommittedAt != infos[0].CommittedAt {
		t.Errorf("claim of claim-res, same digest: %v %q at %d, %v (lookup: at %d)", x.Outcome, x.Result, x.CommittedAt, err, infos[0].CommittedAt)
	}
	if x, err := def.ClaimDigest(ctx, []byte("claim-res"), d2); err != nil || x.Outcome != engine.Conflict {
		t.Errorf("claim of claim-res, another digest: %v, %v; want Conflict", x.Outcome, err)
	}
	ran := false
	if x, res, err := e.DoResult(ctx, []byte("do-res"), func(context.Context) ([]byte, error) { ran = true; return nil, nil }); err != nil || x != engine.Duplicate || string(res) != "r-do" || ran {
		t.Errorf("DoResult of an archived key: %v %q %v (handler ran: %v)", x, res, err, ran)
	}
	if err := e.MarkBatch(ctx, marks, digests, outs); err != nil {
		t.Fatal(err)
	}
	for i, x := range outs {
		if x != engine.Duplicate {
			t.Errorf("mark %d again: %v", i, x)
		}
	}
	other := make([]engine.Digest, 5)
	for i := range other {
		other[i] = d2
	}
	if err := e.MarkBatch(ctx, marks[:5], other, outs[:5]); err != nil {
		t.Fatal(err)
	}
	for i, x := range outs[:5] {
		if x != engine.Conflict {
			t.Errorf("mark %d with another digest: %v, want Conflict", i, x)
		}
	}
	// Namespaces: orders' o1 is archived, the default's o1 never was.
	if x, err := orders.Claim(ctx, []byte("o1")); err != nil || x.Outcome != engine.Duplicate || string(x.Result) != "r-orders" {
		t.Errorf("orders o1: %v %q, %v", x.Outcome, x.Result, err)
	}
	if in, err := orders.Lookup(ctx, []byte("o1")); err != nil || in.Outcome != engine.Duplicate || in.Source != engine.SourceArchive {
		t.Errorf("lookup orders o1: %+v, %v", in, err)
	}
	ra2MustNew(t, e, def, "o1")
	// A short window of its own: New after it, never archived.
	if in, err := short.Lookup(ctx, []byte("s1")); err != nil || in.Outcome != engine.New {
		t.Errorf("short s1: %+v, %v; want New", in, err)
	}
	ra2MustNew(t, e, short, "s1")
	// The brief archive window still holds b1, in its namespace only.
	if in, err := brief.Lookup(ctx, []byte("b1")); err != nil || in.Outcome != engine.Duplicate || in.Source != engine.SourceArchive {
		t.Errorf("brief b1 inside its archive window: %+v, %v", in, err)
	}
	ra2MustNew(t, e, def, "b1")
	// Nothing that was not committed reached the archive.
	for _, k := range []string{"released", "do-fail", "lease-lost"} {
		if in, err := e.Lookup(ctx, []byte(k)); err != nil || in.Outcome != engine.New {
			t.Errorf("%s: %+v, %v; want New", k, in, err)
		}
		ra2MustNew(t, e, def, k)
	}
	ra2WaitDrained(t, e, 5*time.Second)
	st := *e.Stats().Archive
	if st.Name != "postgres" || st.Window != o.ArchiveWindow || !st.Drainer || st.Keys != uint64(archived) ||
		st.Hits == 0 || st.Reads < st.Hits || st.Partitions == 0 || st.Lag > 2 || st.FilterBytes == 0 {
		t.Errorf("stats: %+v (want %d keys archived)", st, archived)
	}
	// Past brief's own archive window (and a partition): New, and a new
	// commit is a Duplicate again.
	time.Sleep(time.Until(briefAt.Add(14*time.Second + o.Partition)))
	if in, err := brief.Lookup(ctx, []byte("b1")); err != nil || in.Outcome != engine.New {
		t.Errorf("brief b1 past its archive window: %+v, %v", in, err)
	}
	if x, err := brief.MarkIfAbsent(ctx, []byte("b1")); err != nil || x != engine.New {
		t.Errorf("mark brief b1 past its archive window: %v, %v", x, err)
	}
	if x, err := brief.MarkIfAbsent(ctx, []byte("b1")); err != nil || x != engine.Duplicate {
		t.Errorf("brief b1 committed again: %v, %v", x, err)
	}
	if in, err := orders.Lookup(ctx, []byte("o1")); err != nil || in.Outcome != engine.Duplicate {
		t.Errorf("orders o1 inside the engine's archive window: %+v, %v", in, err)
	}
}

// TestRArchAttackMaxAttempts: with MaxAttempts 2, a key committed after
// a released claim, and one committed by the claim that took over an
// expired one, are Duplicate from the archive once Redis let them go, and
// stay Duplicate however many claims ask (the archive's answers are given
// back without counting attempts: never Poison). A released key and a
// poisoned one, never committed, are never Duplicate.
func TestRArchAttackMaxAttempts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("attempts-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.MaxAttempts = 2
	e := ra2Open(t, o)
	ctx := context.Background()
	claim := func(k string, want engine.Outcome) engine.Claim {
		t.Helper()
		cl, err := e.Claim(ctx, []byte(k))
		if err != nil || cl.Outcome != want {
			t.Fatalf("claim %s: %v, %v; want %v", k, cl.Outcome, err, want)
		}
		return cl
	}
	release := func(cl engine.Claim) {
		t.Helper()
		if err := e.Release(ctx, cl); err != nil {
			t.Fatal(err)
		}
	}
	expired := claim("m-expired", engine.New) // left to its lease
	expiredAt := time.Now()
	release(claim("m-rel", engine.New))
	release(claim("m-poison", engine.New))
	release(claim("m-poison", engine.New))
	claim("m-poison", engine.Poison)
	release(claim("m-after-rel", engine.New))
	cl := claim("m-after-rel", engine.New)
	cl.Result = []byte("after-release")
	if err := e.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(expiredAt.Add(o.Lease + 300*time.Millisecond)))
	if err := e.Commit(ctx, expired); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("commit of the expired claim: %v", err)
	}
	taken := claim("m-expired", engine.New)
	taken.Result = []byte("took-over")
	if err := e.Commit(ctx, taken); err != nil {
		t.Fatal(err)
	}
	keys := [][]byte{[]byte("m-after-rel"), []byte("m-expired")}
	infos := waitFromArchive(t, e, keys, 20*time.Second)
	if string(infos[0].Result) != "after-release" || string(infos[1].Result) != "took-over" {
		t.Errorf("results from the archive: %q, %q", infos[0].Result, infos[1].Result)
	}
	for round := range 2 * o.MaxAttempts {
		for _, k := range keys {
			x, err := e.Claim(ctx, k)
			if err != nil || x.Outcome != engine.Duplicate {
				t.Fatalf("claim %d of archived %s: %v, %v", round, k, x.Outcome, err)
			}
		}
		if x, err := e.MarkIfAbsent(ctx, keys[0]); err != nil || x != engine.Duplicate {
			t.Fatalf("mark %d of archived key: %v, %v", round, x, err)
		}
	}
	for _, k := range keys {
		if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", k)); err != nil || n != 0 {
			t.Errorf("an archive-answered claim of %s left a value in Redis (%d, %v)", k, n, err)
		}
	}
	for _, k := range []string{"m-rel", "m-poison"} {
		in, err := e.Lookup(ctx, []byte(k))
		if err != nil || in.Outcome == engine.Duplicate {
			t.Errorf("never committed %s: %+v, %v", k, in, err)
		}
	}
}

// TestRArchAttackRestartUndrained: the drain lease is held by a drainer
// that died (its lease key outlives every engine), an engine commits and
// closes with its commits only in the log, and a new engine opens after
// Redis let them go. Until the log is drained, its claims, marks and
// Lookups fail ErrUnavailable, never New (fresh keys too); once the lease
// is free it drains, and everything is Duplicate from the archive. A
// third engine opened afterwards answers from the archive at once.
func TestRArchAttackRestartUndrained(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("undrained-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	lease := ra2StallDrain(t, c, prefix)
	a := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	keys := keysOf("undrained", 100)
	outs := make([]engine.Outcome, len(keys))
	if err := a.MarkBatch(ctx, keys, nil, outs); err != nil {
		t.Fatal(err)
	}
	if x, _, err := a.DoResult(ctx, []byte("with-result"), func(context.Context) ([]byte, error) { return []byte("kept"), nil }); err != nil || x != engine.New {
		t.Fatalf("DoResult: %v, %v", x, err)
	}
	time.Sleep(1100 * time.Millisecond)
	// The batch's commits are one log entry (one call of the commit
	// script), the DoResult's another.
	if st := a.Stats().Archive; st.Drainer || st.LogEntries != 2 {
		t.Fatalf("with the lease held elsewhere: %+v", *st)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ra2WaitGone(t, c, redisKeyOf(prefix, "", keys[len(keys)-1]), 10*time.Second)

	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	all := append(append([][]byte(nil), keys...), []byte("with-result"))
	infos := make([]engine.KeyInfo, len(all))
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := b.LookupBatch(ctx, all, infos); !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("lookup while the log holds the commits: %v, want ErrUnavailable (%+v)", err, infos[0])
		}
		if cl, err := b.Claim(ctx, keys[0]); !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("claim while the log holds the commit: %v, %v", cl.Outcome, err)
		}
		if x, err := b.MarkIfAbsent(ctx, []byte("fresh")); !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("mark of a fresh key while the log lags: %v, %v", x, err)
		}
	}
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", keys[0]), redisKeyOf(prefix, "", []byte("fresh"))); err != nil || n != 0 {
		t.Fatalf("failed claims left in Redis (%d, %v)", n, err)
	}
	if err := c.Del(ctx, lease).Err(); err != nil {
		t.Fatal(err)
	}
	infos = waitFromArchive(t, b, all, 15*time.Second)
	if string(infos[len(all)-1].Result) != "kept" {
		t.Errorf("result from the archive: %q", infos[len(all)-1].Result)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		x, err := b.MarkIfAbsent(ctx, []byte("fresh"))
		if err == nil && x == engine.New {
			break
		}
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("fresh key: %v, %v", x, err)
		}
	}
	if !b.Stats().Archive.Drainer {
		t.Errorf("b drained without the lease: %+v", *b.Stats().Archive)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart answers from the sealed partitions' filters at once.
	d := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	if err := d.LookupBatch(ctx, all, infos); err != nil {
		t.Fatalf("lookup right after a restart: %v", err)
	}
	for i, in := range infos {
		if in.Outcome != engine.Duplicate || in.Source != engine.SourceArchive {
			t.Fatalf("key %s right after a restart: %+v", all[i], in)
		}
	}
	if cl, err := d.Claim(ctx, []byte("with-result")); err != nil || cl.Outcome != engine.Duplicate || string(cl.Result) != "kept" {
		t.Fatalf("claim right after a restart: %v %q, %v", cl.Outcome, cl.Result, err)
	}
}

// TestRArchAttackForgetRecommitAfterClose: the drainer closes right after
// another engine committed; the other takes the drain over, and its keys
// reach the archive. A Forget of an archived key, then (on a restarted
// engine) a new commit of it with another result: once Redis let the new
// commit go, the archive answers it, with the new result and time.
func TestRArchAttackForgetRecommitAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("recommit-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	a := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	ra2WaitDrainer(t, a, 3*time.Second)
	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	keys := keysOf("close", 50)
	outs := make([]engine.Outcome, len(keys))
	if err := b.MarkBatch(ctx, keys, nil, outs); err != nil {
		t.Fatal(err)
	}
	fk := []byte("forget-me")
	cl, err := b.Claim(ctx, fk)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("%v, %v", cl.Outcome, err)
	}
	cl.Result = []byte("first")
	if err := b.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // the drainer, its lease still running
		t.Fatal(err)
	}
	waitFromArchive(t, b, append(append([][]byte(nil), keys...), fk), 20*time.Second)
	if !b.Stats().Archive.Drainer {
		t.Errorf("b does not drain after a closed: %+v", *b.Stats().Archive)
	}
	info, err := b.Forget(ctx, fk)
	if err != nil || info.Outcome != engine.Duplicate || info.Source != engine.SourceArchive || string(info.Result) != "first" {
		t.Fatalf("Forget: %+v, %v", info, err)
	}
	a2 := ra2Open(t, redisArchiveOptions(c, prefix, arch)) // a restarted
	if in, err := a2.Lookup(ctx, fk); err != nil || in.Outcome != engine.New {
		t.Fatalf("forgotten key on a restarted engine: %+v, %v", in, err)
	}
	cl, err = a2.Claim(ctx, fk)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after Forget: %v, %v", cl.Outcome, err)
	}
	cl.Result = []byte("second")
	recommitted := time.Now()
	if err := a2.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	infos := make([]engine.KeyInfo, len(keys))
	if err := a2.LookupBatch(ctx, keys, infos); err != nil {
		t.Fatal(err)
	}
	for i, in := range infos {
		if in.Outcome != engine.Duplicate || in.Source != engine.SourceArchive {
			t.Fatalf("key %d on the restarted engine: %+v", i, in)
		}
	}
	got := waitFromArchive(t, b, [][]byte{fk}, 20*time.Second)[0]
	if string(got.Result) != "second" || got.CommittedAt < recommitted.Add(-time.Second).UnixNano() {
		t.Fatalf("re-committed key from the archive: %q at %v (re-committed at %v)", got.Result, time.Unix(0, got.CommittedAt), recommitted)
	}
	if x, err := a2.Claim(ctx, fk); err != nil || x.Outcome != engine.Duplicate || string(x.Result) != "second" {
		t.Fatalf("claim of the re-committed key: %v %q, %v", x.Outcome, x.Result, err)
	}
}

// gatedDB is a PostgreSQL pool whose queries (outside transactions)
// naming key among their arguments wait, once armed, until release is
// closed: a slow or paused database connection.
type gatedDB struct {
	*pgxpool.Pool
	key     []byte
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newGatedDB(p *pgxpool.Pool, key []byte) *gatedDB {
	return &gatedDB{Pool: p, key: key, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedDB) names(args []any) bool {
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			if string(v) == string(g.key) {
				return true
			}
		case [][]byte:
			for _, b := range v {
				if string(b) == string(g.key) {
					return true
				}
			}
		}
	}
	return false
}

func (g *gatedDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if g.armed.Load() && g.names(args) {
		g.once.Do(func() { close(g.entered) })
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Pool.Query(ctx, sql, args...)
}

// TestRArchAttackForgetRacesRecommit: behind Redis's archive log a Forget
// reads the archive first (slowly here: a slow connection), then Redis
// removes the key and appends the removal, and the Forget waits for the
// drain. While its read waits the key is still committed (another
// engine's claim is Duplicate); once Redis removed it, another engine
// claims it (New), commits it, and the drain applies the log (the
// Forget's removal, then the new commit). Nothing the Forget does may
// remove the commit made after it: once Redis let the new commit go, the
// key must still be Duplicate, from the archive. The Forget answers what
// the key held: Duplicate.
func TestRArchAttackForgetRacesRecommit(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("forgetrace-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	key := []byte("raced")
	gate := newGatedDB(arch.DB.(*pgxpool.Pool), key)
	ctx := context.Background()
	a := ra2Open(t, redisArchiveOptions(c, prefix, postgres.Archive{DB: gate, Table: arch.Table}))
	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	if x, err := a.MarkIfAbsent(ctx, key); err != nil || x != engine.New {
		t.Fatalf("first commit: %v, %v", x, err)
	}
	gate.armed.Store(true)
	forgot := forgetAtGate(t, a, key, gate) // its read of the archive waits
	if cl, err := b.Claim(ctx, key); err != nil || cl.Outcome != engine.Duplicate {
		close(gate.release)
		t.Fatalf("claim while the Forget reads the archive, before Redis removed the key: %v, %v; want Duplicate", cl.Outcome, err)
	}
	close(gate.release)
	ra2WaitGone(t, c, redisKeyOf(prefix, "", key), 10*time.Second) // removed from Redis
	cl, err := b.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after the Forget removed the key from Redis: %v, %v", cl.Outcome, err)
	}
	cl.Result = []byte("after-forget")
	if err := b.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	recommitted := time.Now()
	ra2WaitDrained(t, b, 5*time.Second) // the removal and the new commit applied
	pool := arch.DB.(*pgxpool.Pool)
	var before, rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+arch.Table+" WHERE key = $1", key).Scan(&before); err != nil {
		t.Fatal(err)
	}
	var early forgetResult
	select {
	case early = <-forgot:
	case <-time.After(35 * time.Second):
		t.Fatal("Forget did not return")
	}
	if early.Err != nil || early.Info.Outcome != engine.Duplicate {
		t.Fatalf("Forget: %+v, %v; want what the key held, Duplicate", early.Info, early.Err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+arch.Table+" WHERE key = $1", key).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("archive rows of the key: %d before the Forget's archive step ran, %d once the Forget returned", before, rows)
	// The commit made after the Forget is acknowledged: Duplicate for the
	// archive window, from Redis and then from the archive.
	ra2WaitGone(t, c, redisKeyOf(prefix, "", key), 10*time.Second)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		in, err := b.Lookup(ctx, key)
		if errors.Is(err, engine.ErrUnavailable) && time.Now().Before(deadline) {
			continue
		}
		if err != nil || in.Outcome != engine.Duplicate || in.Source != engine.SourceArchive || string(in.Result) != "after-forget" ||
			in.CommittedAt < recommitted.Add(-time.Second).UnixNano() {
			t.Fatalf("the commit acknowledged after the Forget, once Redis let it go: %v from %v (result %q), %v; want Duplicate from the archive (archive rows of the key: %d before the Forget's late delete, %d after)",
				in.Outcome, in.Source, in.Result, err, before, rows)
		}
		break
	}
}

// TestRArchAttackMixedArchiveWindows: an engine opens with a longer
// ArchiveWindow than the one the archive recorded (allowed: a window may
// grow), while an engine of the old setting (a rolling restart) still
// runs and holds the drain. The new engine promises its keys for its
// window: a key committed 13 s ago, inside its 20 s, must be Duplicate,
// not New because the old drainer expired the archive at its 8 s.
func TestRArchAttackMixedArchiveWindows(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("mixed-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	oldOpts := redisArchiveOptions(c, prefix, arch)
	oldOpts.ArchiveWindow = 8 * time.Second
	old := ra2Open(t, oldOpts)
	ra2WaitDrainer(t, old, 3*time.Second)
	newOpts := redisArchiveOptions(c, prefix, arch)
	newOpts.ArchiveWindow, newOpts.Logger = 20*time.Second, quiet
	// Refused: every process feeding one archive agrees on its windows
	// (the prefix records them beside the archive), so no drainer
	// expires what another promises.
	e, err := engine.Open(&newOpts)
	if !errors.Is(err, engine.ErrLayout) {
		if err == nil {
			_ = e.Close()
		}
		t.Fatalf("an engine of another archive window on the prefix: %v, want ErrLayout", err)
	}
	// After every engine of the old setting stopped and the binding was
	// deleted, the new window holds.
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, prefix+"\x00\xffarchive").Err(); err != nil {
		t.Fatal(err)
	}
	e = ra2Open(t, newOpts)
	keys := keysOf("mixed", 50)
	outs := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, outs); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	waitFromArchive(t, e, keys, 20*time.Second)
	time.Sleep(time.Until(committed.Add(13 * time.Second)))
	infos := make([]engine.KeyInfo, len(keys))
	if err := e.LookupBatch(ctx, keys, infos); err != nil {
		t.Fatal(err)
	}
	for i, in := range infos {
		if in.Outcome != engine.Duplicate {
			t.Fatalf("key %d committed %v ago, inside this engine's archive window %v: %v from %v (the drainer of window %v is %v)",
				i, time.Since(committed).Round(time.Millisecond), newOpts.ArchiveWindow, in.Outcome, in.Source, oldOpts.ArchiveWindow, old.Stats().Archive.Drainer)
		}
	}
}

// TestRArchAttackReplacedArchive: an engine opens on a prefix whose
// commits went to one archive table, with another (empty) table: a new
// table, a restored older one, a configuration mistake. The prefix's keys
// that left Redis are in the first archive only: the engine must be
// refused (ErrLayout, as the embedded store refuses a lost or replaced
// archive) or fail its calls, never answer New for them.
func TestRArchAttackReplacedArchive(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("replaced-%d:", time.Now().UnixNano())
	first, second := redisArchive(t), redisArchive(t)
	for first.Table == second.Table {
		second = redisArchive(t)
	}
	ctx := context.Background()
	a := ra2Open(t, redisArchiveOptions(c, prefix, first))
	keys := keysOf("replaced", 50)
	outs := make([]engine.Outcome, len(keys))
	if err := a.MarkBatch(ctx, keys, nil, outs); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	ra2WaitDrained(t, a, 5*time.Second)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	o := redisArchiveOptions(c, prefix, second)
	o.Logger = quiet
	b, err := engine.Open(&o)
	if !errors.Is(err, engine.ErrLayout) {
		if err == nil {
			_ = b.Close()
		}
		t.Fatalf("an engine given another archive table on the prefix (keys committed %v ago are in the first only): %v, want ErrLayout",
			time.Since(committed).Round(time.Millisecond), err)
	}
}

// TestRArchAttackConcurrentClaimsOfArchived: two engines claim the same
// archived keys (Redis let them go) at once, round after round. Every
// claim of every key must be Duplicate: the archive holds it. (A claim
// that finds another engine's short-lived claim in Redis, taken to ask
// the archive and given back, must not answer InFlight: nobody processes
// the key.)
func TestRArchAttackConcurrentClaimsOfArchived(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("racing-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	engines := []*engine.Engine{ra2Open(t, redisArchiveOptions(c, prefix, arch)), ra2Open(t, redisArchiveOptions(c, prefix, arch))}
	keys := keysOf("racing", 300)
	outs := make([]engine.Outcome, len(keys))
	if err := engines[0].MarkBatch(ctx, keys, nil, outs); err != nil {
		t.Fatal(err)
	}
	waitFromArchive(t, engines[1], keys, 20*time.Second)
	var counts [2]map[engine.Outcome]int
	for i := range counts {
		counts[i] = map[engine.Outcome]int{}
	}
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		res := [2][]engine.Claim{make([]engine.Claim, len(keys)), make([]engine.Claim, len(keys))}
		errs := [2]error{}
		for w, e := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[w] = e.ClaimBatch(ctx, keys, nil, res[w])
			}()
		}
		close(start)
		wg.Wait()
		for w := range engines {
			if errs[w] != nil {
				t.Fatalf("round %d engine %d: %v", round, w, errs[w])
			}
			for _, cl := range res[w] {
				counts[w][cl.Outcome]++
			}
		}
	}
	for w := range engines {
		for o, n := range counts[w] {
			if o != engine.Duplicate {
				t.Errorf("engine %d: %d claims of archived keys answered %v (all: %v)", w, n, o, counts[w])
			}
		}
	}
	for _, k := range keys[:20] {
		if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", k)); err != nil || n != 0 {
			t.Fatalf("a claim of %s stayed in Redis (%d, %v)", k, n, err)
		}
	}
}

// TestRArchAttackStatsHeld: Stats().Archive.Held is "the number of
// partitions the archive holds (as of its last pass)". With a minute of
// archive nothing expires in this test, so once partitions are sealed
// every engine's Held is at least the number the drainer sealed.
func TestRArchAttackStatsHeld(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("held-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	a := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	ra2WaitDrainer(t, a, 3*time.Second)
	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	ctx := context.Background()
	for i := range 3 {
		keys := keysOf(fmt.Sprintf("held%d", i), 20)
		if err := a.MarkBatch(ctx, keys, nil, make([]engine.Outcome, len(keys))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	ra2WaitDrained(t, a, 5*time.Second)
	sa, sb := *a.Stats().Archive, *b.Stats().Archive
	if sa.Partitions < 3 {
		t.Fatalf("the drainer sealed %d partitions in 4 s: %+v", sa.Partitions, sa)
	}
	// Each engine counts what it loaded at its last pass (every 500 ms):
	// within a few passes both hold what the drainer had sealed.
	for deadline := time.Now().Add(3 * time.Second); sa.Held < sa.Partitions || sb.Held < sa.Partitions; {
		if time.Now().After(deadline) {
			t.Fatalf("Held %d (drainer) and %d (other), fewer than the %d partitions the drainer sealed (%+v, %+v)", sa.Held, sb.Held, sa.Partitions, sa, sb)
		}
		time.Sleep(100 * time.Millisecond)
		sa.Held, sb.Held = a.Stats().Archive.Held, b.Stats().Archive.Held
	}
}

// TestRArchForgetAnswersWhatItHeld: behind Redis's archive log, a Forget
// of a key only the archive holds (Redis let it go) answers what the key
// held, also when the drain applies its removal
// before the Forget's own read of the archive could see the key. The
// archive read of the forgetting engine waits (a slow connection) until
// the other engine's drain removed the key from the archive, or 2 s: a
// read made after Redis appended the removal would find nothing and
// answer New for a key that was Duplicate.
func TestRArchForgetAnswersWhatItHeld(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("forgetread-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	key := []byte("held")
	ctx := context.Background()
	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	ra2WaitDrainer(t, b, 10*time.Second) // b drains; a only forgets
	gate := newGatedDB(arch.DB.(*pgxpool.Pool), key)
	a := ra2Open(t, redisArchiveOptions(c, prefix, postgres.Archive{DB: gate, Table: arch.Table}))
	if x, err := a.MarkIfAbsent(ctx, key); err != nil || x != engine.New {
		t.Fatalf("commit: %v, %v", x, err)
	}
	pool := arch.DB.(*pgxpool.Pool)
	rows := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+arch.Table+" WHERE key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ra2WaitDrained(t, b, 5*time.Second)
	if n := rows(); n == 0 {
		t.Fatal("the commit never reached the archive: nothing to forget there")
	}
	// Only the archive holds it now: Redis's answer to the Forget is
	// Absent, and what the key held must come from the archive.
	ra2WaitGone(t, c, redisKeyOf(prefix, "", key), 10*time.Second)
	gate.armed.Store(true)
	forgot := forgetAtGate(t, a, key, gate)
	waited := time.Now()
	for deadline := time.Now().Add(2 * time.Second); rows() > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	t.Logf("the archive held %d rows of the key after %v, when its read went on", rows(), time.Since(waited).Round(time.Millisecond))
	close(gate.release)
	var r forgetResult
	select {
	case r = <-forgot:
	case <-time.After(35 * time.Second):
		t.Fatal("Forget did not return")
	}
	if r.Err != nil || r.Info.Outcome != engine.Duplicate {
		t.Fatalf("Forget of a committed key: %+v, %v; want what it held, Duplicate", r.Info, r.Err)
	}
	if n := rows(); n != 0 {
		t.Fatalf("the archive still holds %d rows of the forgotten key", n)
	}
	if in, err := b.Lookup(ctx, key); err != nil || in.Outcome != engine.New {
		t.Fatalf("Lookup after the Forget: %v, %v; want New", in.Outcome, err)
	}
}
