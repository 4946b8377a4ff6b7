package redis_test

// Tests of the Redis tier's batch scripts: one script
// call per chunk of 256 keys on a single server (keyScript/evalBatch),
// one call per key on a Cluster.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// mm key states, by index mod 6.
const (
	mmFree = iota
	mmHeld
	mmCommitted
	mmReleasedOnce
	mmPoisoned
	mmExpired
	mmStates
)

func mmreqs(prefix string, n int, tk redis.Token, archive bool) []redis.Request {
	reqs := make([]redis.Request, n)
	for i := range reqs {
		reqs[i] = redis.Request{NS: "ns", Key: fmt.Appendf(nil, "%s-%05d", prefix, i), Token: tk, Archive: archive}
	}
	return reqs
}

func mmpick(reqs []redis.Request, state int, tk redis.Token) []redis.Request {
	var out []redis.Request
	for i := range reqs {
		if i%mmStates == state {
			r := reqs[i]
			r.Token = tk
			out = append(out, r)
		}
	}
	return out
}

func mmclaimAll(t *testing.T, s *redis.Store, reqs []redis.Request, lease time.Duration, want tier.Status) {
	t.Helper()
	if len(reqs) == 0 {
		return
	}
	out := make([]redis.Result, len(reqs))
	if err := s.Claim(context.Background(), reqs, lease, out); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if out[i].Status != want {
			t.Fatalf("setup claim of %s = %+v, want %v", reqs[i].Key, out[i], want)
		}
	}
}

func mmstatusAll(t *testing.T, what string, fn func(context.Context, []redis.Request, []redis.Status) error, reqs []redis.Request, want tier.Status) {
	t.Helper()
	if len(reqs) == 0 {
		return
	}
	out := make([]redis.Status, len(reqs))
	if err := fn(context.Background(), reqs, out); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for i := range out {
		if out[i] != want {
			t.Fatalf("%s of %s (%d of %d) = %v, want %v", what, reqs[i].Key, i, len(reqs), out[i], want)
		}
	}
}

// mmsetup leaves each key of reqs in the state of its index mod 6, made
// by token other (a released key by releases, an expired one by a claim
// whose 50 ms lease has ended), through batch calls.
func mmsetup(t *testing.T, s *redis.Store, reqs []redis.Request, other redis.Token, max int) {
	t.Helper()
	held := mmpick(reqs, mmHeld, other)
	mmclaimAll(t, s, held, time.Minute, tier.Acquired)
	committed := mmpick(reqs, mmCommitted, other)
	for i := range committed {
		committed[i].Digest = redis.Digest{9}
	}
	mmclaimAll(t, s, committed, time.Minute, tier.Acquired)
	mmstatusAll(t, "setup commit", commit(s), committed, tier.OK)
	once := mmpick(reqs, mmReleasedOnce, other)
	mmclaimAll(t, s, once, time.Minute, tier.Acquired)
	mmstatusAll(t, "setup release", release(s), once, tier.OK)
	poisoned := mmpick(reqs, mmPoisoned, other)
	for range max {
		mmclaimAll(t, s, poisoned, time.Minute, tier.Acquired)
		mmstatusAll(t, "setup release", release(s), poisoned, tier.OK)
	}
	expired := mmpick(reqs, mmExpired, other)
	mmclaimAll(t, s, expired, 50*time.Millisecond, tier.Acquired)
	time.Sleep(80 * time.Millisecond)
}

// mmexpect checks a claim by a fresh token of keys set up by mmsetup.
func mmexpect(t *testing.T, reqs []redis.Request, out []redis.Result, other redis.Token, max int) {
	t.Helper()
	for i := range reqs {
		r := out[i]
		ok := false
		switch i % mmStates {
		case mmFree:
			ok = r.Status == tier.Acquired && r.Attempts == 0 && !r.Expired
		case mmHeld:
			ok = r.Status == tier.Held
		case mmCommitted:
			ok = r.Status == tier.Committed && r.Token == other && r.Digest == (redis.Digest{9})
		case mmReleasedOnce:
			ok = r.Status == tier.Acquired && (max == 0 && r.Attempts == 0 || max > 0 && r.Attempts == 1)
		case mmPoisoned:
			ok = max == 0 && r.Status == tier.Acquired || max > 0 && r.Status == tier.Poisoned && int(r.Attempts) == max
		case mmExpired:
			ok = r.Status == tier.Acquired && (max == 0 || r.Attempts == 1 && r.Expired)
		}
		if !ok {
			t.Fatalf("key %d of %d (state %d) answered %+v", i, len(reqs), i%mmStates, r)
		}
	}
}

