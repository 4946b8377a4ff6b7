package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// redisArchive is a fresh PostgreSQL archive table for a test.
func redisArchive(t *testing.T) postgres.Archive {
	p := postgresPool(t)
	table := fmt.Sprintf("engine_rarch_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
			_, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
		}
	})
	return postgres.Archive{DB: p, Table: table}
}

// redisArchiveOptions: a 6 s window of 1 s partitions in Redis, a minute
// of archive behind it.
func redisArchiveOptions(c goredis.UniversalClient, prefix string, a tier.ArchiveBackend) engine.Options {
	return engine.Options{
		Tiers: engine.Default, Backend: redisBackend(c, prefix), Window: 6 * time.Second, Partition: time.Second,
		Lease: 2 * time.Second, NoSharedCache: true, ExpectedKeys: 1000, Archive: a, ArchiveWindow: time.Minute,
	}
}

func keysOf(prefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%04d", prefix, i)
	}
	return keys
}

// waitFromArchive looks keys up on e (an engine or a namespace) until each answers Duplicate from
// the archive (the shared tier let them go, the archive holds them).
func waitFromArchive(t *testing.T, e interface {
	LookupBatch(context.Context, [][]byte, []engine.KeyInfo) error
}, keys [][]byte, within time.Duration) []engine.KeyInfo {
	t.Helper()
	out := make([]engine.KeyInfo, len(keys))
	deadline := time.Now().Add(within)
	for {
		err := e.LookupBatch(context.Background(), keys, out)
		done := err == nil
		for i := range out {
			if err == nil && out[i].Outcome != engine.Duplicate {
				t.Fatalf("key %s: %v from %v while waiting for the archive (want Duplicate throughout)", keys[i], out[i].Outcome, out[i].Source)
			}
			done = done && out[i].Source == engine.SourceArchive
		}
		if done {
			return out
		}
		if err != nil && !errors.Is(err, engine.ErrUnavailable) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys not answered by the archive within %v (last error %v)", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestArchiveBehindRedis: two engines share a Redis prefix and a
// PostgreSQL archive. Keys one commits stay Duplicate for both after
// Redis let them go (with their result and commit time), the claims that
// found them in the archive are given back, new keys stay New, a Forget
// on one reaches the archive for the other, and the log drains to empty.
func TestArchiveBehindRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("arch-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	a := open(t, redisArchiveOptions(c, prefix, arch))
	b := open(t, redisArchiveOptions(c, prefix, arch))
	ctx := context.Background()

	keys := keysOf("old", 300)
	claims := make([]engine.Claim, len(keys))
	if err := a.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for i := range claims {
		if claims[i].Outcome != engine.New {
			t.Fatalf("key %d: %v", i, claims[i].Outcome)
		}
		if i%3 == 0 {
			claims[i].Result = fmt.Appendf(nil, "result-%d", i)
		}
	}
	committed := time.Now().UnixNano()
	if err := a.CommitBatch(ctx, claims, nil); err != nil {
		t.Fatal(err)
	}
	// Past Redis's window, from the archive, on the other engine.
	infos := waitFromArchive(t, b, keys, 20*time.Second)
	for i, in := range infos {
		if in.CommittedAt < committed-int64(time.Second) || in.CommittedAt > committed+int64(time.Second) {
			t.Fatalf("key %d committed at %v, answered %v", i, time.Unix(0, committed), time.Unix(0, in.CommittedAt))
		}
	}
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", keys[0])); err != nil || n != 0 {
		t.Fatalf("Redis still holds the key (%d, %v): the test did not reach past the window", n, err)
	}
	out := make([]engine.Claim, len(keys))
	if err := b.ClaimBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		want := ""
		if i%3 == 0 {
			want = fmt.Sprintf("result-%d", i)
		}
		if out[i].Outcome != engine.Duplicate || string(out[i].Result) != want {
			t.Fatalf("key %d: %v %q, want Duplicate %q", i, out[i].Outcome, out[i].Result, want)
		}
	}
	// The claims the archive answered were given back: Redis holds none.
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", keys[1])); err != nil || n != 0 {
		t.Fatalf("a claim the archive answered is still in Redis (%d, %v)", n, err)
	}
	marks := make([]engine.Outcome, len(keys))
	if err := a.MarkBatch(ctx, keys, nil, marks); err != nil {
		t.Fatal(err)
	}
	for i, o := range marks {
		if o != engine.Duplicate {
			t.Fatalf("mark of archived key %d: %v", i, o)
		}
	}
	fresh := keysOf("new", 300)
	if err := a.MarkBatch(ctx, fresh, nil, marks); err != nil {
		t.Fatal(err)
	}
	for i, o := range marks {
		if o != engine.New {
			t.Fatalf("new key %d: %v", i, o)
		}
	}
	// Forget on b reaches the archive; a finds the key New.
	info, err := b.Forget(ctx, keys[3])
	if err != nil || info.Outcome != engine.Duplicate || info.Source != engine.SourceArchive {
		t.Fatalf("Forget: %+v, %v", info, err)
	}
	cl, err := a.Claim(ctx, keys[3])
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after Forget: %v, %v", cl.Outcome, err)
	}
	if err := a.Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	// The log drains to empty, and one engine holds the drain.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sa, sb := a.Stats().Archive, b.Stats().Archive
		if sa.LogEntries == 0 && sb.LogEntries == 0 && (sa.Drainer != sb.Drainer) {
			if sa.Keys+sb.Keys < uint64(2*len(keys)) || sa.Partitions+sb.Partitions == 0 {
				t.Fatalf("stats: %+v / %+v", *sa, *sb)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log not drained: %+v / %+v", *sa, *sb)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// redisKeyOf is the Redis key of (ns, key) under prefix (redis.Store.Key).
func redisKeyOf(prefix, ns string, key []byte) string {
	return prefix + "\x00" + string([]byte{byte(len(ns))}) + ns + string(key)
}

// TestArchiveBehindRedisRefused: what an archive behind a shared tier
// cannot keep is refused at Open, each with ErrOptions (or ErrLayout).
func TestArchiveBehindRedisRefused(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	arch := redisArchive(t)
	prefix := fmt.Sprintf("refuse-%d:", time.Now().UnixNano())
	for name, mod := range map[string]func(*engine.Options){
		"files archive": func(o *engine.Options) { o.Archive = pebble.ArchiveDir{Dir: t.TempDir()} },
		"FailOpen":      func(o *engine.Options) { o.FailOpen = true },
		"short window":  func(o *engine.Options) { o.Window = 1500 * time.Millisecond },
		"window under skew": func(o *engine.Options) {
			o.Window, o.Partition, o.Lease = 4*time.Second, time.Second, 500*time.Millisecond
		},
		"postgres hot tier": func(o *engine.Options) { o.Backend = pgBackend(postgresPool(t), "rarch_hot") },
	} {
		o := redisArchiveOptions(c, prefix, arch)
		mod(&o)
		if e, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			if e != nil {
				e.Close()
			}
			t.Errorf("%s: %v, want ErrOptions", name, err)
		}
	}
	cl := redistest.StartCluster(t)
	o := redisArchiveOptions(cl.Client(t), prefix, arch)
	if e, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
		if e != nil {
			e.Close()
		}
		t.Errorf("cluster: %v, want ErrOptions", err)
	}
	// A process without the archive on a prefix that logs would commit
	// without appending: refused, as the other way round.
	e := open(t, redisArchiveOptions(c, prefix, arch))
	plain := redisArchiveOptions(c, prefix, nil)
	plain.Archive, plain.ArchiveWindow = nil, 0
	if e2, err := engine.Open(&plain); !errors.Is(err, engine.ErrLayout) {
		if e2 != nil {
			e2.Close()
		}
		t.Errorf("engine without archive on a logging prefix: %v, want ErrLayout", err)
	}
	_ = e
}

