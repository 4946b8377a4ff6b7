package tiertest

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/tierdedup/tierdedup/tier"
)

// RunAppender checks an archive that takes a shared tier's log
// (tier.ArchiveAppender) through its public methods: entries applied in
// order with their position, a batch applied twice changing nothing the
// second time, a key's forget and commits within one batch leaving what
// applying them one by one leaves, the first commit of a key winning in a
// partition, Start set once, Seal listing the partition and turning later
// commits of a sealed partition into the first one not sealed, and all of
// it kept across a reopen.
func RunAppender(t *testing.T, open OpenArchive) {
	t.Run("apply", func(t *testing.T) { checkApply(t, open) })
	t.Run("seal", func(t *testing.T) { checkSeal(t, open) })
	t.Run("apply-large", func(t *testing.T) { checkApplyLarge(t, open) })
}

// checkApplyLarge: "no single entry can stop a drain": one Apply of 300
// entries of 4 MiB results (1.2 GiB, over PostgreSQL's limit on one
// message) and keys up to 64 KiB is applied, and each is found whole.
func checkApplyLarge(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	a, app := openAppender(t, open(t))
	defer a.Close()
	if _, err := app.Start(ctx, 10); err != nil {
		t.Fatal(err)
	}
	result := string(bytes.Repeat([]byte("x"), 4<<20))
	var batch []tier.LogEntry
	for i := range 300 {
		key := fmt.Sprintf("large-%d", i)
		if i%100 == 7 {
			// 64 KiB that PostgreSQL cannot compress into an index entry.
			b := []byte(key)
			for x := uint64(i); len(b) < 64<<10; x = x*6364136223846793005 + 1442695040888963407 {
				b = append(b, byte(x>>56))
			}
			key = string(b)
		}
		batch = append(batch, entry(uint64(1000+i), false, 10, key, result))
	}
	if err := app.Apply(ctx, batch); err != nil {
		t.Fatalf("Apply of 300 results of 4 MiB: %v", err)
	}
	for _, i := range []int{0, 7, 150, 299} {
		key := string(batch[i].Record.Key)
		if got := lookup(t, a, key); got.Status != tier.Committed || len(got.Result) != len(result) {
			t.Fatalf("entry %d (key of %d bytes) after the Apply: %v, %d bytes of result", i, len(key), got.Status, len(got.Result))
		}
	}
}

func openAppender(t *testing.T, b tier.ArchiveBackend) (tier.Archive, tier.ArchiveAppender) {
	t.Helper()
	env := archiveEnv()
	env.Log = true
	a := openArchive(t, b, env)
	app, ok := a.(tier.ArchiveAppender)
	if !ok {
		t.Fatalf("%T takes no log", a)
	}
	return a, app
}

func entry(ms uint64, forget bool, p int64, key string, result string) tier.LogEntry {
	e := tier.LogEntry{Pos: tier.LogPos{MS: ms, Seq: 0}, Forget: forget, Partition: p,
		Record: tier.Record{NS: []byte("ns"), Key: []byte(key), At: int64(ms) * 1e6}}
	if result != "" {
		e.Record.Result = []byte(result)
	}
	return e
}