var mmshapes = []int{1, 255, 256, 257, 1000}

// TestChunkShapes: claims, extends, commits, lookups, give-backs
// and forgets of batches of 1, 255, 256, 257 and 1000 keys in mixed
// states answer each key in its own place, with and without the archive
// log (two KEYS per key), and the log holds exactly one entry per
// archived commit and per removal, in batch order.
func TestChunkShapes(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	me, other := tok(1), tok(2)
	for _, max := range []int{0, 3} {
		for _, archiveLog := range []bool{false, true} {
			for _, n := range mmshapes {
				t.Run(fmt.Sprintf("max=%d/log=%v/n=%d", max, archiveLog, n), func(t *testing.T) {
					prefix := fmt.Sprintf("mms-%d-%v-%d-%d:", max, archiveLog, n, time.Now().UnixNano())
					s := newStore(t, c, redis.Options{Prefix: prefix, MaxAttempts: max, ArchiveLog: archiveLog})
					reqs := mmreqs("k", n, me, true)
					mmsetup(t, s, reqs, other, max)
					out := make([]redis.Result, n)
					if err := s.Claim(ctx, reqs, time.Minute, out); err != nil {
						t.Fatal(err)
					}
					mmexpect(t, reqs, out, other, max)
					var mine, notMine []redis.Request
					for i := range reqs {
						if out[i].Status == tier.Acquired {
							mine = append(mine, reqs[i])
						} else {
							notMine = append(notMine, reqs[i])
						}
					}
					mmstatusAll(t, "extend", func(ctx context.Context, r []redis.Request, st []redis.Status) error {
						return s.Extend(ctx, r, 2*time.Minute, st)
					}, mine, tier.OK)
					mmstatusAll(t, "extend of others' keys", func(ctx context.Context, r []redis.Request, st []redis.Status) error {
						return s.Extend(ctx, r, 2*time.Minute, st)
					}, notMine, tier.Lost)
					// Commit every key at once: mine OK, the others Lost, in place.
					st := make([]redis.Status, n)
					for i := range reqs {
						reqs[i].Digest = redis.Digest{byte(i), byte(i >> 8), 1}
					}
					if err := s.Commit(ctx, 0, reqs, st); err != nil {
						t.Fatal(err)
					}
					for i := range st {
						want := tier.Lost
						if out[i].Status == tier.Acquired {
							want = tier.OK
						}
						if st[i] != want {
							t.Fatalf("commit of key %d = %v, want %v", i, st[i], want)
						}
					}
					look := make([]redis.Result, n)
					if err := s.Lookup(ctx, reqs, look); err != nil {
						t.Fatal(err)
					}
					for i := range look {
						var ok bool
						switch {
						case out[i].Status == tier.Acquired:
							ok = look[i].Status == tier.Committed && look[i].Token == me && look[i].Digest == reqs[i].Digest
						case i%mmStates == mmHeld:
							ok = look[i].Status == tier.Held
						case i%mmStates == mmCommitted:
							ok = look[i].Status == tier.Committed && look[i].Token == other
						case i%mmStates == mmPoisoned:
							ok = look[i].Status == tier.Poisoned && int(look[i].Attempts) == max
						}
						if !ok {
							t.Fatalf("lookup of key %d = %+v (claim answered %+v)", i, look[i], out[i])
						}
					}
					// Give back my commits (the caller was told they failed):
					// undone, the keys free again.
					gb := make([]redis.Status, len(mine))
					if len(mine) > 0 {
						if err := s.Release(ctx, 0, mine, true, gb); err != nil {
							t.Fatal(err)
						}
					}
					for i := range gb {
						if gb[i] != tier.OK {
							t.Fatalf("give-back of %s = %v", mine[i].Key, gb[i])
						}
					}
					if err := s.Forget(ctx, reqs, look); err != nil {
						t.Fatal(err)
					}
					if err := s.Lookup(ctx, reqs, look); err != nil {
						t.Fatal(err)
					}
					for i := range look {
						want := tier.Absent
						if i%mmStates == mmHeld {
							want = tier.Held
						}
						if look[i].Status != want {
							t.Fatalf("after give-back and forget, key %d = %+v, want %v", i, look[i], want)
						}
					}
					if !archiveLog {
						if n, err := c.Exists(ctx, prefix+"\x00\x00").Result(); err != nil || n != 0 {
							t.Fatalf("a store without the log wrote one (%d, %v)", n, err)
						}
						return
					}
					entries, _, err := s.ReadLog(ctx, tier.LogPos{}, 100000)
					if err != nil {
						t.Fatal(err)
					}
					type seen struct {
						key    string
						forget bool
					}
					var want []seen
					for _, r := range mmpick(reqs, mmCommitted, other) { // the setup's commits (Archive set)
						want = append(want, seen{string(r.Key), false})
					}
					for _, r := range mine {
						want = append(want, seen{string(r.Key), false})
					}
					for _, r := range mine {
						want = append(want, seen{string(r.Key), true})
					}
					for i, r := range reqs {
						if i%mmStates != mmHeld {
							want = append(want, seen{string(r.Key), true})
						}
					}
					if len(entries) != len(want) {
						t.Fatalf("%d log entries, want %d", len(entries), len(want))
					}
					for i, e := range entries {
						got := seen{string(e.Record.Key), e.Forget}
						if got != want[i] || string(e.Record.NS) != "ns" {
							t.Fatalf("log entry %d = %+v (ns %q), want %+v", i, got, e.Record.NS, want[i])
						}
					}
				})
			}
		}
	}
}

