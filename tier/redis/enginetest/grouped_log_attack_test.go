package enginetest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Attacks on the grouped archive log: one stream entry {c: packed
// commits} per call of the commit script (a chunk of up to 256 keys).

// gLogEntry is one stream entry of the archive log as the test reads it
// raw: the Redis keys of its commits (grouped or single), or a removal.
type gLogEntry struct {
	id      string
	commits []string
	forget  string
}

// gReadLog reads the whole archive log of prefix (XRANGE), decoding
// grouped entries itself.
func gReadLog(t *testing.T, c *goredis.Client, prefix string) []gLogEntry {
	t.Helper()
	msgs, err := c.XRange(context.Background(), prefix+"\x00\x00", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []gLogEntry
	for _, m := range msgs {
		e := gLogEntry{id: m.ID}
		if g, ok := m.Values["c"].(string); ok {
			for g != "" {
				if len(g) < 4 {
					t.Fatalf("entry %s: truncated group", m.ID)
				}
				n := int(binary.BigEndian.Uint32([]byte(g[:4])))
				k := g[4 : 4+n]
				g = g[4+n:]
				n = int(binary.BigEndian.Uint32([]byte(g[:4])))
				v := g[4 : 4+n]
				g = g[4+n:]
				if !strings.HasPrefix(v, "D") {
					t.Fatalf("entry %s: commit of %q is %q", m.ID, k, v)
				}
				e.commits = append(e.commits, k)
			}
		} else if f, _ := m.Values["f"].(string); f == "1" {
			e.forget, _ = m.Values["k"].(string)
		} else {
			k, _ := m.Values["k"].(string)
			e.commits = append(e.commits, k)
		}
		out = append(out, e)
	}
	return out
}

// gCommitCounts counts each Redis key's commits in the log.
func gCommitCounts(entries []gLogEntry) map[string]int {
	n := map[string]int{}
	for _, e := range entries {
		for _, k := range e.commits {
			n[k]++
		}
	}
	return n
}

// gFreeDrain deletes the stalled drain lease (ra2StallDrain).
func gFreeDrain(t *testing.T, c *goredis.Client, lease string) {
	t.Helper()
	if err := c.Del(context.Background(), lease).Err(); err != nil {
		t.Fatal(err)
	}
}

// gMarkNew marks keys on e and wants each New.
func gMarkNew(t *testing.T, e *engine.Engine, keys [][]byte) {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("mark of fresh key %s: %v", keys[i], o)
		}
	}
}

