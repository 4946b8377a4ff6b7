package tiertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// OpenArchive returns an archive backend over fresh, empty storage for one
// check (a directory, a table): every call of it within one check names
// the same storage, so a check can reopen it. The caller cleans up through
// t.
type OpenArchive func(t *testing.T) tier.ArchiveBackend

// archiveEnv is the environment every archive check opens with: hour
// partitions and a 30-hour window.
func archiveEnv() tier.ArchiveEnv {
	return tier.ArchiveEnv{
		Partitions: tier.Partitions{Length: int64(time.Hour), Live: 5}, Window: 30 * time.Hour,
		Owner: "tiertest", Check: [16]byte{1, 2, 3}, Logger: log.New(io.Discard, "", 0),
	}
}

func records(n int, tag string) []tier.Record {
	out := make([]tier.Record, n)
	for i := range out {
		out[i] = tier.Record{NS: []byte("ns"), Key: fmt.Appendf(nil, "%s-%06d", tag, i)}
		if i%3 == 0 {
			out[i].Digest = tier.Digest{byte(i), 1}
		}
		if i%5 == 0 {
			out[i].At, out[i].Result = int64(i+1), fmt.Appendf(nil, "result %d", i)
		}
	}
	return out
}

func scanOf(recs []tier.Record) func(func(*tier.Record) error) error {
	return func(put func(*tier.Record) error) error {
		for i := range recs {
			r := recs[i]
			if err := put(&r); err != nil {
				return err
			}
		}
		return nil
	}
}

func openArchive(t *testing.T, b tier.ArchiveBackend, env tier.ArchiveEnv) tier.Archive {
	t.Helper()
	a, err := b.Open(context.Background(), env)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// RunArchive checks the promises of tier.Archive on archives open returns.
func RunArchive(t *testing.T, open OpenArchive) {
	t.Run("put-lookup", func(t *testing.T) { archivePutLookup(t, open) })
	t.Run("put-all-or-nothing", func(t *testing.T) { archivePutAllOrNothing(t, open) })
	t.Run("forget-drop", func(t *testing.T) { archiveForgetDrop(t, open) })
	t.Run("blobs", func(t *testing.T) { archiveBlobs(t, open) })
	t.Run("layout", func(t *testing.T) { archiveLayout(t, open) })
	t.Run("long-keys", func(t *testing.T) { archiveLongKeys(t, open) })
}

// archivePutLookup is RunArchive's "put-lookup".
func archivePutLookup(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "Put stores partition p's records ... after it returns nil,
	// Archived lists p"; "Lookup answers each query: Committed, with
	// Partition, Digest, At and Result (a copy), from the newest
	// partition in [From, To) holding the key, or Absent."
	a := openArchive(t, open(t), archiveEnv())
	r10, r11 := records(50, "k"), records(20, "k")
	r11[0].Digest = tier.Digest{9}
	for p, recs := range map[int64][]tier.Record{10: r10, 11: r11} {
		if err := a.Put(ctx, p, scanOf(recs)); err != nil {
			t.Fatalf("Put %d: %v", p, err)
		}
	}
	held, err := a.Archived(ctx)
	if err != nil || len(held) != 2 || held[0] != 10 || held[1] != 11 {
		t.Fatalf("Archived: %v, %v; want [10 11]", held, err)
	}
	qs := []tier.ArchiveQuery{
		{NS: "ns", Key: r10[0].Key, From: 0, To: 100},  // in 10 and 11: the newest
		{NS: "ns", Key: r10[0].Key, From: 0, To: 11},   // 11 outside the span
		{NS: "ns", Key: r10[30].Key, From: 0, To: 100}, // only in 10
		{NS: "ns", Key: r10[30].Key, From: 11, To: 100},
		{NS: "other", Key: r10[30].Key, From: 0, To: 100},
		{NS: "ns", Key: []byte("never"), From: 0, To: 100},
		{NS: "ns", Key: r10[5].Key, From: 10, To: 11}, // a result
	}
	out := make([]tier.Answer, len(qs))
	if err := a.Lookup(ctx, qs, out); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		st   tier.Status
		part int64
	}{{tier.Committed, 11}, {tier.Committed, 10}, {tier.Committed, 10}, {tier.Absent, 0}, {tier.Absent, 0}, {tier.Absent, 0}, {tier.Committed, 10}}
	for i, w := range want {
		if out[i].Status != w.st || (w.st == tier.Committed && out[i].Partition != w.part) {
			t.Errorf("query %d: %v in %d, want %v in %d", i, out[i].Status, out[i].Partition, w.st, w.part)
		}
	}
	if out[0].Digest != (tier.Digest{9}) || out[1].Digest != r10[0].Digest {
		t.Errorf("digests %x %x, want %x %x", out[0].Digest, out[1].Digest, tier.Digest{9}, r10[0].Digest)
	}
	if out[6].At != r10[5].At || !bytes.Equal(out[6].Result, r10[5].Result) {
		t.Errorf("result %q at %d, want %q at %d", out[6].Result, out[6].At, r10[5].Result, r10[5].At)
	}
	// Putting a partition already held replaces nothing.
	if err := a.Put(ctx, 10, scanOf(records(3, "z"))); err != nil {
		t.Fatal(err)
	}
	if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: []byte("z-000001"), From: 0, To: 100}}, out[:1]); err != nil || out[0].Status != tier.Absent {
		t.Fatalf("a second Put of a held partition wrote: %v, %v", out[0].Status, err)
	}
}