// TestRepeatAcrossChunks: a key repeated in one batch, within a
// chunk and across the boundary of two (positions 0/1 and 0/256/257),
// answers as one call per key in order would: a claim by the same token
// is its own claim again, by another token Held; a mark by another token
// finds the first one's commit; a repeated commit is a retry (OK) and is
// logged once; a repeated release is Lost the second time.
func TestRepeatAcrossChunks(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("mmr-%d:", time.Now().UnixNano())
	s := newStore(t, c, redis.Options{Prefix: prefix, MaxAttempts: 3, ArchiveLog: true})
	const n = 300
	base := func(tag string) []redis.Request { return mmreqs(tag, n, tok(1), true) }
	// Claims: x at 0, 1 (same token) and 256 (same), 257 (another token).
	reqs := base("c")
	x := reqs[0]
	reqs[1] = x
	reqs[256] = x
	y := x
	y.Token = tok(2)
	reqs[257] = y
	out := make([]redis.Result, n)
	if err := s.Claim(ctx, reqs, time.Minute, out); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, 256} {
		if out[i].Status != tier.Acquired {
			t.Fatalf("claim of the repeated key at %d by its own token = %+v", i, out[i])
		}
	}
	if out[257].Status != tier.Held {
		t.Fatalf("claim of the repeated key at 257 by another token = %+v", out[257])
	}
	// Commits: x at 0 and 256 (a retry: OK, logged once).
	st := make([]redis.Status, n)
	creqs := append([]redis.Request(nil), reqs...)
	creqs[257] = creqs[2] // drop the other token's request: commit the free key twice instead
	creqs[1] = creqs[3]
	if err := s.Commit(ctx, 0, creqs, st); err != nil {
		t.Fatal(err)
	}
	for i := range st {
		if st[i] != tier.OK {
			t.Fatalf("commit %d (%s) = %v", i, creqs[i].Key, st[i])
		}
	}
	entries, _, err := s.ReadLog(ctx, tier.LogPos{}, 10000)
	if err != nil {
		t.Fatal(err)
	}
	logged := map[string]int{}
	for _, e := range entries {
		logged[string(e.Record.Key)]++
	}
	for _, r := range reqs {
		if r.Token != tok(1) {
			continue
		}
		if logged[string(r.Key)] != 1 {
			t.Fatalf("key %s logged %d times, want once", r.Key, logged[string(r.Key)])
		}
	}
	// Marks with MaxAttempts (the claim script's mark form): m at 0 and
	// 256 by different tokens, at 1 and 257 by the first again.
	mreqs := mmreqs("m", n, tok(1), false) // a store with MaxAttempts cannot log a mark
	m := mreqs[0]
	m2 := m
	m2.Token = tok(3)
	mreqs[256], mreqs[1], mreqs[257] = m2, m, m
	mo := make([]redis.Result, n)
	if err := s.Mark(ctx, mreqs, mo); err != nil {
		t.Fatal(err)
	}
	if mo[0].Status != tier.Acquired {
		t.Fatalf("first mark = %+v", mo[0])
	}
	for _, i := range []int{1, 256, 257} {
		if mo[i].Status != tier.Committed || mo[i].Token != tok(1) {
			t.Fatalf("repeated mark at %d = %+v, want Committed by the first", i, mo[i])
		}
	}
	// Releases: r at 0 and 256: OK, then Lost.
	rreqs := base("r")
	mmclaimAll(t, s, rreqs, time.Minute, tier.Acquired)
	rreqs[256] = rreqs[0]
	rs := make([]redis.Status, n)
	if err := s.Release(ctx, 0, rreqs, false, rs); err != nil {
		t.Fatal(err)
	}
	if rs[0] != tier.OK || rs[256] != tier.Lost {
		t.Fatalf("repeated release = %v then %v, want ok then lost", rs[0], rs[256])
	}
	// Lookups: a repeated key answers the same everywhere.
	lk := make([]redis.Result, n)
	lreqs := base("c")
	lreqs[255], lreqs[256], lreqs[299] = lreqs[0], lreqs[0], lreqs[0]
	if err := s.Lookup(ctx, lreqs, lk); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 255, 256, 299} {
		if lk[i].Status != tier.Committed || lk[i].Token != tok(1) {
			t.Fatalf("lookup of the repeated key at %d = %+v", i, lk[i])
		}
	}
}

