package redis_test

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

// TestArchiveLog: with ArchiveLog, a commit of a request with Archive
// set, a Forget (found or not) and a commit undone by a give-back are
// appended in order; a commit without Archive, a retried commit and a
// Forget of a held key are not. ReadLog reads after a position, TrimLog
// deletes up to one, the drain lease has one holder, and a store without
// the log is refused on the prefix (ErrLayout), as a Cluster is
// (ErrOptions).
func TestArchiveLog(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("log-%d:", time.Now().UnixNano())
	s := newStore(t, c, redis.Options{Prefix: prefix, ArchiveLog: true})

	mk := func(key string, tk redis.Token, archive bool, result string) redis.Request {
		r := req(key, tk)
		r.NS, r.Archive, r.Digest = "orders", archive, tier.Digest{7}
		if result != "" {
			r.Result, r.At = []byte(result), 42
		}
		return r
	}
	for _, k := range []string{"a", "b", "c", "held"} {
		if got := claim(t, s, mk(k, tok(1), true, ""), time.Minute); got.Status != tier.Acquired {
			t.Fatalf("claim %s: %v", k, got.Status)
		}
	}
	if st := status(t, commit(s), mk("a", tok(1), true, "ra")); st != tier.OK {
		t.Fatal(st)
	}
	if st := status(t, commit(s), mk("a", tok(1), true, "ra")); st != tier.OK { // a retry: not appended again
		t.Fatal(st)
	}
	if st := status(t, commit(s), mk("b", tok(1), false, "")); st != tier.OK { // not archived
		t.Fatal(st)
	}
	if st := status(t, commit(s), mk("c", tok(1), true, "")); st != tier.OK {
		t.Fatal(st)
	}
	// c's commit undone by a give-back (its caller was told it failed).
	out := make([]redis.Status, 1)
	if err := s.Release(ctx, 0, []redis.Request{mk("c", tok(1), true, "")}, true, out); err != nil || out[0] != tier.OK {
		t.Fatalf("give-back: %v, %v", out[0], err)
	}
	ans := make([]redis.Result, 2)
	if err := s.Forget(ctx, []redis.Request{mk("a", tok(2), false, ""), mk("never", tok(2), false, "")}, ans); err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(ctx, []redis.Request{mk("held", tok(2), false, "")}, ans[:1]); err != nil || ans[0].Status != tier.Held {
		t.Fatalf("Forget of a held key: %v, %v", ans[0].Status, err)
	}
	entries, now, err := s.ReadLog(ctx, tier.LogPos{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		key    string
		forget bool
		result string
	}
	want := []seen{{"a", false, "ra"}, {"c", false, ""}, {"c", true, ""}, {"a", true, ""}, {"never", true, ""}}
	if len(entries) != len(want) {
		t.Fatalf("%d entries, want %d: %+v", len(entries), len(want), entries)
	}
	for i, e := range entries {
		got := seen{string(e.Record.Key), e.Forget, string(e.Record.Result)}
		if got != want[i] || string(e.Record.NS) != "orders" {
			t.Fatalf("entry %d: %+v (ns %q), want %+v", i, got, e.Record.NS, want[i])
		}
		if i > 0 && !entries[i-1].Pos.Less(e.Pos) {
			t.Fatalf("entries out of order: %v then %v", entries[i-1].Pos, e.Pos)
		}
		if at := e.Record.At; (want[i].result == "" && at/int64(time.Millisecond) != int64(e.Pos.MS)) || (want[i].result != "" && at != 42) || at > now {
			t.Fatalf("entry %d dated %d, position %v, read at %d", i, e.Record.At, e.Pos, now)
		}
	}
	if entries[0].Record.Digest != (tier.Digest{7}) {
		t.Fatalf("digest %v", entries[0].Record.Digest)
	}
	if rest, _, err := s.ReadLog(ctx, entries[2].Pos, 100); err != nil || len(rest) != 2 || rest[0].Pos != entries[3].Pos {
		t.Fatalf("ReadLog after entry 2: %d entries, %v", len(rest), err)
	}
	if err := s.TrimLog(ctx, entries[1].Pos); err != nil {
		t.Fatal(err)
	}
	tail, trimmed, n, err := s.LogTail(ctx)
	if err != nil || n != 3 || tail != entries[4].Pos || trimmed != entries[1].Pos {
		t.Fatalf("LogTail after trimming two: tail %v, trimmed %v, %d entries, %v", tail, trimmed, n, err)
	}
	// The archive the log feeds is bound once.
	if err := s.Bind(ctx, "archive one"); err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(ctx, "archive one"); err != nil {
		t.Fatalf("the same archive again: %v", err)
	}
	if err := s.Bind(ctx, "archive two"); !errors.Is(err, redis.ErrLayout) {
		t.Fatalf("another archive: %v, want ErrLayout", err)
	}
	if rest, _, err := s.ReadLog(ctx, tier.LogPos{}, 100); err != nil || len(rest) != 3 || rest[0].Pos != entries[2].Pos {
		t.Fatalf("ReadLog after the trim: %d entries, %v", len(rest), err)
	}
	// One holder of the drain lease until it ends.
	if ok, err := s.DrainLease(ctx, "one", 300*time.Millisecond); !ok || err != nil {
		t.Fatalf("lease: %v, %v", ok, err)
	}
	if ok, err := s.DrainLease(ctx, "two", time.Second); ok || err != nil {
		t.Fatalf("a second holder: %v, %v", ok, err)
	}
	if ok, err := s.DrainLease(ctx, "one", 300*time.Millisecond); !ok || err != nil {
		t.Fatalf("renewal: %v, %v", ok, err)
	}
	time.Sleep(400 * time.Millisecond)
	if ok, err := s.DrainLease(ctx, "two", time.Second); !ok || err != nil {
		t.Fatalf("after the lease ended: %v, %v", ok, err)
	}
	// A store without the log on the prefix would commit without
	// appending.
	if _, err := redis.New(ctx, c, &redis.Options{Prefix: prefix, Window: time.Hour, Logger: quiet}); !errors.Is(err, redis.ErrLayout) {
		t.Fatalf("a store without the log on a logging prefix: %v, want ErrLayout", err)
	}
	cl := redistest.StartCluster(t)
	if _, err := redis.New(ctx, cl.Client(t), &redis.Options{Prefix: prefix, Window: time.Hour, ArchiveLog: true, Logger: quiet}); !errors.Is(err, redis.ErrOptions) {
		t.Fatalf("a log on a Cluster: %v, want ErrOptions", err)
	}
	// A store without the log has none to read.
	plain := newStore(t, c, redis.Options{Prefix: prefix + "plain:"})
	if _, _, err := plain.ReadLog(ctx, tier.LogPos{}, 1); !errors.Is(err, redis.ErrOptions) {
		t.Fatalf("ReadLog without the log: %v", err)
	}
}