// archivePutAllOrNothing is RunArchive's "put-all-or-nothing".
func archivePutAllOrNothing(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "all or nothing ... after a failure or a crash, p is absent or
	// whole."
	b := open(t)
	a := openArchive(t, b, archiveEnv())
	recs := records(100, "k")
	boom := errors.New("scan failed")
	err := a.Put(ctx, 7, func(put func(*tier.Record) error) error {
		for i := range recs[:60] {
			if err := put(&recs[i]); err != nil {
				return err
			}
		}
		return boom
	})
	if err == nil {
		t.Fatal("Put whose scan failed returned nil")
	}
	held, err := a.Archived(ctx)
	if err != nil || len(held) != 0 {
		t.Fatalf("Archived after a failed Put: %v, %v", held, err)
	}
	out := make([]tier.Answer, 1)
	if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: recs[1].Key, From: 0, To: 100}}, out); err != nil || out[0].Status != tier.Absent {
		t.Fatalf("a record of a failed Put: %v, %v", out[0].Status, err)
	}
	if err := a.Put(ctx, 7, scanOf(recs)); err != nil {
		t.Fatalf("Put after a failed one: %v", err)
	}
	var n int
	if err := a.Scan(ctx, 7, func(ns, key []byte) error { n++; return nil }); err != nil || n != len(recs) {
		t.Fatalf("Scan: %d keys, %v; want %d", n, err, len(recs))
	}
}

// archiveForgetDrop is RunArchive's "forget-drop".
func archiveForgetDrop(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "Forget removes the key from every partition in [From, To),
	// durably, and answers what it found"; "Drop deletes every
	// partition before `before`".
	b := open(t)
	a := openArchive(t, b, archiveEnv())
	for p := int64(1); p <= 4; p++ {
		if err := a.Put(ctx, p, scanOf(records(10, "k"))); err != nil {
			t.Fatal(err)
		}
	}
	key := records(10, "k")[4].Key
	out := make([]tier.Answer, 1)
	if err := a.Forget(ctx, []tier.ArchiveQuery{{NS: "ns", Key: key, From: 2, To: 4}}, out); err != nil || out[0].Status != tier.Committed || out[0].Partition != 3 {
		t.Fatalf("Forget: %+v, %v; want committed in 3", out[0], err)
	}
	for p, want := range map[int64]tier.Status{1: tier.Committed, 2: tier.Absent, 3: tier.Absent, 4: tier.Committed} {
		if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: key, From: p, To: p + 1}}, out); err != nil || out[0].Status != want {
			t.Errorf("partition %d after Forget: %v, %v; want %v", p, out[0].Status, err, want)
		}
	}
	if err := a.Drop(ctx, 3); err != nil {
		t.Fatal(err)
	}
	held, err := a.Archived(ctx)
	if err != nil || len(held) != 2 || held[0] != 3 {
		t.Fatalf("Archived after Drop(3): %v, %v", held, err)
	}
	other := records(10, "k")[1].Key
	if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: other, From: 0, To: 3}}, out); err != nil || out[0].Status != tier.Absent {
		t.Fatalf("a dropped partition's key: %v, %v", out[0].Status, err)
	}
	// Durable: a reopened archive agrees.
	_ = a.Close()
	a = openArchive(t, b, archiveEnv())
	if held, err := a.Archived(ctx); err != nil || len(held) != 2 {
		t.Fatalf("Archived after reopening: %v, %v", held, err)
	}
	if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: key, From: 0, To: 5}}, out); err != nil || out[0].Partition != 4 {
		t.Fatalf("after reopening: %+v, %v; want committed in 4", out[0], err)
	}
}

