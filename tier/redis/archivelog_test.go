package redis_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
	// The removals the log holds, by key, until a trim passes them; a
	// later removal of a key outlives a trim up to its earlier one.
	removing := func(want ...tier.LogPos) {
		t.Helper()
		got, trimmed, err := s.Removing(ctx, "orders", [][]byte{[]byte("a"), []byte("c"), []byte("never"), []byte("b")})
		if err != nil {
			t.Fatal(err)
		}
		if _, mark, _, err := s.LogTail(ctx); err != nil || trimmed != mark {
			t.Fatalf("Removing's trim mark %v, LogTail's %v (%v)", trimmed, mark, err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("Removing, key %d: %v, want %v", i, got[i], want[i])
			}
		}
	}
	removing(entries[3].Pos, entries[2].Pos, entries[4].Pos, tier.LogPos{})
	if err := s.TrimLog(ctx, entries[2].Pos); err != nil {
		t.Fatal(err)
	}
	removing(entries[3].Pos, tier.LogPos{}, entries[4].Pos, tier.LogPos{})
	if err := s.Forget(ctx, []redis.Request{mk("a", tok(3), false, "")}, ans[:1]); err != nil {
		t.Fatal(err)
	}
	again, _, err := s.ReadLog(ctx, entries[4].Pos, 10)
	if err != nil || len(again) != 1 || !again[0].Forget {
		t.Fatalf("the second removal of a: %+v, %v", again, err)
	}
	if err := s.TrimLog(ctx, entries[4].Pos); err != nil {
		t.Fatal(err)
	}
	removing(again[0].Pos, tier.LogPos{}, tier.LogPos{}, tier.LogPos{})
	if err := s.TrimLog(ctx, entries[1].Pos); err != nil { // a late copy of an earlier trim
		t.Fatal(err)
	}
	removing(again[0].Pos, tier.LogPos{}, tier.LogPos{}, tier.LogPos{})
	// A batch of more keys than one HMGET reads: each answer at its key.
	many := make([][]byte, 2500)
	for i := range many {
		many[i] = fmt.Appendf(nil, "none-%d", i)
		if i%999 == 0 || i == len(many)-1 {
			many[i] = []byte("a")
		}
	}
	got, _, err := s.Removing(ctx, "orders", many)
	if err != nil || len(got) != len(many) {
		t.Fatalf("Removing of %d keys: %d answers, %v", len(many), len(got), err)
	}
	for i, k := range many {
		want := tier.LogPos{}
		if string(k) == "a" {
			want = again[0].Pos
		}
		if got[i] != want {
			t.Fatalf("Removing of %d keys, key %d (%s): %v, want %v", len(many), i, k, got[i], want)
		}
	}
	if err := s.TrimLog(ctx, again[0].Pos); err != nil {
		t.Fatal(err)
	}
	removing(tier.LogPos{}, tier.LogPos{}, tier.LogPos{}, tier.LogPos{})
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
	if rest, _, err := s.ReadLog(ctx, tier.LogPos{}, 100); err != nil || len(rest) != 0 {
		t.Fatalf("ReadLog after the trims: %d entries, %v", len(rest), err)
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
	// A Ring spreads keys over shards as a Cluster does: its scripts
	// could not append to one log (they failed every commit before).
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"one": srv.Addr}})
	defer ring.Close()
	if _, err := redis.New(ctx, ring, &redis.Options{Prefix: prefix + "ring:", Window: time.Hour, ArchiveLog: true, Logger: quiet}); !errors.Is(err, redis.ErrOptions) {
		t.Fatalf("a log on a Ring: %v, want ErrOptions", err)
	}
	if err := redis.NewBackend(ring, redis.Config{Prefix: prefix + "ring:"}).Validate(tier.Env{ArchiveLog: true}); !errors.Is(err, tier.ErrOptions) {
		t.Fatalf("an archive behind a Ring: %v, want ErrOptions", err)
	}
	// A store without the log has none to read.
	plain := newStore(t, c, redis.Options{Prefix: prefix + "plain:"})
	if _, _, err := plain.ReadLog(ctx, tier.LogPos{}, 1); !errors.Is(err, redis.ErrOptions) {
		t.Fatalf("ReadLog without the log: %v", err)
	}
}