// TestArchiveBehindRedisLags: while the drain is stopped (inside its
// Apply), a key Redis has let go is never New: its claim, mark and Lookup
// fail with ErrUnavailable, and give their Redis claims back; a Forget
// of a key still only in the log waits for the drain (ErrUnavailable at
// its deadline). Once the drain goes on, the key is Duplicate from the
// archive, the forgotten key New, and past the archive window every key
// is New.
func TestArchiveBehindRedisLags(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("lag-%d:", time.Now().UnixNano())
	o := redisArchiveOptions(c, prefix, redisArchive(t))
	o.ArchiveWindow = 12 * time.Second
	o.Logger = quiet
	e := open(t, o)
	ctx := context.Background()
	stop := make(chan struct{})
	stopped := make(chan struct{}, 1)
	var once bool
	enginetest.SetInArchive(func(s string) {
		if s == "put" && !once {
			once = true
			stopped <- struct{}{}
			<-stop
		}
	})
	t.Cleanup(func() { enginetest.SetInArchive(nil) })
	keys := keysOf("lag", 50)
	marks := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, marks); err != nil {
		t.Fatal(err)
	}
	<-stopped // the drain holds the commits in the log
	committed := time.Now()
	time.Sleep(o.Window + time.Second)
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", keys[0])); err != nil || n != 0 {
		t.Fatalf("Redis still holds the key (%d, %v)", n, err)
	}
	if _, err := e.Claim(ctx, keys[0]); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("claim of a key only in the log: %v, want ErrUnavailable", err)
	}
	if n, err := redisHeld(ctx, c, redisKeyOf(prefix, "", keys[0])); err != nil || n != 0 {
		t.Fatalf("the failed claim is still in Redis (%d, %v)", n, err)
	}
	if _, err := e.MarkIfAbsent(ctx, keys[1]); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("mark of a key only in the log: %v, want ErrUnavailable", err)
	}
	if _, err := e.Lookup(ctx, keys[1]); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("lookup of a key only in the log: %v, want ErrUnavailable", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := e.Forget(fctx, keys[2])
	cancel()
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Forget while the log holds the key: %v, want ErrUnavailable", err)
	}
	close(stop)
	infos := waitFromArchive(t, e, [][]byte{keys[0], keys[1], keys[2], keys[3]}, 10*time.Second)
	if infos[0].CommittedAt > committed.UnixNano() {
		t.Fatalf("committed at %v, after %v", time.Unix(0, infos[0].CommittedAt), committed)
	}
	// The failed Forget changed nothing (it failed before Redis appended
	// its removal): the key is still held, and a Forget now answers that
	// and removes it from the archive.
	if info, err := e.Forget(ctx, keys[2]); err != nil || info.Outcome != engine.Duplicate {
		t.Fatalf("Forget once the log drained: %+v, %v; want what it held, Duplicate", info, err)
	}
	if info, err := e.Lookup(ctx, keys[2]); err != nil || info.Outcome != engine.New {
		t.Fatalf("forgotten key: %+v, %v", info, err)
	}
	// Past the archive window (and its partition), New.
	time.Sleep(time.Until(committed.Add(o.ArchiveWindow + 2*o.Partition)))
	if err := e.MarkBatch(ctx, keys[3:], nil, marks[3:]); err != nil {
		t.Fatal(err)
	}
	for i, m := range marks[3:] {
		if m != engine.New {
			t.Fatalf("key %d past the archive window: %v", i+3, m)
		}
	}
}

