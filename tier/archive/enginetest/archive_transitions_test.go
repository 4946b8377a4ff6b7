package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// eachArchive runs f with the files archive and the PostgreSQL archive.
func eachArchive(t *testing.T, f func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend)) {
	t.Run("files", func(t *testing.T) { f(t, filesArchive) })
	t.Run("postgres", func(t *testing.T) {
		p := postgresPool(t)
		table := fmt.Sprintf("engine_archt_%d", time.Now().UnixNano()%1e9)
		t.Cleanup(func() {
			for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
				_, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
			}
		})
		f(t, func(vfs.FS) tier.ArchiveBackend { return postgres.Archive{DB: p, Table: table} })
	})
}

// TestArchiveWindowChanges: the hot Window lengthened on reopen (7 days,
// then 10, 13, 16; it may never shrink) keeps every key inside the 21-day archive
// window a Duplicate: the keys committed between the old and the new
// window, dropped from the hot store, are read from the archive. Lookup,
// Claim and MarkBatch agree, and MarkBatch marks none of them again.
func TestArchiveWindowChanges(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		for _, w := range []int{10, 13, 16} {
			for range 9 {
				r.commitDay()
			}
			waitArchived(t, r.e)
			if err := r.e.Close(); err != nil {
				t.Fatal(err)
			}
			r.window = time.Duration(w) * day
			r.open()
			if bad := r.check(); len(bad) > 0 {
				t.Fatalf("after day %d, reopened with a %d-day window: %d wrong answers, first: %s", r.days, w, len(bad), bad[0])
			}
			// Every key of the last 20 days: Duplicate to Claim and
			// MarkBatch too, nothing marked again.
			ctx := context.Background()
			for d := max(0, r.days-20); d < r.days; d++ {
				keys := [][]byte{archiveKey(d, 1), archiveKey(d, 2)}
				out := make([]engine.Outcome, 2)
				if err := r.e.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Fatal(err)
				}
				c, err := r.e.Claim(ctx, archiveKey(d, 3))
				if err != nil {
					t.Fatal(err)
				}
				if out[0] != engine.Duplicate || out[1] != engine.Duplicate || c.Outcome != engine.Duplicate {
					t.Fatalf("window %d days, day %d (age %d): MarkBatch %v, Claim %v; want Duplicate", w, d, r.days-d, out, c.Outcome)
				}
			}
		}
		_ = r.e.Close()
	})
}

// TestArchiveLongKeys: keys up to MaxKeySize (4 KiB here; a PostgreSQL
// index entry holds about 2.7 kB) are archived with their partition,
// which the exact tier then drops, and answered Duplicate from the
// archive; a long key never stops the archiving of the partitions after
// its own.
func TestArchiveLongKeys(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		r := newArchiveRun(t, archive)
		_ = r.e.Close()
		o := archiveOptions(r.clock, r.fs, r.archive)
		o.MaxKeySize = 4096
		r.e = open(t, o)
		defer func() { _ = r.e.Close() }()
		ctx := context.Background()
		long := make([][]byte, 3)
		rng := rand.New(rand.NewPCG(7, 11))
		for i := range long {
			long[i] = make([]byte, 2800+600*i)
			for j := range long[i] {
				long[i][j] = byte(rng.Uint32()) // nothing to compress into an index entry
			}
		}
		out := make([]engine.Outcome, len(long))
		if err := r.e.MarkBatch(ctx, long, nil, out); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		info := make([]engine.KeyInfo, len(long))
		if err := r.e.LookupBatch(ctx, long, info); err != nil {
			t.Fatal(err)
		}
		for i := range long {
			if info[i].Outcome != engine.Duplicate || info[i].Source != engine.SourceArchive {
				t.Fatalf("key of %d bytes, 10 days on: %v from %v, want Duplicate from the archive", len(long[i]), info[i].Outcome, info[i].Source)
			}
		}
		if st := r.e.Stats(); st.Archive.Failures > 0 {
			t.Fatalf("%d archiving passes failed", st.Archive.Failures)
		}
	})
}