// TestArchiveLogGroupsACallsCommits: a Commit of 600 keys appends one log
// entry per script call (chunks of 256), every committed key in order,
// sharing its entry's position; a read of one position returns all of
// its commits; a retried Commit appends nothing; a key whose commit
// fails (another's claim, a value that is no string) is left out while
// the keys around it are committed and logged; and an entry a reader
// cannot account for whole (lengths past its end, another field beside
// the group) stops ReadLog (ErrUnavailable), while a single-commit entry
// of an older log is still read.
func TestArchiveLogGroupsACallsCommits(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("glog-%d:", time.Now().UnixNano())
	s := newStore(t, c, redis.Options{Prefix: prefix, ArchiveLog: true})
	logKey := prefix + "\x00\x00"
	const n = 600
	reqs := make([]redis.Request, n)
	for i := range reqs {
		reqs[i] = redis.Request{NS: "ns", Key: fmt.Appendf(nil, "g-%04d", i), Token: tok(1), Archive: true}
		if i%7 == 0 {
			reqs[i].Result, reqs[i].At = fmt.Appendf(nil, "result %d", i), int64(1000+i)
		}
	}
	got := make([]redis.Result, n)
	if err := s.Claim(ctx, reqs, time.Minute, got); err != nil {
		t.Fatal(err)
	}
	// Key 3 is another's claim; key 300 holds a hash (no value of this
	// layout): neither commits, the keys around them do.
	other := tok(9)
	if err := c.Set(ctx, s.Key("ns", reqs[3].Key), "C"+string(other[:]), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, s.Key("ns", reqs[300].Key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, s.Key("ns", reqs[300].Key), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	st := make([]redis.Status, n)
	if err := s.Commit(ctx, 0, reqs, st); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range st {
		ok := i != 3 && i != 300
		if (st[i] == tier.OK) != ok {
			t.Fatalf("commit of key %d = %v", i, st[i])
		}
		if ok {
			want = append(want, string(reqs[i].Key))
		}
	}
	if l, err := c.XLen(ctx, logKey).Result(); err != nil || l != 3 {
		t.Fatalf("the log holds %d entries (%v), want 3: one a call of 256 keys", l, err)
	}
	check := func(entries []tier.LogEntry, want []string) {
		t.Helper()
		if len(entries) != len(want) {
			t.Fatalf("%d commits read, want %d", len(entries), len(want))
		}
		for i, e := range entries {
			if string(e.Record.Key) != want[i] || e.Forget || string(e.Record.NS) != "ns" {
				t.Fatalf("commit %d read %+v, want key %s", i, e, want[i])
			}
			if i > 0 && e.Pos.Less(entries[i-1].Pos) {
				t.Fatalf("commit %d at %v before %v", i, e.Pos, entries[i-1].Pos)
			}
			var k int
			fmt.Sscanf(want[i], "g-%d", &k)
			if k%7 == 0 && (string(e.Record.Result) != fmt.Sprintf("result %d", k) || e.Record.At != int64(1000+k)) {
				t.Fatalf("commit of key %d read with result %q at %d", k, e.Record.Result, e.Record.At)
			}
		}
	}
	entries, _, err := s.ReadLog(ctx, tier.LogPos{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	check(entries, want)
	if p := entries[0].Pos; entries[254].Pos != p || entries[255].Pos == p {
		t.Fatalf("the first call's 255 commits share a position: %v, %v, %v", p, entries[254].Pos, entries[255].Pos)
	}
	one, _, err := s.ReadLog(ctx, tier.LogPos{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	check(one, want[:255])
	// A retry of the whole Commit (its reply lost) appends nothing.
	if err := s.Commit(ctx, 0, reqs, st); err != nil {
		t.Fatal(err)
	}
	if l, _ := c.XLen(ctx, logKey).Result(); l != 3 {
		t.Fatalf("a retried Commit appended: %d entries", l)
	}
	// An entry of the log before commits were grouped: one commit.
	value, err := c.Get(ctx, s.Key("ns", reqs[1].Key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.XAdd(ctx, &goredis.XAddArgs{Stream: logKey, Values: []any{"k", s.Key("ns", []byte("old")), "v", value}}).Err(); err != nil {
		t.Fatal(err)
	}
	entries, _, err = s.ReadLog(ctx, entries[len(entries)-1].Pos, 10)
	if err != nil || len(entries) != 1 || string(entries[0].Record.Key) != "old" {
		t.Fatalf("an entry of one commit: %+v, %v", entries, err)
	}
	last := entries[0].Pos
	k := s.Key("ns", []byte("k"))
	group := func(parts ...string) string {
		var b []byte
		for _, p := range parts {
			b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
			b = append(b, p...)
		}
		return string(b)
	}
	for name, values := range map[string][]any{
		"lengths past its end": {"c", group(k, value)[:len(group(k, value))-1]},
		"a key without value":  {"c", group(k)},
		"another field":        {"c", group(k, value), "k", k},
		"no commit":            {"c", group(k, "Cabcdefghijklmnop")},
		"another prefix":       {"c", group("other:\x00\x02nsk", value)},
		"empty":                {"c", ""},
	} {
		if err := c.XAdd(ctx, &goredis.XAddArgs{Stream: logKey, Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.ReadLog(ctx, last, 10); !errors.Is(err, redis.ErrUnavailable) {
			t.Fatalf("a grouped entry with %s: %v, want ErrUnavailable", name, err)
		}
		if err := c.XTrimMaxLen(ctx, logKey, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoggedMark: a Mark of requests with Archive and LogBy on a store
// with the log commits each free key and appends the call's commits as
// one log entry; a key another call committed is answered Committed and
// not appended; a key left fenced by a give-back is marked through the
// claim script, and appended too; a key holding a hash fails the call
// (ErrUnavailable) while the other keys of its chunk are committed and
// appended (the caller gives them back). A Mark past its LogBy writes
// nothing (ErrUnavailable). A Mark mixing Archive with plain requests, or
// with differing or no LogBy, and a logged Mark on a store without the
// log or with MaxAttempts, are refused (ErrOptions) before writing.
func TestLoggedMark(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("lmark-%d:", time.Now().UnixNano())
	s := newStore(t, c, redis.Options{Prefix: prefix, ArchiveLog: true})
	if !s.MarksWithLog() {
		t.Fatal("a store with the log and without MaxAttempts does not mark with it")
	}
	logBy := time.Now().Add(time.Minute).UnixNano()
	mk := func(key string, tk redis.Token) redis.Request {
		return redis.Request{NS: "ns", Key: []byte(key), Token: tk, Archive: true, LogBy: logBy}
	}
	// "taken" is another call's commit; "fenced" holds a give-back's fence.
	other := make([]redis.Result, 2)
	if err := s.Mark(ctx, []redis.Request{mk("taken", tok(5)), mk("fenced", tok(5))}, other); err != nil {
		t.Fatal(err)
	}
	st := make([]redis.Status, 1)
	if err := s.Unmark(ctx, []redis.Request{mk("fenced", tok(5))}, time.Minute, st); err != nil || st[0] != tier.OK {
		t.Fatalf("unmark: %v, %v", st[0], err)
	}
	keys := []string{"a", "taken", "fenced", "b"}
	reqs := make([]redis.Request, len(keys))
	for i, k := range keys {
		reqs[i] = mk(k, tok(1))
	}
	out := make([]redis.Result, len(reqs))
	if err := s.Mark(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	want := []tier.Status{tier.Acquired, tier.Committed, tier.Acquired, tier.Acquired}
	for i := range out {
		if out[i].Status != want[i] {
			t.Fatalf("mark of %s = %+v, want %v", keys[i], out[i], want[i])
		}
	}
	entries, _, err := s.ReadLog(ctx, tier.LogPos{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range entries {
		f := ""
		if e.Forget {
			f = "-"
		}
		seen = append(seen, f+string(e.Record.Key))
	}
	// The first call's two commits, the unmark's removal, then this
	// call: "fenced" through the claim script (its own entry, appended
	// when its call ended, after the main script's) and a and b.
	if got := strings.Join(seen, " "); got != "taken fenced -fenced a b fenced" && got != "taken fenced -fenced fenced a b" {
		t.Fatalf("log %q", got)
	}
	// A key holding a hash: the call fails, its chunk's other keys are
	// committed and logged.
	if err := c.HSet(ctx, s.Key("ns", []byte("hash")), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	n0 := len(entries)
	err = s.Mark(ctx, []redis.Request{mk("c", tok(2)), mk("hash", tok(2)), mk("d", tok(2))}, make([]redis.Result, 3))
	if !errors.Is(err, redis.ErrUnavailable) {
		t.Fatalf("a mark of a key holding a hash: %v, want ErrUnavailable", err)
	}
	entries, _, err = s.ReadLog(ctx, tier.LogPos{}, 100)
	if err != nil || len(entries) != n0+2 || string(entries[n0].Record.Key) != "c" || string(entries[n0+1].Record.Key) != "d" {
		t.Fatalf("after the failed call the log holds %d entries (%v), want c and d appended", len(entries), err)
	}
	// Past LogBy: nothing written.
	late := []redis.Request{mk("late", tok(3))}
	late[0].LogBy = time.Now().Add(-time.Second).UnixNano()
	if err := s.Mark(ctx, late, make([]redis.Result, 1)); !errors.Is(err, redis.ErrUnavailable) {
		t.Fatalf("a mark past its LogBy: %v, want ErrUnavailable", err)
	}
	if n, _ := c.Exists(ctx, s.Key("ns", []byte("late"))).Result(); n != 0 {
		t.Fatal("a mark past its LogBy wrote its key")
	}
	// Refusals.
	plainReq := mk("p", tok(4))
	plainReq.Archive = false
	noLogBy := mk("q", tok(4))
	noLogBy.LogBy = 0
	otherLogBy := mk("r", tok(4))
	otherLogBy.LogBy++
	for name, reqs := range map[string][]redis.Request{
		"mixed":      {mk("o", tok(4)), plainReq},
		"mixed late": {plainReq, mk("o", tok(4))},
		"no LogBy":   {noLogBy},
		"two LogBy":  {mk("o", tok(4)), otherLogBy},
	} {
		if err := s.Mark(ctx, reqs, make([]redis.Result, len(reqs))); !errors.Is(err, redis.ErrOptions) {
			t.Fatalf("a Mark with %s: %v, want ErrOptions", name, err)
		}
	}
	for name, st := range map[string]*redis.Store{
		"no log":      newStore(t, c, redis.Options{Prefix: prefix + "nolog:"}),
		"MaxAttempts": newStore(t, c, redis.Options{Prefix: prefix + "max:", ArchiveLog: true, MaxAttempts: 3}),
	} {
		if st.MarksWithLog() {
			t.Fatalf("a store with %s marks with the log", name)
		}
		if err := st.Mark(ctx, []redis.Request{mk("o", tok(4))}, make([]redis.Result, 1)); !errors.Is(err, redis.ErrOptions) {
			t.Fatalf("a logged Mark on a store with %s: %v, want ErrOptions", name, err)
		}
	}
	for _, k := range []string{"o", "p", "q", "r"} {
		if n, _ := c.Exists(ctx, s.Key("ns", []byte(k))).Result(); n != 0 {
			t.Fatalf("a refused Mark wrote %s", k)
		}
	}
}