// archiveBlobs is RunArchive's "blobs".
func archiveBlobs(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "PutBlob stores the bytes write produces under name, replacing
	// any blob of that name"; Blob, Blobs, DeleteBlob.
	a := openArchive(t, open(t), archiveEnv())
	big := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB: chunked where the store chunks
	for _, put := range []struct {
		name string
		data []byte
	}{{"filter-1", []byte("first")}, {"filter-2", big}, {"filter-1", []byte("second")}} {
		if err := a.PutBlob(ctx, put.name, func(w io.Writer) error { _, err := w.Write(put.data); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.PutBlob(ctx, "filter-3", func(io.Writer) error { return errors.New("write failed") }); err == nil {
		t.Fatal("PutBlob whose write failed returned nil")
	}
	names, err := a.Blobs(ctx)
	if err != nil || len(names) != 2 || names[0] != "filter-1" || names[1] != "filter-2" {
		t.Fatalf("Blobs: %v, %v", names, err)
	}
	for name, want := range map[string][]byte{"filter-1": []byte("second"), "filter-2": big} {
		b, ok, err := a.Blob(ctx, name)
		if err != nil || !ok {
			t.Fatalf("Blob %s: %v, %v", name, ok, err)
		}
		got := make([]byte, b.Size())
		if _, err := b.ReadAt(got, 0); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		_ = b.Close()
		if !bytes.Equal(got, want) {
			t.Errorf("Blob %s: %d bytes, want %d", name, len(got), len(want))
		}
	}
	if err := a.DeleteBlob(ctx, "filter-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := a.Blob(ctx, "filter-1"); ok || err != nil {
		t.Fatalf("a deleted blob: %v, %v", ok, err)
	}
	if err := a.DeleteBlob(ctx, "filter-9"); err != nil {
		t.Fatalf("deleting a missing blob: %v", err)
	}
}

// archiveLayout is RunArchive's "layout".
func archiveLayout(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "Open ... (ErrLayout for an archive of another owner, secret,
	// partition length or format, or a shorter window)"; a window may
	// grow, never shrink, and grows only by GrowWindow.
	b := open(t)
	a := openArchive(t, b, archiveEnv())
	_ = a.Close()
	for name, change := range map[string]func(*tier.ArchiveEnv){
		"owner":     func(e *tier.ArchiveEnv) { e.Owner = "another" },
		"check":     func(e *tier.ArchiveEnv) { e.Check[0] = 9 },
		"partition": func(e *tier.ArchiveEnv) { e.Partitions.Length = int64(2 * time.Hour) },
		"shorter":   func(e *tier.ArchiveEnv) { e.Window = 20 * time.Hour },
	} {
		env := archiveEnv()
		change(&env)
		if a, err := b.Open(ctx, env); !errors.Is(err, tier.ErrLayout) {
			if err == nil {
				_ = a.Close()
			}
			t.Errorf("another %s: %v, want ErrLayout", name, err)
		}
	}
	env := archiveEnv()
	env.Window = 40 * time.Hour
	// Opened with a longer window and closed without GrowWindow (the
	// engine's Open refused after the archive opened): nothing recorded,
	// the recorded window still opens.
	a = openArchive(t, b, env)
	_ = a.Close()
	a = openArchive(t, b, archiveEnv())
	_ = a.Close()
	a = openArchive(t, b, env)
	g, ok := a.(tier.ArchiveWindowGrower)
	if !ok {
		t.Fatalf("%T records a window at Open: it must leave a longer one to GrowWindow (tier.ArchiveWindowGrower)", a)
	}
	if err := g.GrowWindow(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.GrowWindow(ctx); err != nil { // again: nothing more to record
		t.Fatal(err)
	}
	_ = a.Close()
	if a, err := b.Open(ctx, archiveEnv()); !errors.Is(err, tier.ErrLayout) {
		if err == nil {
			_ = a.Close()
		}
		t.Errorf("back to the shorter window after a longer one: %v, want ErrLayout", err)
	}
}

// archiveLongKeys is RunArchive's "long-keys".
func archiveLongKeys(t *testing.T, open OpenArchive) {
	ctx := context.Background()
	// "No single entry can stop an archiver": keys up to the engine's
	// largest (64 KiB; a PostgreSQL index entry holds about 2.7 kB)
	// and results up to MaxResultSize are stored, found, scanned
	// whole and forgotten, beside short keys of the same partition.
	a := openArchive(t, open(t), archiveEnv())
	recs := records(4, "short")
	rng := rand.New(rand.NewPCG(uint64(len(recs)), 12))
	for _, n := range []int{1024, 1025, 3000, 64 << 10} {
		key := make([]byte, n) // random: PostgreSQL compresses nothing of it
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		recs = append(recs, tier.Record{NS: []byte("ns"), Key: key, Digest: tier.Digest{byte(n)}, At: int64(n), Result: bytes.Repeat([]byte("r"), 4<<20)})
	}
	sorted := slices.Clone(recs) // Put takes a partition's records in key order
	slices.SortFunc(sorted, func(x, y tier.Record) int { return bytes.Compare(x.Key, y.Key) })
	if err := a.Put(ctx, 12, scanOf(sorted)); err != nil {
		t.Fatalf("Put of long keys: %v", err)
	}
	qs := make([]tier.ArchiveQuery, len(recs))
	for i := range recs {
		qs[i] = tier.ArchiveQuery{NS: "ns", Key: recs[i].Key, From: 0, To: 100}
	}
	out := make([]tier.Answer, len(qs))
	if err := a.Lookup(ctx, qs, out); err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if out[i].Status != tier.Committed || out[i].Digest != recs[i].Digest || !bytes.Equal(out[i].Result, recs[i].Result) {
			t.Errorf("key of %d bytes: %v, digest %x", len(recs[i].Key), out[i].Status, out[i].Digest)
		}
	}
	// A key that shares a long key's first bytes is another key.
	other := bytes.Clone(recs[len(recs)-2].Key)
	other[len(other)-1] ^= 1
	if err := a.Lookup(ctx, []tier.ArchiveQuery{{NS: "ns", Key: other, From: 0, To: 100}}, out[:1]); err != nil || out[0].Status != tier.Absent {
		t.Errorf("a long key differing in its last byte: %v, %v; want absent", out[0].Status, err)
	}
	seen := map[string]bool{}
	if err := a.Scan(ctx, 12, func(ns, key []byte) error { seen[string(key)] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if !seen[string(recs[i].Key)] {
			t.Errorf("Scan did not return the key of %d bytes whole", len(recs[i].Key))
		}
	}
	if err := a.Forget(ctx, qs[4:], out[4:]); err != nil {
		t.Fatal(err)
	}
	if err := a.Lookup(ctx, qs, out); err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if want := map[bool]tier.Status{true: tier.Absent, false: tier.Committed}[i >= 4]; out[i].Status != want {
			t.Errorf("after Forget of the long keys, key of %d bytes: %v, want %v", len(recs[i].Key), out[i].Status, want)
		}
	}
}