// TestArchiveDetach: a store whose partitions went to an archive is
// refused without it (ErrLayout), as the Redis tier refuses a process
// without its log; DetachArchive lets the history go. A key forgotten
// while detached is not brought back: the detached archive is refused
// from then on (ErrLayout), and a new, empty archive is taken.
func TestArchiveDetach(t *testing.T) {
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
		o := archiveOptions(r.clock, r.fs, r.archive)
		o.Archive, o.ArchiveWindow = nil, 0
		if e, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
			if err == nil {
				_ = e.Close()
			}
			t.Fatalf("a store that archived, opened without its archive: %v, want ErrLayout", err)
		}
		bad := o
		bad.DetachArchive, bad.Archive = true, r.archive
		if _, err := engine.Open(&bad); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("DetachArchive with an Archive: %v, want ErrOptions", err)
		}
		o.DetachArchive = true
		e := open(t, o)
		// Forgotten while detached: the compensated effect of a key the
		// store still holds (day 6: inside the window).
		if _, err := e.Forget(ctx, archiveKey(6, 1)); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if e, err := engine.Open(ptr(archiveOptions(r.clock, r.fs, r.archive))); !errors.Is(err, engine.ErrLayout) {
			if err == nil {
				in, _ := e.Lookup(ctx, archiveKey(6, 1))
				_ = e.Close()
				t.Fatalf("the detached archive attached again (the key forgotten meanwhile: %v), want ErrLayout", in.Outcome)
			}
			t.Fatalf("the detached archive attached again: %v, want ErrLayout", err)
		}
		o = archiveOptions(r.clock, r.fs, archive2(t, r.fs))
		e = open(t, o)
		defer e.Close()
		if in, err := e.Lookup(ctx, archiveKey(6, 1)); err != nil || in.Outcome != engine.New {
			t.Fatalf("the key forgotten while detached, with a new archive: %+v, %v; want New", in, err)
		}
		if in, err := e.Lookup(ctx, archiveKey(6, 2)); err != nil || in.Outcome != engine.Duplicate {
			t.Fatalf("a key of the store's window, with a new archive: %+v, %v; want Duplicate", in, err)
		}
	})
}

// archive2 is another, empty archive of the kind the test runs: a second
// directory, or a second table.
func archive2(t *testing.T, fs vfs.FS) tier.ArchiveBackend {
	if strings.HasSuffix(t.Name(), "files") {
		return pebble.ArchiveDir{Dir: "archive2", FS: fs}
	}
	p := postgresPool(t)
	table := fmt.Sprintf("engine_archt2_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
			_, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
		}
	})
	return postgres.Archive{DB: p, Table: table}
}

// forgetGate is b with Forget failing while down is set.
func forgetGate(b tier.ArchiveBackend, down *atomic.Bool) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return forgetGateStore{a, down} }}
}

type forgetGateStore struct {
	tier.Archive
	down *atomic.Bool
}

func (g forgetGateStore) Forget(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	if g.down.Load() {
		return errors.New("archive down")
	}
	return g.Archive.Forget(ctx, qs, out)
}

// TestArchiveForgetUnavailable: what docs/archive.md says of a Forget
// the archive cannot take: ErrUnavailable after the hot store's delete,
// the key then Duplicate from the archive if its partition was archived
// and New if not; the Forget repeated removes it everywhere.
func TestArchiveForgetUnavailable(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		down := new(atomic.Bool)
		r := newArchiveRun(t, func(fs vfs.FS) tier.ArchiveBackend { return forgetGate(archive(fs), down) })
		defer func() { _ = r.e.Close() }()
		for range 4 {
			r.commitDay()
		}
		waitArchived(t, r.e)
		ctx := context.Background()
		archived, fresh := archiveKey(1, 5), []byte("today") // today's partition is not archived
		if o, err := r.e.MarkIfAbsent(ctx, fresh); err != nil || o != engine.New {
			t.Fatalf("mark of today's key: %v, %v", o, err)
		}
		down.Store(true)
		for _, k := range [][]byte{archived, fresh} {
			if _, err := r.e.Forget(ctx, k); !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("Forget of %s with the archive down: %v, want ErrUnavailable", k, err)
			}
		}
		down.Store(false)
		for k, want := range map[string]engine.Outcome{string(archived): engine.Duplicate, string(fresh): engine.New} {
			if in, err := r.e.Lookup(ctx, []byte(k)); err != nil || in.Outcome != want {
				t.Fatalf("%s after a Forget the archive refused: %+v, %v; want %v", k, in, err, want)
			}
		}
		for _, k := range [][]byte{archived, fresh} {
			if _, err := r.e.Forget(ctx, k); err != nil {
				t.Fatal(err)
			}
			if in, err := r.e.Lookup(ctx, k); err != nil || in.Outcome != engine.New {
				t.Fatalf("%s after the Forget repeated: %+v, %v; want New", k, in, err)
			}
		}
	})
}

