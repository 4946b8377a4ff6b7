package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// TestAdversarialArchiveSwappedForEmpty: The archive-detach rules. A store that archived
// partitions, reopened with another, empty archive instead of its own
// (no DetachArchive), must be refused (ErrLayout): the keys the store
// dropped would be New. And a detach, then a new archive, then a second
// detach: neither earlier archive is taken back.
func TestAdversarialArchiveSwappedForEmpty(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		for range 10 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		if err := r.e.Close(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		a2 := archive2(t, r.fs)
		o2 := archiveOptions(r.clock, r.fs, a2)
		if e, err := engine.Open(&o2); !errors.Is(err, engine.ErrLayout) {
			if err == nil {
				in, _ := e.Lookup(ctx, archiveKey(1, 1))
				_ = e.Close()
				t.Fatalf("store that archived days 0..2, opened with another, empty archive: opened (day 1 key %v from %v), want ErrLayout", in.Outcome, in.Source)
			}
			t.Fatalf("opened with another, empty archive: %v, want ErrLayout", err)
		}
		// The store's own archive still opens and answers.
		e := open(t, archiveOptions(r.clock, r.fs, r.archive))
		if in, err := e.Lookup(ctx, archiveKey(1, 1)); err != nil || in.Outcome != engine.Duplicate {
			t.Fatalf("day 1 key with its own archive after the refused swap: %+v %v", in, err)
		}
		_ = e.Close()
		// Detach, attach a2, move more days to a2, detach again.
		od := archiveOptions(r.clock, r.fs, nil)
		od.Archive, od.ArchiveWindow, od.DetachArchive = nil, 0, true
		e = open(t, od)
		_ = e.Close()
		r.archive = thirdArchive(t, r.fs, archive2(t, r.fs))
		r.open()
		for range 3 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		_ = r.e.Close()
		e = open(t, od)
		_ = e.Close()
		for name, a := range map[string]tier.ArchiveBackend{"first": archive(r.fs), "third": r.archive} {
			if e, err := engine.Open(ptr(archiveOptions(r.clock, r.fs, a))); !errors.Is(err, engine.ErrLayout) {
				if err == nil {
					_ = e.Close()
				}
				t.Fatalf("the %s archive, detached, attached again: %v, want ErrLayout", name, err)
			}
		}
	})
}

// TestAdversarialWindowAndArchiveWindowLengthened: the window lengthened on reopen, with the archive
// filter's layout changing on the same reopen (ArchiveWindow 21 → 70
// days: its group of partitions per filter slot goes 1 → 3, so every
// saved filter blob is refused and the partitions are scanned back) and
// ExpectedKeys changed. Every key inside the old archive window that the
// archive still held stays Duplicate, read from the archive; Claim and
// MarkBatch agree.
func TestAdversarialWindowAndArchiveWindowLengthened(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		for range 12 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		if err := r.e.Close(); err != nil {
			t.Fatal(err)
		}
		o := archiveOptions(r.clock, r.fs, r.archive)
		o.Window, o.ArchiveWindow, o.ExpectedKeys = 11*day, 70*day, 3000
		e := open(t, o)
		defer e.Close()
		ctx := context.Background()
		check := func(when string) {
			for d := range r.days {
				keys := make([][]byte, r.perDay)
				for i := range keys {
					keys[i] = archiveKey(d, i)
				}
				info := make([]engine.KeyInfo, len(keys))
				if err := e.LookupBatch(ctx, keys, info); err != nil {
					t.Fatal(err)
				}
				for i, in := range info {
					if in.Outcome != engine.Duplicate {
						t.Fatalf("%s: day %d (age %d) key %d: %v, want Duplicate", when, d, r.days-d, i, in.Outcome)
					}
				}
				out := make([]engine.Outcome, 1)
				if err := e.MarkBatch(ctx, keys[:1], nil, out); err != nil || out[0] != engine.Duplicate {
					t.Fatalf("%s: MarkBatch of day %d: %v %v", when, d, out[0], err)
				}
			}
		}
		check("reopened with 11/70 days")
		// Some days later, the new window moving on; keys stay Duplicate.
		for range 5 {
			out := make([]engine.Outcome, 1)
			if err := e.MarkBatch(ctx, [][]byte{fmt.Appendf(nil, "later-%d", r.days)}, nil, out); err != nil {
				t.Fatal(err)
			}
			r.days++
			r.clock.Add(day)
		}
		waitArchived(t, e)
		r.days -= 5
		check("5 days later")
	})
}

