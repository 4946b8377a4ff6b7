package enginetest_test

// Adversarial tests of Forget behind a shared tier's archive log (Redis
// with a PostgreSQL archive): engine/lookup.go reads the archive
// (readBeforeForget) before the Redis tier appends the removal, then waits
// for the drain (engine/archive.go lookupArchive). Through the public API,
// with the setup of archive_redis_attack_test.go: a private redis-server
// (redistest), PostgreSQL on the standard port, a 6 s window of 1 s
// partitions in Redis and a minute of archive behind it. Real time.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// rfLookupNew waits (a lagging drain answers ErrUnavailable) until e
// answers Lookup of each key, and fails unless every answer is New.
func rfLookupNew(t *testing.T, e *engine.Engine, what string, keys [][]byte) {
	t.Helper()
	out := make([]engine.KeyInfo, len(keys))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := e.LookupBatch(context.Background(), keys, out)
		if errors.Is(err, engine.ErrUnavailable) && time.Now().Before(deadline) {
			continue
		}
		if err != nil {
			t.Fatalf("%s: LookupBatch: %v", what, err)
		}
		break
	}
	for i, in := range out {
		if in.Outcome != engine.New {
			t.Errorf("%s: key %s is %v from %v (result %q), want New", what, keys[i], in.Outcome, in.Source, in.Result)
		}
	}
}

// rfCommit claims key on e (New wanted) and commits it with result.
func rfCommit(t *testing.T, e *engine.Engine, key []byte, result string) {
	t.Helper()
	ctx := context.Background()
	cl, err := e.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim of %s before committing %q: %v, %v; want New", key, result, cl.Outcome, err)
	}
	cl.Result = []byte(result)
	if err := e.Commit(ctx, cl); err != nil {
		t.Fatalf("commit of %s: %v", key, err)
	}
}