// TestGroupedLogChunksAndSmallReads: with the drain stalled, a MarkBatch
// of 700 keys (three chunks) appends three grouped entries holding every
// key once; ReadLog with n of 1 and 2 returns whole positions (every
// commit of each, none twice, none skipped, across reads after the last
// position read). The
// drain then applies the log, and past Redis's window every key is
// Duplicate from the archive, the marks again answering Duplicate.
func TestGroupedLogChunksAndSmallReads(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("gchunk-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	lease := ra2StallDrain(t, c, prefix) // before the engine's first drain pass
	e := ra2Open(t, o)
	keys := keysOf("chunk", 700)
	gMarkNew(t, e, keys)
	log := gReadLog(t, c, prefix)
	if len(log) != 3 {
		t.Fatalf("the log holds %d entries, want 3 (chunks of 256)", len(log))
	}
	counts := gCommitCounts(log)
	for _, k := range keys {
		if n := counts[redisKeyOf(prefix, "", k)]; n != 1 {
			t.Fatalf("key %s committed %d times in the log", k, n)
		}
	}
	// The store's own reads, with small n, over the same prefix and
	// layout.
	s, err := redis.New(ctx, c, &redis.Options{Prefix: prefix, Window: o.Window, ArchiveLog: true, Uncached: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2} {
		seen := map[string]int{}
		var after tier.LogPos
		reads := 0
		for {
			entries, _, err := s.ReadLog(ctx, after, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) == 0 {
				break
			}
			reads++
			pos := map[tier.LogPos]bool{}
			for _, en := range entries {
				if !after.Less(en.Pos) {
					t.Fatalf("n=%d: entry at %v read after %v", n, en.Pos, after)
				}
				pos[en.Pos] = true
				seen[string(en.Record.Key)]++
			}
			if len(pos) > n {
				t.Fatalf("n=%d: a read returned %d positions", n, len(pos))
			}
			after = entries[len(entries)-1].Pos
		}
		for _, k := range keys {
			if seen[string(k)] != 1 {
				t.Fatalf("n=%d: key %s read %d times", n, k, seen[string(k)])
			}
		}
		if want := (3 + n - 1) / n; reads != want {
			t.Fatalf("n=%d: %d reads, want %d", n, reads, want)
		}
	}
	first, _, err := s.ReadLog(ctx, tier.LogPos{}, 1)
	if err != nil || len(first) != 256 {
		t.Fatalf("first position: %d commits, %v", len(first), err)
	}
	gFreeDrain(t, c, lease)
	ra2WaitDrained(t, e, 15*time.Second)
	time.Sleep(o.Window)
	waitFromArchive(t, e, keys, 20*time.Second)
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, x := range out {
		if x != engine.Duplicate {
			t.Fatalf("archived key %d marked again: %v", i, x)
		}
	}
}

// TestGroupedLogNamespacesAndResults: one CommitBatch of claims in three
// namespaces (the default, one with an archive window of its own, one
// with a short window, never archived) with results of every size up to near a chunk's byte bound
// (so Redis cuts the chunks by bytes, not keys), beside claims released
// and given back. Past each window: every committed key of an archived
// namespace is Duplicate from the archive with its exact result; the
// released keys are New.
func TestGroupedLogNamespacesAndResults(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("gns-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.MaxResultSize = engine.MaxResultSize
	// Results of MiBs under -race: the claims outlive their building and
	// their commit's chunks (a 4 s lease lost one of 288 claims on a
	// loaded machine), and the drain, stalled until the log is read, may
	// lag that long behind the window before a claim is refused
	// (ErrUnavailable: a partition keys may have left Redis from is not
	// sealed).
	// The archive windows outlast the whole test (with "long" at 30 s, a
	// slow run's last claims came after its keys had left the archive's
	// window, and answered New, as they should).
	o.Window, o.Lease = 12*time.Second, 8*time.Second
	o.ArchiveWindow = 3 * time.Minute
	o.Namespaces = map[string]engine.NamespaceOptions{"long": {ArchiveWindow: 2 * time.Minute}, "short": {Window: 10 * time.Second}}
	lease := ra2StallDrain(t, c, prefix) // before the engine's first drain pass
	e := ra2Open(t, o)
	def, _ := e.Namespace("")
	long, _ := e.Namespace("long")
	short, _ := e.Namespace("short")

	type item struct {
		ns     *engine.Namespace
		key    []byte
		result []byte
		commit bool
	}
	var items []item
	big := func(i, n int) []byte {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		return b
	}
	for i := 0; i < 12; i++ { // 12 × 3.9 MiB over 16 MiB chunks
		items = append(items, item{def, fmt.Appendf(nil, "bigdef-%d", i), big(i, engine.MaxResultSize-100-i), i%9 != 4})
	}
	for i := 0; i < 300; i++ {
		ns := []*engine.Namespace{def, long, short}[i%3]
		var res []byte
		if i%5 == 0 {
			res = big(i, 1000+i)
		}
		items = append(items, item{ns, fmt.Appendf(nil, "mixed-%d", i), res, i%11 != 7})
	}
	for i := 0; i < 4; i++ {
		items = append(items, item{long, fmt.Appendf(nil, "biglong-%d", i), big(i, engine.MaxResultSize), true})
	}
	// Claims per namespace, one ClaimBatch each (claimed one at a time,
	// 316 round trips under -race on a loaded machine outlasted the
	// first claims' lease before their commit), committed in one
	// CommitBatch.
	claims := make([]engine.Claim, len(items))
	for _, ns := range []*engine.Namespace{def, long, short} {
		var keys [][]byte
		var idx []int
		for i := range items {
			if items[i].ns == ns {
				keys, idx = append(keys, items[i].key), append(idx, i)
			}
		}
		out := make([]engine.Claim, len(keys))
		if err := ns.ClaimBatch(ctx, keys, nil, out); err != nil {
			t.Fatalf("ClaimBatch %q: %v", ns.Name(), err)
		}
		for q, i := range idx {
			if out[q].Outcome != engine.New {
				t.Fatalf("claim %d: %v", i, out[q].Outcome)
			}
			out[q].Result = items[i].result
			claims[i] = out[q]
		}
	}
	var commit []engine.Claim
	var commitIdx []int
	for i := range items {
		if items[i].commit {
			commit = append(commit, claims[i])
			commitIdx = append(commitIdx, i)
		} else if err := e.Release(ctx, claims[i]); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, len(commit))
	if err := e.CommitBatch(ctx, commit, errs); err != nil {
		for q, e := range errs {
			if e != nil {
				it := items[commitIdx[q]]
				t.Logf("commit %d: %s/%s (result %d B): %v", q, it.ns.Name(), it.key, len(it.result), e)
			}
		}
		t.Fatalf("CommitBatch: %v (%v)", err, errors.Join(errs...))
	}
	log := gReadLog(t, c, prefix)
	counts := gCommitCounts(log)
	maxPer := 0
	for _, en := range log {
		maxPer = max(maxPer, len(en.commits))
	}
	for _, i := range commitIdx {
		rk := redisKeyOf(prefix, items[i].ns.Name(), items[i].key)
		want := 1
		if items[i].ns == short {
			want = 0
		}
		if counts[rk] != want {
			t.Fatalf("key %s/%s committed %d times in the log, want %d", items[i].ns.Name(), items[i].key, counts[rk], want)
		}
	}
	t.Logf("%d log entries, at most %d commits in one", len(log), maxPer)
	gFreeDrain(t, c, lease)
	ra2WaitDrained(t, e, 20*time.Second)
	// Past Redis's window every key left Redis.
	time.Sleep(o.Window + time.Second)
	ra2WaitDrained(t, e, 20*time.Second)
	for _, i := range commitIdx {
		it := items[i]
		if it.ns == short {
			continue
		}
		var info engine.KeyInfo
		var err error
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			info, err = it.ns.Lookup(ctx, it.key)
			if err == nil || !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || info.Outcome != engine.Duplicate || info.Source != engine.SourceArchive {
			t.Fatalf("committed key %s/%s: %v from %v, %v; want Duplicate from the archive", it.ns.Name(), it.key, info.Outcome, info.Source, err)
		}
		cl, err := it.ns.Claim(ctx, it.key)
		if err != nil || cl.Outcome != engine.Duplicate || string(cl.Result) != string(it.result) {
			t.Fatalf("claim of committed key %s/%s: %v (result %d bytes, want %d), %v", it.ns.Name(), it.key, cl.Outcome, len(cl.Result), len(it.result), err)
		}
	}
	for i, it := range items {
		if it.commit && it.ns != short {
			continue
		}
		info, err := it.ns.Lookup(ctx, it.key)
		if err != nil || info.Outcome != engine.New {
			t.Fatalf("released or never-archived key %d %s/%s: %v from %v, %v; want New", i, it.ns.Name(), it.key, info.Outcome, info.Source, err)
		}
	}
}

// TestGroupedLogForgetSharedEntry: 600 keys marked in one batch share
// three entries; a Forget of some of them (right after the mark, and
// once the log drained) and the re-mark of a few forgotten ones: past
// Redis's window the forgotten keys are New, the re-marked ones and every
// other key of their entries Duplicate from the archive.
func TestGroupedLogForgetSharedEntry(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("gforget-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.Logger = quiet
	e := ra2Open(t, o)
	keys := keysOf("fg", 600)
	// Forgets of keys of the first entry, at once (they wait for the
	// drain to apply the entry).
	gMarkNew(t, e, keys)
	forgotten := map[int]bool{}
	forget := func(i int) {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		info, err := e.Forget(fctx, keys[i])
		if err != nil {
			t.Fatalf("Forget of key %d: %v", i, err)
		}
		if info.Outcome != engine.Duplicate {
			t.Fatalf("Forget of key %d answered %v, want Duplicate", i, info.Outcome)
		}
		forgotten[i] = true
	}
	for i := 0; i < 256; i += 37 {
		forget(i)
	}
	ra2WaitDrained(t, e, 15*time.Second)
	// After the drain applied them: Forgets of keys of the second and
	// third entries.
	for i := 260; i < 600; i += 41 {
		forget(i)
	}
	// Two forgotten keys marked again: New, a later entry of their own.
	remarked := [][]byte{keys[37], keys[260]}
	gMarkNew(t, e, remarked)
	delete(forgotten, 37)
	delete(forgotten, 260)
	ra2WaitDrained(t, e, 15*time.Second)
	time.Sleep(o.Window + time.Second)
	var kept [][]byte
	for i, k := range keys {
		if !forgotten[i] {
			kept = append(kept, k)
		}
	}
	waitFromArchive(t, e, kept, 20*time.Second)
	out := make([]engine.KeyInfo, len(keys))
	if err := e.LookupBatch(ctx, keys, out); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if forgotten[i] && out[i].Outcome != engine.New {
			t.Fatalf("forgotten key %d: %v from %v, want New", i, out[i].Outcome, out[i].Source)
		}
	}
}

// gFailingDB fails the Apply transaction's position update (after its
// inserts ran) while fail > 0: an Apply that dies part way, rolled back.
type gFailingDB struct {
	*pgxpool.Pool
	fail  atomic.Int32
	fails atomic.Int32
}

func (g *gFailingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := g.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &gFailingTx{Tx: tx, db: g}, nil
}

type gFailingTx struct {
	pgx.Tx
	db      *gFailingDB
	inserts int
}

func (x *gFailingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.HasPrefix(sql, "INSERT INTO ") && strings.Contains(sql, "unnest") {
		x.inserts++
	}
	if strings.Contains(sql, "_log SET ms") && x.inserts > 0 && x.db.fail.Load() > 0 {
		x.db.fail.Add(-1)
		x.db.fails.Add(1)
		return pgconn.CommandTag{}, errors.New("injected: the connection died inside Apply")
	}
	return x.Tx.Exec(ctx, sql, args...)
}

// TestGroupedLogApplyFailsPartWay: the drain's Apply of a read of grouped
// entries fails after its inserts (the transaction rolled back) several
// times; then the engine is closed with entries unapplied and reopened.
// Every acknowledged key is Duplicate from the archive once Redis let it
// go, and a retry re-marking keys across the failures never gets New.
func TestGroupedLogApplyFailsPartWay(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("gapply-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	db := &gFailingDB{Pool: arch.DB.(*pgxpool.Pool)}
	o := redisArchiveOptions(c, prefix, postgres.Archive{DB: db, Table: arch.Table})
	o.Logger = quiet
	e := open(t, o)
	db.fail.Store(4)
	var acked [][]byte
	for b := 0; b < 4; b++ {
		keys := keysOf(fmt.Sprintf("ap%d", b), 300+b*97)
		gMarkNew(t, e, keys)
		acked = append(acked, keys...)
		time.Sleep(400 * time.Millisecond)
	}
	for deadline := time.Now().Add(10 * time.Second); db.fails.Load() < 4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d Apply failures injected", db.fails.Load())
		}
	}
	// Closed with the last batch maybe unapplied, reopened (the log in
	// Redis, the archive's position in PostgreSQL).
	more := keysOf("ap-last", 520)
	gMarkNew(t, e, more)
	acked = append(acked, more...)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	db.fail.Store(2)
	e2 := ra2Open(t, o)
	time.Sleep(o.Window + time.Second)
	waitFromArchive(t, e2, acked, 30*time.Second)
	out := make([]engine.Outcome, len(acked))
	if err := e2.MarkBatch(ctx, acked, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, x := range out {
		if x != engine.Duplicate {
			t.Fatalf("acknowledged key %s marked again: %v", acked[i], x)
		}
	}
	t.Logf("%d Apply failures injected, %d keys", db.fails.Load(), len(acked))
}

// TestGroupedLogRedisPauses: batches of 600 keys (three chunks) are
// marked while the Redis server is paused (SIGSTOP) and resumed again and
// again, the client's reads timing out and go-redis resending the commit
// scripts, with the drain stalled meanwhile. Every acknowledged key is in
// the log exactly once (no append lost, none doubled by a resent
// script); a key whose MarkBatch failed is in the log at most once, and
// then followed by its removal (the give-back) or still committed in
// Redis. Once the drain ran and Redis let the keys go, every acknowledged
// key is Duplicate from the archive, and no key whose MarkBatch failed is
// Duplicate from the archive unless Redis held its commit (a give-back
// that never came).
func TestGroupedLogRedisPauses(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.ClientWith(t, &goredis.Options{ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond, MaxRetries: 3})
	admin := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("gpause-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.Logger = quiet
	// Stalled before the engine opens: a drain pass it started would go
	// on reading and trimming the log.
	lease := ra2StallDrain(t, admin, prefix)
	e := ra2Open(t, o)
	var acked, failed [][]byte
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(150+(i*73)%400) * time.Millisecond):
			}
			srv.Pause()
			time.Sleep(time.Duration(200+(i*131)%900) * time.Millisecond)
			srv.Resume()
		}
	}()
	deadline := time.Now().Add(4 * time.Second)
	for b := 0; time.Now().Before(deadline); b++ {
		keys := keysOf(fmt.Sprintf("p%d", b), 600)
		out := make([]engine.Outcome, len(keys))
		bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := e.MarkBatch(bctx, keys, nil, out)
		cancel()
		if err != nil {
			failed = append(failed, keys...)
			continue
		}
		for i, x := range out {
			if x != engine.New {
				t.Fatalf("fresh key %s: %v", keys[i], x)
			}
		}
		acked = append(acked, keys...)
	}
	close(stop)
	wg.Wait()
	srv.Resume()
	// Let late copies of scripts and background give-backs land.
	time.Sleep(1500 * time.Millisecond)
	t.Logf("%d keys acknowledged, %d in failed batches", len(acked), len(failed))
	if len(acked) == 0 {
		t.Fatal("no batch was acknowledged")
	}
	log := gReadLog(t, admin, prefix)
	counts := gCommitCounts(log)
	removed := map[string]bool{}
	for _, en := range log {
		if en.forget != "" {
			removed[en.forget] = true
		}
	}
	for _, k := range acked {
		rk := redisKeyOf(prefix, "", k)
		if n := counts[rk]; n != 1 {
			t.Fatalf("acknowledged key %s is in the log %d times", k, n)
		}
		if removed[rk] {
			t.Fatalf("acknowledged key %s was removed (a give-back) in the log", k)
		}
	}
	heldInRedis := map[string]bool{}
	for _, k := range failed {
		rk := redisKeyOf(prefix, "", k)
		if n := counts[rk]; n > 1 {
			t.Fatalf("key %s of a failed batch is in the log %d times", k, n)
		}
		v, err := admin.Get(ctx, rk).Result()
		if err == nil && strings.HasPrefix(v, "D") {
			heldInRedis[string(k)] = true
		}
	}
	if len(heldInRedis) > 0 {
		t.Logf("%d keys of failed batches still committed in Redis (no give-back reached them)", len(heldInRedis))
	}
	gFreeDrain(t, admin, lease)
	ra2WaitDrained(t, e, 20*time.Second)
	time.Sleep(o.Window + time.Second)
	waitFromArchive(t, e, acked, 30*time.Second)
	if len(failed) > 0 {
		out := make([]engine.KeyInfo, len(failed))
		var err error
		for dl := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if err = e.LookupBatch(ctx, failed, out); err == nil || time.Now().After(dl) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		bad := 0
		for i, in := range out {
			if in.Outcome == engine.Duplicate && in.Source == engine.SourceArchive && !heldInRedis[string(failed[i])] {
				if bad < 5 {
					t.Errorf("key %s of a failed MarkBatch, never committed in Redis after the give-back: Duplicate from the archive", failed[i])
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%d such keys", bad)
		}
	}
}

// TestGroupedLogNonStringKeyInChunk: 300 keys are claimed, one of them
// (in the first chunk) then replaced in Redis by a hash, and the claims
// committed in one CommitBatch. The commit script answers that key Lost
// (pcall) and commits and logs the 299 others of its call: past Redis's
// window those are Duplicate from the archive, and the key whose commit
// failed is not (never acknowledged).
func TestGroupedLogNonStringKeyInChunk(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ghash-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.Logger = quiet
	e := ra2Open(t, o)
	keys := keysOf("hs", 300)
	claims := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	const bad = 100
	rk := redisKeyOf(prefix, "", keys[bad])
	if err := c.Del(ctx, rk).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, rk, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpire(ctx, rk, 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(claims))
	err := e.CommitBatch(ctx, claims, errs)
	t.Logf("CommitBatch: %v; the hash key's error: %v", err, errs[bad])
	for i := range errs {
		if i != bad && errs[i] != nil {
			t.Fatalf("commit of key %d: %v", i, errs[i])
		}
	}
	if errs[bad] == nil && err == nil {
		t.Fatal("the commit of a key holding a hash succeeded")
	}
	ra2WaitDrained(t, e, 15*time.Second)
	time.Sleep(o.Window + time.Second)
	good := append(append([][]byte{}, keys[:bad]...), keys[bad+1:]...)
	waitFromArchive(t, e, good, 20*time.Second)
	info, err := e.Lookup(ctx, keys[bad])
	if err != nil || info.Outcome != engine.New {
		t.Fatalf("the key whose commit failed: %v from %v, %v; want New", info.Outcome, info.Source, err)
	}
}