// thirdArchive is a third, empty archive: another directory for files
// (archive2's directory is taken), archive2's new table for PostgreSQL.
func thirdArchive(t *testing.T, fs vfs.FS, pg tier.ArchiveBackend) tier.ArchiveBackend {
	if strings.HasSuffix(t.Name(), "files") {
		return pebble.ArchiveDir{Dir: "archive3", FS: fs}
	}
	return pg
}

// TestAdversarialRefusedOpenTakesEmptyArchive: docs/archive.md says a new, empty archive
// can be attached after DetachArchive. An Open that was refused
// (ErrLayout: the store archived partitions elsewhere) must leave the
// empty archive it was given as it was; here the refused Open records the
// store's pre-detach owner in it, so after DetachArchive that empty
// archive is refused for good.
func TestAdversarialRefusedOpenTakesEmptyArchive(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		for range 10 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		if err := r.e.Close(); err != nil {
			t.Fatal(err)
		}
		a2 := archive2(t, r.fs)
		if e, err := engine.Open(ptr(archiveOptions(r.clock, r.fs, a2))); !errors.Is(err, engine.ErrLayout) {
			if err == nil {
				_ = e.Close()
			}
			t.Fatalf("opened with another, empty archive: %v, want ErrLayout", err)
		}
		od := archiveOptions(r.clock, r.fs, nil)
		od.Archive, od.ArchiveWindow, od.DetachArchive = nil, 0, true
		e := open(t, od)
		_ = e.Close()
		e, err := engine.Open(ptr(archiveOptions(r.clock, r.fs, a2)))
		if err != nil {
			t.Fatalf("after DetachArchive, the new archive that holds nothing (only a refused Open saw it): %v, want it attached", err)
		}
		_ = e.Close()
	})
}

// TestAdversarialArchiveLongKeyForms: The PostgreSQL archive's long-key form at its boundary. Keys of 1,024
// bytes (stored whole) and 1,025+ bytes (stored hashed: first 993 bytes +
// SHA-256) sharing their first 1,000 bytes, and two long keys that differ
// only after byte 993, are archived, then looked up, claimed and one of
// them forgotten: each is its own key (the unmarked sibling New, the
// others Duplicate from the archive, the forgotten one New).
func TestAdversarialArchiveLongKeyForms(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		_ = r.e.Close()
		o := archiveOptions(r.clock, r.fs, r.archive)
		o.MaxKeySize = 4096
		r.e = open(t, o)
		defer func() { _ = r.e.Close() }()
		ctx := context.Background()
		prefix := make([]byte, 1000)
		for i := range prefix {
			prefix[i] = byte(i*7 + 3)
		}
		mk := func(tail string) []byte { return append(append([]byte(nil), prefix...), tail...) }
		whole := mk(strings.Repeat("a", 24))            // 1,024: whole
		hashed := mk(strings.Repeat("a", 25))           // 1,025: hashed
		hashedTail := mk(strings.Repeat("a", 24) + "b") // 1,025, differs in its last byte
		never := mk(strings.Repeat("a", 26))            // 1,026: never marked
		long := mk(strings.Repeat("z", 2000))
		longSibling := mk(strings.Repeat("z", 1999) + "y")
		marked := [][]byte{whole, hashed, hashedTail, long, longSibling}
		out := make([]engine.Outcome, len(marked))
		if err := r.e.MarkBatch(ctx, marked, nil, out); err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if o != engine.New {
				t.Fatalf("first mark of key %d: %v", i, o)
			}
		}
		for range 10 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		all := append(append([][]byte(nil), marked...), never)
		want := []engine.Outcome{engine.Duplicate, engine.Duplicate, engine.Duplicate, engine.Duplicate, engine.Duplicate, engine.New}
		lookup := func(when string) {
			info := make([]engine.KeyInfo, len(all))
			if err := r.e.LookupBatch(ctx, all, info); err != nil {
				t.Fatal(err)
			}
			for i := range all {
				if info[i].Outcome != want[i] {
					t.Fatalf("%s: key %d (%d bytes): %v from %v, want %v", when, i, len(all[i]), info[i].Outcome, info[i].Source, want[i])
				}
			}
		}
		lookup("10 days on")
		if _, err := r.e.Forget(ctx, hashed); err != nil {
			t.Fatal(err)
		}
		want[1] = engine.New
		lookup("after forgetting the 1,025-byte key")
		if _, err := r.e.Forget(ctx, long); err != nil {
			t.Fatal(err)
		}
		want[3] = engine.New
		lookup("after forgetting the 3,000-byte key")
		if st := r.e.Stats(); st.Archive.Failures > 0 {
			t.Fatalf("%d archiving passes failed", st.Archive.Failures)
		}
	})
}