// lookup answers key over every partition.
func lookup(t *testing.T, a tier.Archive, key string) tier.Answer {
	t.Helper()
	out := make([]tier.Answer, 1)
	if err := a.Lookup(context.Background(), []tier.ArchiveQuery{{NS: "ns", Key: []byte(key), From: -1 << 40, To: 1 << 40}}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func checkApply(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	a, app := openAppender(t, open(t))
	if pos, next, err := app.Applied(ctx); err != nil || pos != (tier.LogPos{}) || next != -1 {
		t.Fatalf("a new archive: applied %v, sealed next %d, %v", pos, next, err)
	}
	if next, err := app.Start(ctx, 10); err != nil || next != 10 {
		t.Fatalf("Start: %d, %v", next, err)
	}
	if next, err := app.Start(ctx, 3); err != nil || next != 10 {
		t.Fatalf("Start again: %d, %v (it is set once)", next, err)
	}
	batch := []tier.LogEntry{
		entry(100, false, 10, "a", "first"),
		entry(101, false, 10, "a", "second"), // a repeat in the partition: the first wins
		entry(102, false, 10, "b", ""),
		entry(103, true, 10, "b", ""), // b forgotten after its commit
		entry(104, true, 10, "c", ""), // c forgotten, then committed
		entry(105, false, 11, "c", "again"),
	}
	if err := app.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if got := lookup(t, a, "a"); got.Status != tier.Committed || string(got.Result) != "first" || got.Partition != 10 || got.At != 100e6 {
			t.Fatalf("%s: a: %+v, want the first commit", when, got)
		}
		if got := lookup(t, a, "b"); got.Status != tier.Absent {
			t.Fatalf("%s: b forgotten after its commit: %+v", when, got)
		}
		if got := lookup(t, a, "c"); got.Status != tier.Committed || string(got.Result) != "again" || got.Partition != 11 {
			t.Fatalf("%s: c committed after its forget: %+v", when, got)
		}
	}
	check("applied")
	// The same batch again (a drainer that died before its trim), then a
	// later one overlapping it: the position skips what was applied.
	if err := app.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	check("applied twice")
	more := []tier.LogEntry{batch[4], entry(106, false, 11, "d", ""), entry(107, true, 11, "a", "")}
	if err := app.Apply(ctx, more); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, a, "c"); got.Status != tier.Committed {
		t.Fatalf("c, its old forget replayed: %+v (entries at or before the position must be skipped)", got)
	}
	if got := lookup(t, a, "a"); got.Status != tier.Absent {
		t.Fatalf("a forgotten: %+v", got)
	}
	if pos, _, err := app.Applied(ctx); err != nil || pos != (tier.LogPos{MS: 107}) {
		t.Fatalf("applied %v, %v; want 107-0", pos, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a, app = openAppender(t, open(t))
	defer a.Close()
	if got := lookup(t, a, "d"); got.Status != tier.Committed || got.Partition != 11 {
		t.Fatalf("d after a reopen: %+v", got)
	}
	if pos, next, err := app.Applied(ctx); err != nil || pos != (tier.LogPos{MS: 107}) || next != 10 {
		t.Fatalf("after a reopen: applied %v, sealed next %d, %v", pos, next, err)
	}
}

func checkSeal(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	a, app := openAppender(t, open(t))
	defer a.Close()
	if _, err := app.Start(ctx, 20); err != nil {
		t.Fatal(err)
	}
	var batch []tier.LogEntry
	for i := range 30 {
		batch = append(batch, entry(uint64(200+i), false, 20, fmt.Sprintf("k%02d", i), ""))
	}
	if err := app.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := app.Seal(ctx, 20); err != nil {
		t.Fatal(err)
	}
	held, err := a.Archived(ctx)
	if err != nil || len(held) != 1 || held[0] != 20 {
		t.Fatalf("Archived after Seal(20): %v, %v", held, err)
	}
	if _, next, err := app.Applied(ctx); err != nil || next != 21 {
		t.Fatalf("sealed next %d, %v; want 21", next, err)
	}
	n := 0
	if err := a.Scan(ctx, 20, func(ns, key []byte) error { n++; return nil }); err != nil || n != 30 {
		t.Fatalf("Scan(20): %d keys, %v", n, err)
	}
	// A commit filed in a sealed partition goes to the first one not
	// sealed: the sealed partition's filter is written.
	if err := app.Apply(ctx, []tier.LogEntry{entry(300, false, 19, "late", "")}); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, a, "late"); got.Status != tier.Committed || got.Partition != 21 {
		t.Fatalf("a commit of sealed partition 19: %+v, want it in 21", got)
	}
	if err := app.Seal(ctx, 20); err != nil {
		t.Fatalf("sealing again: %v", err)
	}
	// Expiry drops sealed and open partitions alike.
	if err := a.Drop(ctx, 22); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, a, "late"); got.Status != tier.Absent {
		t.Fatalf("after Drop(22): %+v", got)
	}
	if held, err := a.Archived(ctx); err != nil || len(held) != 0 {
		t.Fatalf("Archived after Drop(22): %v, %v", held, err)
	}
}