// TestForgetLogArchiveLog: two engines on a Redis prefix with a
// PostgreSQL archive.
//
// A ForgetBatch on one engine of keys that only the archive holds, a key
// Redis holds, a key never committed, keys repeated in the batch, and
// keys held by a claim of this engine and of the other: returns
// ErrInFlight; every other key answers what it held (Duplicate with its
// result, from the archive or the store; New for the never committed);
// each repeat answers as its first occurrence; the held keys answer
// InFlight and their claims still commit. After it, every forgotten key is
// New on both engines and on an engine opened afterwards, and the keys
// not named are untouched.
//
// The Forget's archive read of a repeated key is held up (a slow
// connection) while the other engine drains: it must have been made
// before the removals were appended, or it would find nothing.
//
// Then commits made after the Forget (another engine, another result), a
// second Forget of a key re-committed (answering the second commit), and a
// third commit: once Redis let them go, the archive answers each key's
// last commit, and the key forgotten and never re-committed stays New.
func TestForgetLogArchiveLog(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("rvforget-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	old := keysOf("old", 6)
	b := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	ra2WaitDrainer(t, b, 10*time.Second) // b drains; a forgets
	// a's archive reads naming old[1] wait, once armed, until released: a
	// slow connection, during which b's drain may apply whatever the log
	// holds.
	gate := newGatedDB(arch.DB.(*pgxpool.Pool), old[1])
	a := ra2Open(t, redisArchiveOptions(c, prefix, postgres.Archive{DB: gate, Table: arch.Table}))

	for i, k := range old {
		rfCommit(t, b, k, fmt.Sprintf("old-%d", i))
	}
	// Only the archive holds them now.
	infos := waitFromArchive(t, a, old, 25*time.Second)
	for i, in := range infos {
		if string(in.Result) != fmt.Sprintf("old-%d", i) {
			t.Fatalf("old key %d from the archive: result %q", i, in.Result)
		}
	}
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", old[0])); err != nil || n != 0 {
		t.Fatalf("Redis still holds %s (%d, %v)", old[0], n, err)
	}
	fresh := []byte("fresh")
	rfCommit(t, b, fresh, "fresh-0")
	heldA, err := a.Claim(ctx, []byte("held-a"))
	if err != nil || heldA.Outcome != engine.New {
		t.Fatalf("claim of held-a: %v, %v", heldA.Outcome, err)
	}
	heldB, err := b.Claim(ctx, []byte("held-b"))
	if err != nil || heldB.Outcome != engine.New {
		t.Fatalf("claim of held-b: %v, %v", heldB.Outcome, err)
	}
	// Leases outlast the Forget's slow read (the options' lease is 2 s).
	if err := a.Extend(ctx, &heldA, 5500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := b.Extend(ctx, &heldB, 5500*time.Millisecond); err != nil {
		t.Fatal(err)
	}

	type want struct {
		o      engine.Outcome
		result string
		src    engine.Source
	}
	batch := [][]byte{old[0], old[1], old[1], []byte("never"), fresh, []byte("held-a"), []byte("held-b"), fresh, old[2], old[0]}
	wants := []want{
		{engine.Duplicate, "old-0", engine.SourceArchive}, {engine.Duplicate, "old-1", engine.SourceArchive}, {engine.Duplicate, "old-1", engine.SourceArchive},
		{engine.New, "", 0}, {engine.Duplicate, "fresh-0", engine.SourceStore}, {engine.InFlight, "", 0}, {engine.InFlight, "", 0},
		{engine.Duplicate, "fresh-0", engine.SourceStore}, {engine.Duplicate, "old-2", engine.SourceArchive}, {engine.Duplicate, "old-0", engine.SourceArchive},
	}
	out := make([]engine.KeyInfo, len(batch))
	pool := arch.DB.(*pgxpool.Pool)
	rows := func(k []byte) int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+arch.Table+" WHERE key = $1", k).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if rows(old[1]) == 0 {
		t.Fatalf("the archive holds no row of %s", old[1])
	}
	gate.armed.Store(true)
	forgot := make(chan error, 1)
	go func() { forgot <- a.ForgetBatch(ctx, batch, out) }()
	select {
	case <-gate.entered: // the Forget's archive read of old[1] waits
	case err := <-forgot:
		t.Fatalf("ForgetBatch returned without reading the archive for %s: %v", old[1], err)
	case <-time.After(10 * time.Second):
		t.Fatal("ForgetBatch never reached the archive")
	}
	// Were the removal appended to the log before this read, b's drain
	// would delete the rows meanwhile, and the read would find nothing.
	for deadline := time.Now().Add(2 * time.Second); rows(old[1]) > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	close(gate.release)
	select {
	case err = <-forgot:
	case <-time.After(35 * time.Second):
		t.Fatal("ForgetBatch did not return")
	}
	gate.armed.Store(false)
	if !errors.Is(err, engine.ErrInFlight) {
		t.Fatalf("ForgetBatch with two held keys: %v, want ErrInFlight", err)
	}
	for i, w := range wants {
		in := out[i]
		if in.Outcome != w.o || string(in.Result) != w.result || (w.src != 0 && in.Source != w.src) {
			t.Errorf("Forget of %s (position %d): %v from %v, result %q; want %v from %v, result %q", batch[i], i, in.Outcome, in.Source, in.Result, w.o, w.src, w.result)
		}
	}
	forgotten := [][]byte{old[0], old[1], old[2], fresh, []byte("never")}
	rfLookupNew(t, a, "after the Forget, on the forgetting engine", forgotten)
	rfLookupNew(t, b, "after the Forget, on the other engine", forgotten)
	c2 := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	rfLookupNew(t, c2, "after the Forget, on an engine opened after it", forgotten)
	rest := waitFromArchive(t, c2, old[3:], 5*time.Second) // not named: untouched
	for i, in := range rest {
		if string(in.Result) != fmt.Sprintf("old-%d", i+3) {
			t.Errorf("old key %d, not forgotten: result %q", i+3, in.Result)
		}
	}
	// The claims the Forget left alone commit.
	heldA.Result, heldB.Result = []byte("a"), []byte("b")
	if err := a.Commit(ctx, heldA); err != nil {
		t.Errorf("commit of held-a after the Forget: %v", err)
	}
	if err := b.Commit(ctx, heldB); err != nil {
		t.Errorf("commit of held-b after the Forget: %v", err)
	}

	// Commits made after the Forget, on the other engine.
	for _, k := range [][]byte{old[0], old[1], fresh} {
		rfCommit(t, b, k, "second-"+string(k))
	}
	// A second Forget of a re-committed key answers the second commit.
	two := make([]engine.KeyInfo, 2)
	if err := a.ForgetBatch(ctx, [][]byte{old[0], old[0]}, two); err != nil {
		t.Fatalf("second ForgetBatch: %v", err)
	}
	for i, in := range two {
		if in.Outcome != engine.Duplicate || string(in.Result) != "second-"+string(old[0]) {
			t.Errorf("second Forget of %s (occurrence %d): %v from %v, result %q; want Duplicate %q", old[0], i, in.Outcome, in.Source, in.Result, "second-"+string(old[0]))
		}
	}
	rfLookupNew(t, b, "after the second Forget", [][]byte{old[0]})
	rfCommit(t, b, old[0], "third")
	last := map[string]string{string(old[0]): "third", string(old[1]): "second-" + string(old[1]), string(fresh): "second-fresh", "held-a": "a", "held-b": "b"}
	keys := [][]byte{old[0], old[1], fresh, []byte("held-a"), []byte("held-b")}
	for _, k := range keys {
		ra2WaitGone(t, c, redisKeyOf(prefix, "", k), 15*time.Second)
	}
	d := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	for i, in := range waitFromArchive(t, d, keys, 15*time.Second) {
		if string(in.Result) != last[string(keys[i])] {
			t.Errorf("key %s from the archive once Redis let it go: result %q, want its last commit's %q", keys[i], in.Result, last[string(keys[i])])
		}
	}
	rfLookupNew(t, d, "forgotten and never re-committed", [][]byte{old[2], []byte("never")})
}