// putLostGate wraps an archive backend: while lost is set, Put stores
// the partition and then fails, as a PostgreSQL COPY whose commit
// reached the server but whose reply was lost.
func putLostGate(b tier.ArchiveBackend, lost *atomic.Bool) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return putLostStore{a, lost} }}
}

type putLostStore struct {
	tier.Archive
	lost *atomic.Bool
}

func (g putLostStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	if err := g.Archive.Put(ctx, p, scan); err != nil {
		return err
	}
	if g.lost.Load() {
		return errors.New("i/o timeout (reply lost)")
	}
	return nil
}

// TestAdversarialArchivePutReplyLost: the reason a store refuses to open without its archive ("an archive attached again
// would bring back keys forgotten meanwhile") when the store never learnt
// that its first partition reached the archive (the Put applied, its
// reply lost). The store is then opened without the archive (it does not
// know it archived anything, so no DetachArchive is asked), a key of that
// partition is forgotten, and the archive is attached again: the
// forgotten key must stay New, or that Open be refused.
func TestAdversarialArchivePutReplyLost(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		lost := new(atomic.Bool)
		lost.Store(true)
		r := newArchiveRun(t, func(fs vfs.FS) tier.ArchiveBackend { return putLostGate(archive(fs), lost) })
		for range 3 {
			r.commitDay()
		}
		// Archiving passes run, every Put lands and reports a failure.
		deadline := time.Now().Add(10 * time.Second)
		for r.e.Stats().Archive.Failures < 2 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if r.e.Stats().Archive.Failures == 0 {
			t.Skip("no archiving pass ran")
		}
		if err := r.e.Close(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		o := archiveOptions(r.clock, r.fs, nil)
		o.Archive, o.ArchiveWindow = nil, 0
		e, err := engine.Open(&o)
		if err != nil {
			t.Skipf("opened without its archive: %v (the store knows)", err)
		}
		if in, err := e.Forget(ctx, archiveKey(0, 1)); err != nil || in.Outcome != engine.Duplicate {
			t.Fatalf("forget of a day-0 key: %+v %v", in, err)
		}
		_ = e.Close()
		lost.Store(false)
		e, err = engine.Open(ptr(archiveOptions(r.clock, r.fs, r.archive)))
		if err != nil {
			t.Logf("the archive attached again: refused (%v)", err)
			return
		}
		defer e.Close()
		in, err := e.Lookup(ctx, archiveKey(0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if in.Outcome != engine.New {
			t.Fatalf("a key forgotten while the store ran without its archive (which held the key's partition, the Put's reply lost) is %v from %v once the archive is attached again, want New", in.Outcome, in.Source)
		}
	})
}