// TestArchiveBehindRedisOlderArchive: an archive that lost entries the log
// trimmed after they were applied (restored from an older copy: its
// recorded position behind the log's trimmed one) is refused at Open
// with ErrLayout, not read as if whole.
func TestArchiveBehindRedisOlderArchive(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("older-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	o := redisArchiveOptions(c, prefix, arch)
	e := open(t, o)
	ctx := context.Background()
	keys := keysOf("older", 20)
	if err := e.MarkBatch(ctx, keys, nil, make([]engine.Outcome, len(keys))); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); e.Stats().Archive.Keys < uint64(len(keys)) || e.Stats().Archive.LogEntries > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v", *e.Stats().Archive)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The copy restored from before the drain: no position, no rows.
	if _, err := postgresPool(t).Exec(ctx, "UPDATE "+arch.Table+"_log SET ms = 0, seq = 0 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	o.Logger = quiet
	if e2, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		if e2 != nil {
			e2.Close()
		}
		t.Fatalf("an archive behind the log's trim: %v, want ErrLayout", err)
	}
}

// TestArchiveBehindRedisSkewAheadAnswers: at the shortest Window Open
// takes behind Redis's archive (Partition + 2*tier.LogSkew), an engine
// whose clock is 1.9 s ahead of Redis's (within LogSkew) is answered:
// some of its MarkBatch calls over 8 s succeed (85 of 159 at 5 s and 1 s
// partitions, 128 of 158 at 6 s and 2 s, one run: the others wait for the
// drain's seal, 0.1 s of margin at the boundary), and every failure is
// typed. At Partition + LogSkew (accepted before) a clock 1.2 s ahead
// failed every call: 159 of 159 in 8 s.
func TestArchiveBehindRedisSkewAheadAnswers(t *testing.T) {
	for _, c := range []struct{ window, part time.Duration }{
		{5 * time.Second, time.Second}, {6 * time.Second, 2 * time.Second},
	} {
		t.Run(fmt.Sprintf("window=%v,partition=%v", c.window, c.part), func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := context.Background()
			prefix := fmt.Sprintf("skewahead-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			short := func(o engine.Options) engine.Options {
				o.Window, o.Partition, o.Lease, o.Logger = c.window, c.part, 300*time.Millisecond, quiet
				return o
			}
			m := ra2Open(t, short(redisArchiveOptions(srv.Client(t), prefix, arch)))
			ra2WaitDrainer(t, m, 5*time.Second)
			o := short(redisArchiveOptions(srv.Client(t), prefix, arch))
			o.Clock = bkClock{1900 * time.Millisecond}
			e := ra2Open(t, o)
			ok, fails := 0, 0
			var last error
			for deadline, i := time.Now().Add(8*time.Second), 0; time.Now().Before(deadline); i++ {
				keys := keysOf(fmt.Sprintf("skewahead-%d", i), 3)
				out := make([]engine.Outcome, len(keys))
				if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
					if !bkTyped(err) {
						t.Fatalf("untyped: %v", err)
					}
					fails++
					last = err
				} else {
					ok++
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%d MarkBatch calls answered, %d failed (last: %v)", ok, fails, last)
			if ok == 0 {
				t.Errorf("an engine 1.9 s ahead of Redis: every MarkBatch call failed for 8 s (%d), last: %v", fails, last)
			}
		})
	}
}