// TestArchiveLookupRacesTheArchiver: a Lookup (and a claim) of a key in a
// partition that left the window before the archiver took it, while the
// archiver moves that partition to the archive and the exact tier drops it
// between the lookup's two reads, still finds the key. The lookup read the
// archiver's position once, before reading the exact tier: the partition
// was then past the archive's range and gone from the exact tier, so the
// key was New (it showed as an acknowledged key lost after a kill while
// archiving, under load). Both archives.
func TestArchiveLookupRacesTheArchiver(t *testing.T) {
	eachArchive(t, func(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
		gate := make(chan struct{})
		inPut := make(chan struct{}, 1)
		passEnd := make(chan struct{}, 1)
		var armed, raced atomic.Bool
		var once sync.Once
		release := func() { once.Do(func() { close(gate) }) }
		enginetest.SetInArchive(func(stage string) {
			switch stage {
			case "put":
				select {
				case inPut <- struct{}{}:
				default:
				}
				<-gate
			case "drop":
				select {
				case passEnd <- struct{}{}:
				default:
				}
			case "lagging":
				if armed.CompareAndSwap(true, false) {
					// The archiver archives the partition and drops it
					// from the exact tier now, between the two reads.
					release()
					select {
					case <-passEnd:
						time.Sleep(200 * time.Millisecond) // its drop follows the hook
						raced.Store(true)
					case <-time.After(20 * time.Second):
					}
				}
			}
		})
		t.Cleanup(func() { enginetest.SetInArchive(nil); release() })

		fs := vfs.NewMem()
		clock := newClock()
		o := archiveOptions(clock, fs, archive(fs))
		o.Window, o.Partition, o.ArchiveWindow = 4*time.Hour, time.Hour, 12*time.Hour
		e := open(t, o)
		defer e.Close()
		defer release() // before Close, which waits for the archiver
		ctx := context.Background()
		keys := make([][]byte, 100)
		out := make([]engine.Outcome, len(keys))
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "raced-%d", i)
		}
		if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		// The partition closes; the archiver holds inside its Put.
		for range 3 {
			clock.Add(time.Hour)
			if _, err := e.MarkIfAbsent(ctx, []byte("tick")); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-inPut:
		case <-time.After(20 * time.Second):
			t.Fatal("the archiver did not reach its Put")
		}
		// Past the window; the exact tier keeps the partition, unarchived.
		clock.Add(3 * time.Hour)
		if _, err := e.MarkIfAbsent(ctx, []byte("tock")); err != nil {
			t.Fatal(err)
		}
		// Every closed partition in the window sealed (older ones need no
		// seal), so that the archiver, let go,
		// archives them all and ends its pass with the drop.
		for deadline := time.Now().Add(20 * time.Second); e.Stats().Bloom.Sealed < 4; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) { // the 4 closed partitions still in the window
				t.Fatalf("%d of the 4 closed partitions in the window are sealed", e.Stats().Bloom.Sealed)
			}
		}
		for len(passEnd) > 0 {
			<-passEnd
		}
		armed.Store(true)
		infos := make([]engine.KeyInfo, len(keys))
		if err := e.LookupBatch(ctx, keys, infos); err != nil {
			t.Fatal(err)
		}
		if !raced.Load() {
			t.Fatal("the lookup did not meet the archiver")
		}
		for i, in := range infos {
			if in.Outcome != engine.Duplicate {
				t.Fatalf("key %s, archived and dropped during its lookup: %v from %v", keys[i], in.Outcome, in.Source)
			}
		}
		if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if o != engine.Duplicate {
				t.Fatalf("key %s marked again: %v", keys[i], o)
			}
		}
	})
}