// TestForgetLogLaggingDrain: the drain lags (its lease is held by a
// drainer that died), and Redis let a committed key go, so the commit is
// only in the archive log, not yet in the archive. Lookup refuses to
// answer (ErrUnavailable, never New). A Forget then, whose drain resumes
// while it waits: Forget's out is "what the key held before" — the key
// held a commit inside the archive window, so the answer must be
// Duplicate (with its result), or the call must fail; it must never be
// New, "nothing to forget". After it the key is New.
func TestForgetLogLaggingDrain(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("rvlag-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	lease := ra2StallDrain(t, c, prefix)
	a := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	keys := [][]byte{[]byte("lagged-1"), []byte("lagged-2")}
	for i, k := range keys {
		rfCommit(t, a, k, fmt.Sprintf("kept-%d", i))
	}
	ra2WaitGone(t, c, redisKeyOf(prefix, "", keys[1]), 15*time.Second)
	if st := a.Stats().Archive; st.Drainer || st.LogEntries == 0 {
		t.Fatalf("the drain should lag: %+v", *st)
	}
	if in, err := a.Lookup(ctx, keys[0]); err == nil && in.Outcome != engine.Duplicate {
		t.Fatalf("Lookup of a commit the log holds: %v from %v; want Duplicate or ErrUnavailable", in.Outcome, in.Source)
	}
	type result struct {
		out []engine.KeyInfo
		err error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		fctx, cancel := context.WithTimeout(ctx, 25*time.Second)
		defer cancel()
		out := make([]engine.KeyInfo, len(keys))
		err := a.ForgetBatch(fctx, keys, out)
		done <- result{out, err}
	}()
	time.Sleep(1500 * time.Millisecond) // the Forget read the archive, appended its removals, and waits
	if err := c.Del(ctx, lease).Err(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("Forget did not return")
	}
	t.Logf("Forget returned after %v (the lease was freed after 1.5 s): %v", time.Since(started).Round(time.Millisecond), r.err)
	switch {
	case errors.Is(r.err, engine.ErrUnavailable):
		t.Logf("Forget failed while the drain lagged: %v (allowed: it answered nothing)", r.err)
	case r.err != nil:
		t.Fatalf("Forget: %v", r.err)
	default:
		for i, in := range r.out {
			if in.Outcome != engine.Duplicate || string(in.Result) != fmt.Sprintf("kept-%d", i) {
				t.Errorf("Forget of %s, committed inside the archive window (its commit still in the log): %v from %v, result %q; want Duplicate %q (what it held)",
					keys[i], in.Outcome, in.Source, in.Result, fmt.Sprintf("kept-%d", i))
			}
		}
	}
	if r.err == nil {
		rfLookupNew(t, a, "after the Forget", keys)
	}
}
