package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

func pool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

// store opens a Store over its own table, dropped after the test.
func store(t *testing.T, p *pgxpool.Pool, o postgres.Options) *postgres.Store {
	t.Helper()
	if o.Table == "" {
		o.Table = fmt.Sprintf("t_%d", time.Now().UnixNano())
	}
	if o.Window == 0 {
		o.Window = time.Hour
	}
	s, err := postgres.New(context.Background(), p, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+o.Table) })
	return s
}

func tok(i byte) tier.Token { return tier.Token{i, 1, 2, 3} }

func req(key string, t tier.Token) tier.Request { return tier.Request{Key: []byte(key), Token: t} }

func claim(t *testing.T, s *postgres.Store, r tier.Request, lease time.Duration) tier.Answer {
	t.Helper()
	out := make([]tier.Answer, 1)
	if err := s.Claim(context.Background(), []tier.Request{r}, lease, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func commit(t *testing.T, s *postgres.Store, r tier.Request) tier.Status {
	t.Helper()
	out := make([]tier.Status, 1)
	if err := s.Commit(context.Background(), 0, []tier.Request{r}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func release(t *testing.T, s *postgres.Store, r tier.Request, giveBack bool) tier.Status {
	t.Helper()
	out := make([]tier.Status, 1)
	if err := s.Release(context.Background(), 0, []tier.Request{r}, giveBack, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestClaimCommitFencing walks one key through the protocol: a claim
// excludes other tokens, only its token commits, a retried claim or commit
// of the same token succeeds, and a commit answers Committed with its
// token and digest to everyone after.
func TestClaimCommitFencing(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	a, b := req("k", tok(1)), req("k", tok(2))
	if r := claim(t, s, a, time.Minute); r.Status != tier.Acquired || r.Partition != -1 {
		t.Fatalf("first claim = %+v", r)
	}
	if r := claim(t, s, b, time.Minute); r.Status != tier.Held {
		t.Fatalf("second token = %+v, want held", r)
	}
	if st := commit(t, s, b); st != tier.Lost {
		t.Fatalf("commit by a token that does not hold the key = %v", st)
	}
	if st := release(t, s, b, false); st != tier.Lost {
		t.Fatalf("release by a token that does not hold the key = %v", st)
	}
	if r := claim(t, s, a, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("retried claim of the same token = %+v", r)
	}
	a.Digest = tier.Digest{9}
	if st := commit(t, s, a); st != tier.OK {
		t.Fatalf("commit = %v", st)
	}
	if st := commit(t, s, a); st != tier.OK {
		t.Fatalf("retried commit = %v", st)
	}
	if r := claim(t, s, req("k", tok(3)), time.Minute); r.Status != tier.Committed || r.Token != tok(1) || r.Digest != (tier.Digest{9}) {
		t.Fatalf("claim after the commit = %+v", r)
	}
	if st := release(t, s, a, false); st != tier.Lost {
		t.Fatalf("release after the commit = %v", st)
	}
	if r := claim(t, s, tier.Request{NS: "other", Key: []byte("k"), Token: tok(4)}, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("the same key in another namespace = %+v", r)
	}
}

// TestLeaseEndsAndIsTakenOver: a claim whose lease ended loses its key to
// the next claim, and its commit is Lost.
func TestLeaseEndsAndIsTakenOver(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	a, b := req("k", tok(1)), req("k", tok(2))
	claim(t, s, a, 50*time.Millisecond)
	time.Sleep(120 * time.Millisecond)
	if st := commit(t, s, a); st != tier.Lost {
		t.Fatalf("commit after the lease = %v", st)
	}
	if r := claim(t, s, b, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("claim after the lease = %+v", r)
	}
	if st := commit(t, s, b); st != tier.OK {
		t.Fatalf("commit of the new owner = %v", st)
	}
}

// TestReleaseAndGiveBack: a release frees the key; a give-back also undoes
// a commit its token made (one the caller was told had failed).
func TestReleaseAndGiveBack(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	a := req("k", tok(1))
	claim(t, s, a, time.Minute)
	if st := release(t, s, a, false); st != tier.OK {
		t.Fatalf("release = %v", st)
	}
	if r := claim(t, s, req("k", tok(2)), time.Minute); r.Status != tier.Acquired {
		t.Fatalf("claim after release = %+v", r)
	}
	c := req("c", tok(3))
	claim(t, s, c, time.Minute)
	commit(t, s, c)
	if st := release(t, s, c, true); st != tier.OK {
		t.Fatalf("give-back of a commit = %v", st)
	}
	if r := claim(t, s, req("c", tok(4)), time.Minute); r.Status != tier.Acquired {
		t.Fatalf("claim after the give-back = %+v", r)
	}
}

// TestAttemptsPoison: with MaxAttempts, releases and lease takeovers are
// counted in the table, across tokens, and the key answers Poisoned at
// the limit; a give-back counts nothing.
func TestAttemptsPoison(t *testing.T) {
	s := store(t, pool(t), postgres.Options{MaxAttempts: 3})
	k := func(i byte) tier.Request { return req("k", tok(i)) }
	claim(t, s, k(1), time.Minute)
	release(t, s, k(1), true) // a give-back: not an attempt
	if r := claim(t, s, k(2), time.Minute); r.Status != tier.Acquired || r.Attempts != 0 {
		t.Fatalf("after a give-back = %+v", r)
	}
	release(t, s, k(2), false) // attempt 1
	if r := claim(t, s, k(3), 50*time.Millisecond); r.Status != tier.Acquired || r.Attempts != 1 {
		t.Fatalf("after one release = %+v", r)
	}
	time.Sleep(120 * time.Millisecond) // attempt 2: the lease ends
	r := claim(t, s, k(4), time.Minute)
	if r.Status != tier.Acquired || r.Attempts != 2 || !r.Expired {
		t.Fatalf("after a lease ended = %+v", r)
	}
	release(t, s, k(4), false) // attempt 3
	if r := claim(t, s, k(5), time.Minute); r.Status != tier.Poisoned || r.Attempts != 3 {
		t.Fatalf("at the limit = %+v", r)
	}
}

// TestConcurrentClaimsOneAcquired: eight goroutines claim the same keys in
// batches with their own tokens: each key is Acquired exactly once.
func TestConcurrentClaimsOneAcquired(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	const n, workers = 2000, 8
	var mu sync.Mutex
	got := make([]int, n)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := 0; lo < n; lo += 250 {
				reqs := make([]tier.Request, 0, 250)
				for i := lo; i < lo+250; i++ {
					// Each worker walks the keys in its own order.
					j := (i*7 + w*131) % n
					reqs = append(reqs, tier.Request{Key: fmt.Appendf(nil, "k%d", j), Token: tok(byte(w + 1))})
				}
				out := make([]tier.Answer, len(reqs))
				if err := s.Claim(context.Background(), reqs, time.Minute, out); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, a := range out {
					if a.Status == tier.Acquired {
						var j int
						fmt.Sscanf(string(reqs[i].Key), "k%d", &j)
						got[j]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for j, c := range got {
		if c != 1 {
			t.Fatalf("key %d acquired %d times", j, c)
		}
	}
}

// TestUnreachableIsUnavailable: a server that does not answer gives
// ErrUnavailable, never an answer.
func TestUnreachableIsUnavailable(t *testing.T) {
	p := pool(t)
	s := store(t, p, postgres.Options{})
	p.Close()
	out := make([]tier.Answer, 1)
	if err := s.Claim(context.Background(), []tier.Request{req("k", tok(1))}, time.Minute, out); !errors.Is(err, postgres.ErrUnavailable) {
		t.Fatalf("claim on a closed pool: %v", err)
	}
	st := make([]tier.Status, 1)
	if err := s.Commit(context.Background(), 0, []tier.Request{req("k", tok(1))}, st); !errors.Is(err, postgres.ErrUnavailable) {
		t.Fatalf("commit on a closed pool: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []postgres.Options{
		{Table: "a;drop", Window: time.Hour},
		{Window: 0},
		{Window: time.Hour, MaxAttempts: -1},
	} {
		if err := o.Validate(); !errors.Is(err, postgres.ErrOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestMarkCommitsInOneStep: a mark takes a free key committed at once,
// with its digest; a key another token holds stays Held, and a committed
// one answers Committed with its committer's token.
func TestMarkCommitsInOneStep(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	claim(t, s, req("held", tok(1)), time.Minute)
	reqs := []tier.Request{
		{Key: []byte("free"), Token: tok(2), Digest: tier.Digest{5}},
		{Key: []byte("held"), Token: tok(2)},
	}
	out := make([]tier.Answer, len(reqs))
	if err := s.Mark(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Status != tier.Acquired || out[1].Status != tier.Held {
		t.Fatalf("mark = %+v", out)
	}
	if r := claim(t, s, req("free", tok(3)), time.Minute); r.Status != tier.Committed || r.Token != tok(2) || r.Digest != (tier.Digest{5}) {
		t.Fatalf("after the mark = %+v", r)
	}
}

// TestContentionIsNotAnError: goroutines claiming random overlapping keys
// while others commit and release theirs make PostgreSQL abort some
// statements as deadlock victims (claims lock rows in key order, commits
// and releases in their join's); the Store runs them again, so no call
// fails, and no key is held by two live claims.
func TestContentionIsNotAnError(t *testing.T) {
	s := store(t, pool(t), postgres.Options{Window: time.Minute})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	deadline := time.Now().Add(2 * time.Second)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for n := 0; time.Now().Before(deadline); n++ {
				seen := map[int]bool{}
				var reqs []tier.Request
				for len(reqs) < 50 {
					k := rng.IntN(200)
					if !seen[k] {
						seen[k] = true
						reqs = append(reqs, tier.Request{Key: fmt.Appendf(nil, "k%03d", k), Token: tier.Token{byte(w), byte(n), byte(n >> 8)}})
					}
				}
				out := make([]tier.Answer, len(reqs))
				if err := s.Claim(ctx, reqs, 20*time.Millisecond, out); err != nil {
					errs <- fmt.Errorf("claim: %w", err)
					return
				}
				var mine []tier.Request
				for i, a := range out {
					if a.Status == tier.Acquired {
						mine = append(mine, reqs[i])
					}
				}
				st := make([]tier.Status, len(mine))
				var err error
				if n%2 == 0 {
					err = s.Commit(ctx, 0, mine, st)
				} else {
					err = s.Release(ctx, 0, mine, false, st)
				}
				if err != nil {
					errs <- fmt.Errorf("commit or release: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestLeaseLongerThanWindow: a claim's row lives at least as long as its
// lease, so a second token cannot take the key while the first lease runs.
func TestLeaseLongerThanWindow(t *testing.T) {
	s := store(t, pool(t), postgres.Options{Window: 100 * time.Millisecond})
	if r := claim(t, s, req("k", tok(1)), 10*time.Second); r.Status != tier.Acquired {
		t.Fatalf("first claim = %+v", r)
	}
	time.Sleep(150 * time.Millisecond)
	if r := claim(t, s, req("k", tok(2)), 10*time.Second); r.Status != tier.Held {
		t.Fatalf("second claim while the first lease runs = %+v, want held", r)
	}
}

// TestDropSweepsExpiredRowsInRanges: Drop returns at once and a background
// sweep deletes exactly the expired rows, one block range per statement,
// over a table of many blocks; the live rows still answer Committed.
func TestDropSweepsExpiredRowsInRanges(t *testing.T) {
	p := pool(t)
	table := fmt.Sprintf("t_%d", time.Now().UnixNano())
	live := store(t, p, postgres.Options{Table: table})
	short := store(t, p, postgres.Options{Table: table, SweepBlocks: 1})
	defer short.Close()
	mark := func(s *postgres.Store, prefix string, n int) []tier.Request {
		reqs := make([]tier.Request, n)
		for i := range reqs {
			reqs[i] = tier.Request{Key: fmt.Appendf(nil, "%s-%06d-%032d", prefix, i, i), Token: tok(1)}
		}
		out := make([]tier.Answer, n)
		if err := s.Mark(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	// Interleaved, so expired and live rows share blocks.
	var keep []tier.Request
	for range 10 {
		mark(short, fmt.Sprintf("gone%d", len(keep)), 300)
		keep = append(keep, mark(live, fmt.Sprintf("keep%d", len(keep)), 300)...)
	}
	var blocks int64
	if err := p.QueryRow(context.Background(), "SELECT pg_relation_size($1) / 8192", table).Scan(&blocks); err != nil {
		t.Fatal(err)
	}
	if blocks < 10 {
		t.Fatalf("the table has %d blocks: too few to show block ranges", blocks)
	}
	if _, err := p.Exec(context.Background(), "UPDATE "+table+" SET expires = expires - 7200000 WHERE substr(key, 2, 4) = 'gone'::bytea"); err != nil {
		t.Fatal(err)
	}
	// Drop must not wait for the sweep: with the table locked the sweep
	// cannot finish, and Drop returns all the same.
	lock, err := p.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unlock := sync.OnceValue(func() error { return lock.Rollback(context.Background()) })
	defer unlock() // on every path: the pool's Close waits for its connection
	if _, err := lock.Exec(context.Background(), "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() { dropped <- short.Drop(0, 0) }()
	select {
	case err := <-dropped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drop waited for the sweep (the table is locked)")
	}
	if at, _, _ := short.LastSweep(); !at.IsZero() {
		t.Fatal("a sweep finished with the table locked")
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	var deleted int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		at, n, err := short.LastSweep()
		if err != nil {
			t.Fatal(err)
		}
		if !at.IsZero() {
			deleted = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sweep finished in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var rows int
	if err := p.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if deleted != 3000 || rows != len(keep) {
		t.Fatalf("the sweep deleted %d rows and left %d; want 3000 deleted, %d left", deleted, rows, len(keep))
	}
	out := make([]tier.Answer, len(keep))
	if err := live.Claim(context.Background(), keep, time.Minute, out); err != nil {
		t.Fatal(err)
	}
	for i, a := range out {
		if a.Status != tier.Committed {
			t.Fatalf("live key %s after the sweep: %v", keep[i].Key, a.Status)
		}
	}
	t.Logf("%d blocks swept one per statement: %d expired rows deleted, %d live kept", blocks, deleted, rows)
}

// TestLayoutRecorded: a table records the window and MaxAttempts it was
// opened with; a Store that disagrees is refused with ErrLayout, one that
// agrees opens, and a new table takes new options.
func TestLayoutRecorded(t *testing.T) {
	p := pool(t)
	table := fmt.Sprintf("t_%d", time.Now().UnixNano())
	store(t, p, postgres.Options{Table: table, Window: time.Hour, MaxAttempts: 3})
	for _, o := range []postgres.Options{
		{Table: table, Window: 2 * time.Hour, MaxAttempts: 3},
		{Table: table, Window: time.Hour},
	} {
		if _, err := postgres.New(context.Background(), p, &o); !errors.Is(err, postgres.ErrLayout) {
			t.Fatalf("window %v, max attempts %d over a table of 1h, 3: %v, want ErrLayout", o.Window, o.MaxAttempts, err)
		}
	}
	if _, err := postgres.New(context.Background(), p, &postgres.Options{Table: table, Window: time.Hour, MaxAttempts: 3}); err != nil {
		t.Fatalf("the same options again: %v", err)
	}
}

// TestLayoutRaceOneWins: processes opening one new table at once with
// different windows: every Store that opens agrees with the one recorded.
func TestLayoutRaceOneWins(t *testing.T) {
	p := pool(t)
	table := fmt.Sprintf("t_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	opened := make([]time.Duration, 8)
	var wg sync.WaitGroup
	for i := range opened {
		wg.Go(func() {
			w := time.Duration(1+i%2) * time.Hour
			if _, err := postgres.New(context.Background(), p, &postgres.Options{Table: table, Window: w}); err == nil {
				opened[i] = w
			} else if !errors.Is(err, postgres.ErrLayout) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var won time.Duration
	for _, w := range opened {
		if w != 0 && won != 0 && w != won {
			t.Fatalf("stores opened with windows %v and %v on one table", won, w)
		}
		if w != 0 {
			won = w
		}
	}
	if won == 0 {
		t.Fatal("no store opened")
	}
}

// TestNamespaceLengthsDoNotCollide: (ns of 256 bytes, "k") and ("", those
// 256 bytes + "k") are two rows; one batch claiming both gets each its own
// answer (a namespace length that wrapped at 256 once made them one).
func TestNamespaceLengthsDoNotCollide(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	x := bytes.Repeat([]byte("a"), 256)
	committed := tier.Request{NS: string(x), Key: []byte("k"), Token: tok(1)}
	claim(t, s, committed, time.Minute)
	if st := commit(t, s, committed); st != tier.OK {
		t.Fatalf("setup commit = %v", st)
	}
	reqs := []tier.Request{
		{NS: "", Key: append(bytes.Clone(x), 'k'), Token: tok(2)},
		{NS: string(x), Key: []byte("k"), Token: tok(2)},
	}
	out := make([]tier.Answer, 2)
	if err := s.Claim(context.Background(), reqs, time.Minute, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Status != tier.Acquired || out[1].Status != tier.Committed {
		t.Fatalf("fresh key %v, key committed by another token %v: want Acquired, Committed", out[0].Status, out[1].Status)
	}
}

// TestLongKeys: keys over MaxStoredKey (up to the engine's 64 KiB) are
// stored as their digest: claimed, committed and found again, and two long
// keys that differ only in their last byte stay two keys.
func TestLongKeys(t *testing.T) {
	s := store(t, pool(t), postgres.Options{})
	a := bytes.Repeat([]byte{'x'}, 64<<10)
	b := append(bytes.Clone(a[:len(a)-1]), 'y')
	edge := bytes.Repeat([]byte{'z'}, postgres.MaxStoredKey)
	for _, k := range [][]byte{a, edge} {
		r := tier.Request{Key: k, Token: tok(1)}
		if got := claim(t, s, r, time.Minute); got.Status != tier.Acquired {
			t.Fatalf("claim of a %d-byte key = %v", len(k), got.Status)
		}
		if st := commit(t, s, r); st != tier.OK {
			t.Fatalf("commit of a %d-byte key = %v", len(k), st)
		}
		if got := claim(t, s, tier.Request{Key: k, Token: tok(2)}, time.Minute); got.Status != tier.Committed {
			t.Fatalf("the %d-byte key again = %v, want Committed", len(k), got.Status)
		}
	}
	if got := claim(t, s, tier.Request{Key: b, Token: tok(2)}, time.Minute); got.Status != tier.Acquired {
		t.Fatalf("a long key differing in its last byte = %v, want Acquired", got.Status)
	}
}

// TestTableOfUnknownFormatRefused: a table without the recorded layout is
// used only when it is empty and has every column: one from an older
// format (a column missing), or holding rows no layout describes, is
// refused with ErrLayout.
func TestTableOfUnknownFormatRefused(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	older := fmt.Sprintf("t_old_%d", time.Now().UnixNano())
	filled := fmt.Sprintf("t_rows_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(ctx, "DROP TABLE IF EXISTS "+older+", "+filled) })
	if _, err := p.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (
		ns bytea NOT NULL, key bytea NOT NULL, state "char" NOT NULL,
		token bytea NOT NULL, lease_until bigint NOT NULL, attempts integer NOT NULL,
		digest bytea, expires bigint NOT NULL, PRIMARY KEY (ns, key))`, older)); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.New(ctx, p, &postgres.Options{Table: older, Window: time.Hour}); !errors.Is(err, postgres.ErrLayout) {
		t.Fatalf("a table missing a column: %v, want ErrLayout", err)
	}
	store(t, p, postgres.Options{Table: filled})
	claim(t, store(t, p, postgres.Options{Table: filled}), req("k", tok(1)), time.Minute)
	if _, err := p.Exec(ctx, "COMMENT ON TABLE "+filled+" IS NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.New(ctx, p, &postgres.Options{Table: filled, Window: time.Hour}); !errors.Is(err, postgres.ErrLayout) {
		t.Fatalf("a table with rows and no layout: %v, want ErrLayout", err)
	}
}

// TestReservedWordTable: a table name that SQL reserves works (it is
// quoted).
func TestReservedWordTable(t *testing.T) {
	p := pool(t)
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), `DROP TABLE IF EXISTS "user"`) })
	s := store(t, p, postgres.Options{Table: "user"})
	if got := claim(t, s, req("k", tok(1)), time.Minute); got.Status != tier.Acquired {
		t.Fatalf("claim in table \"user\" = %v", got.Status)
	}
}

// TestCreateRace: processes that start together create the table
// together (here, eight stores at once, each on its own connection, on
// twenty fresh tables); PostgreSQL's IF NOT EXISTS alone lets the losers
// fail on the catalog (42710, 23505, 42P07), which refused a consumer's
// start. Every store opens.
func TestCreateRace(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	for round := range 20 {
		table := fmt.Sprintf("race_%d_%d", time.Now().UnixNano(), round)
		t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		var wg sync.WaitGroup
		errs := make([]error, 8)
		start := make(chan struct{})
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = postgres.New(ctx, p, &postgres.Options{Table: table, Window: time.Hour})
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: store %d of 8 on a table created together: %v", round, i, err)
			}
		}
	}
}