// TestNoScript: every batch script call, of more keys than one
// chunk, succeeds after the server lost its scripts (SCRIPT FLUSH between
// calls: EVALSHA answers NOSCRIPT, the store reloads and runs again), and
// after a restart of the server.
func TestNoScript(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("mmns-%d-%d:", max, time.Now().UnixNano()), MaxAttempts: max, ArchiveLog: true})
			flush := func() {
				t.Helper()
				if err := c.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			const n = 600
			reqs := mmreqs("k", n, tok(1), true)
			flush()
			mmclaimAll(t, s, reqs, time.Minute, tier.Acquired)
			flush()
			mmstatusAll(t, "extend", func(ctx context.Context, r []redis.Request, st []redis.Status) error {
				return s.Extend(ctx, r, 2*time.Minute, st)
			}, reqs, tier.OK)
			flush()
			mmstatusAll(t, "commit", commit(s), reqs[:n/2], tier.OK)
			flush()
			mmstatusAll(t, "release", release(s), reqs[n/2:], tier.OK)
			flush()
			look := make([]redis.Result, n)
			if err := s.Lookup(ctx, reqs, look); err != nil {
				t.Fatal(err)
			}
			for i := range look {
				want := tier.Committed
				if i >= n/2 {
					want = tier.Absent
					if max > 0 {
						want = tier.Released
					}
				}
				if look[i].Status != want {
					t.Fatalf("lookup %d = %+v, want %v", i, look[i], want)
				}
			}
			flush()
			if err := s.Forget(ctx, reqs, look); err != nil {
				t.Fatal(err)
			}
			flush()
			// A mark is a call of its own, with a token of its own: the
			// one the forgotten commits carried names calls that did
			// commit (a mark settling under it answers New, writing
			// nothing).
			// Without MaxAttempts the marks are logged ones (the store
			// keeps the log): their script is sent once, and sent again
			// after NOSCRIPT, which ran nothing. With it a store cannot
			// log a mark: plain marks.
			reqs = mmreqs("k", n, tok(2), max == 0)
			logBy := time.Now().Add(time.Minute).UnixNano()
			for i := range reqs {
				reqs[i].LogBy = logBy
			}
			mo := make([]redis.Result, n)
			if err := s.Mark(ctx, reqs, mo); err != nil {
				t.Fatal(err)
			}
			for i := range mo {
				if mo[i].Status != tier.Acquired {
					t.Fatalf("mark %d after forget = %+v", i, mo[i])
				}
			}
			flush()
			mmstatusAll(t, "unmark", func(ctx context.Context, r []redis.Request, st []redis.Status) error {
				return s.Unmark(ctx, r, time.Minute, st)
			}, reqs, tier.OK)
			if max > 0 {
				return
			}
			// Each logged mark is in the log, and its undoing after it.
			entries, _, err := s.ReadLog(ctx, tier.LogPos{}, 100000)
			if err != nil {
				t.Fatal(err)
			}
			last := map[string][]bool{} // key → its entries' Forget flags, in order
			for _, e := range entries {
				last[string(e.Record.Key)] = append(last[string(e.Record.Key)], e.Forget)
			}
			for _, r := range reqs {
				ev := last[string(r.Key)]
				if len(ev) < 2 || ev[len(ev)-2] || !ev[len(ev)-1] {
					t.Fatalf("key %s: log entries (forget flags) %v, want its mark then its unmark last", r.Key, ev)
				}
			}
		})
	}
	// A restart loses every script (and, without persistence, every key).
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("mmrs-%d:", time.Now().UnixNano()), MaxAttempts: 3})
	srv.Kill()
	srv.Restart()
	reqs := mmreqs("after-restart", 600, tok(1), false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := make([]redis.Result, len(reqs))
		err := s.Claim(ctx, reqs, time.Minute, out)
		if err == nil {
			for i := range out {
				if out[i].Status != tier.Acquired {
					t.Fatalf("claim %d after restart = %+v", i, out[i])
				}
			}
			break
		}
		if !errors.Is(err, redis.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("claim after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCluster: on a Cluster (one script call per key, pipelined
// per node) the same batch shapes answer each key in its place.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := cl.Client(t)
	ctx := context.Background()
	me, other := tok(1), tok(2)
	if _, err := redis.New(ctx, c, &redis.Options{Prefix: "mmcl-log:", ArchiveLog: true, Window: time.Hour, Logger: quiet}); !errors.Is(err, redis.ErrOptions) {
		t.Fatalf("archive log on a Cluster: %v, want ErrOptions", err)
	}
	for _, max := range []int{0, 3} {
		for _, n := range []int{1, 256, 257, 1000} {
			t.Run(fmt.Sprintf("max=%d/n=%d", max, n), func(t *testing.T) {
				s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("mmcl-%d-%d-%d:", max, n, time.Now().UnixNano()), MaxAttempts: max})
				reqs := mmreqs("k", n, me, false)
				mmsetup(t, s, reqs, other, max)
				out := make([]redis.Result, n)
				if err := s.Claim(ctx, reqs, time.Minute, out); err != nil {
					t.Fatal(err)
				}
				mmexpect(t, reqs, out, other, max)
				st := make([]redis.Status, n)
				if err := s.Commit(ctx, 0, reqs, st); err != nil {
					t.Fatal(err)
				}
				look := make([]redis.Result, n)
				if err := s.Lookup(ctx, reqs, look); err != nil {
					t.Fatal(err)
				}
				for i := range reqs {
					mine := out[i].Status == tier.Acquired
					if mine != (st[i] == tier.OK) {
						t.Fatalf("commit of key %d = %v after claim %+v", i, st[i], out[i])
					}
					if mine && (look[i].Status != tier.Committed || look[i].Token != me) {
						t.Fatalf("lookup of committed key %d = %+v", i, look[i])
					}
				}
			})
		}
	}
}

// TestDeadlineMidBatch: a claim of 1000 keys (four chunks) sent
// to a paused server returns by the caller's deadline with
// ErrUnavailable; the calls land when the server resumes, and a retry with
// the same token finds every key its own (Acquired), another token
// Held; a commit then succeeds for every key.
func TestDeadlineMidBatch(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newStore(t, c, redis.Options{Prefix: fmt.Sprintf("mmdl-%d:", time.Now().UnixNano()), MaxAttempts: 3})
	reqs := mmreqs("k", 1000, tok(1), false)
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	out := make([]redis.Result, len(reqs))
	err := s.Claim(dctx, reqs, time.Minute, out)
	cancel()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("claim against a paused server took %v, deadline 200ms", took)
	}
	if err == nil {
		t.Fatal("claim against a paused server succeeded")
	}
	if !errors.Is(err, redis.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim against a paused server: %v", err)
	}
	srv.Resume()
	resumed = true
	var retryErr error
	for range 100 {
		if retryErr = s.Claim(ctx, reqs, time.Minute, out); retryErr == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if retryErr != nil {
		t.Fatal(retryErr)
	}
	for i := range out {
		if out[i].Status != tier.Acquired {
			t.Fatalf("retried claim %d = %+v", i, out[i])
		}
	}
	others := mmreqs("k", 1000, tok(2), false)
	if err := s.Claim(ctx, others, time.Minute, out); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if out[i].Status != tier.Held {
			t.Fatalf("another token's claim %d = %+v", i, out[i])
		}
	}
	mmstatusAll(t, "commit", commit(s), reqs, tier.OK)
}
