package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/enginetest"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestMovesImportIsDurable: an engine with sealed partitions (moved
// into the cold database) is exported and imported into another
// directory; Import returns nil, then the machine crashes (a crashable
// file system keeps only what was synced). The imported directory must
// open with every key a Duplicate: Import said it replaced the directory.
func TestMovesImportIsDurable(t *testing.T) {
	ctx := context.Background()
	fs := newCrashFS()
	clock := newClock()
	e, o, keys := sealedEngine(t, fs, clock, 4, 50)
	waitFor(t, "a partition moved", func() bool { return e.Stats().Store.ColdPartitions > 0 })
	if _, err := e.Export(ctx, "exp", 1); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	setDir(&o, "other")
	if _, err := importExport(ctx, "exp", &o, 0); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	names, _ := crashed.List("other")
	t.Logf("after the crash, other/ holds %d entries: %v", len(names), names)
	setFS(&o, crashed)
	e2, err := engine.Open(&o)
	if err != nil {
		t.Fatalf("open of the imported directory after a crash: %v", err)
	}
	defer e2.Close()
	allDuplicates(t, e2, keys)
}

// moveKey is one key of the model: what the engine acknowledged.
type moveKey struct {
	ns, key   string
	committed bool   // acknowledged commit (not forgotten since)
	at        int64  // engine time of the commit, or of the last release
	result    string // stored result, "" for none
	attempts  uint16 // failed claims counted (not committed keys)
}

// moveWorld drives an engine over hour partitions (4-hour window, five
// live), a namespace "short" with a 90-minute window, MaxAttempts 3 and a
// checkpoint every 40 keys, and keeps what was acknowledged.
type moveWorld struct {
	t     *testing.T
	fs    crashFS
	clock *fakeClock
	o     engine.Options
	e     *engine.Engine
	keys  map[string]*moveKey
	order []string
	n     int
	// live is the number of live partitions; keptFrom the oldest partition
	// not dropped when the window last grew.
	live     int64
	keptFrom int64
}

const moveShort = 90 * time.Minute

func newMoveWorld(t *testing.T) *moveWorld {
	enginetest.SetCheckpointKeys(40)
	t.Cleanup(func() { enginetest.SetCheckpointKeys(0) })
	w := &moveWorld{t: t, fs: newCrashFS(), clock: newClock(), keys: map[string]*moveKey{}, live: 5}
	w.o = engine.Options{Backend: &embedded.Backend{Dir: "db", FS: w.fs}, Clock: w.clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 2000,
		MaxAttempts: 3, Namespaces: map[string]engine.NamespaceOptions{"short": {Window: moveShort}}}
	w.e = open(t, w.o)
	return w
}

func (w *moveWorld) ns(name string) *engine.Namespace {
	n, err := w.e.Namespace(name)
	if err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *moveWorld) key(ns, k string) *moveKey {
	id := ns + "/" + k
	if m, ok := w.keys[id]; ok {
		return m
	}
	m := &moveKey{ns: ns, key: k}
	w.keys[id] = m
	w.order = append(w.order, id)
	return m
}

func (w *moveWorld) now() int64 { return w.clock.Now().UnixNano() }

// hour runs one hour of work: marks in both namespaces, stored results,
// failed claims (attempt counts), and a Forget of an older and a fresh key.
func (w *moveWorld) hour() {
	t, ctx := w.t, context.Background()
	w.n++
	h := w.n
	for _, ns := range []string{"", "short"} {
		keys := make([][]byte, 30)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "m-%d-%d", h, i)
		}
		out := make([]engine.Outcome, len(keys))
		if err := w.ns(ns).MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if o != engine.New {
				t.Fatalf("hour %d: fresh key %s/%s is %v", h, ns, keys[i], o)
			}
			m := w.key(ns, string(keys[i]))
			m.committed, m.at = true, w.now()
		}
	}
	for i := range 4 {
		k := fmt.Sprintf("r-%d-%d", h, i)
		o, res, err := w.e.DoResult(ctx, []byte(k), func(context.Context) ([]byte, error) { return []byte("res-" + k), nil })
		if err != nil || o != engine.New || string(res) != "res-"+k {
			t.Fatalf("DoResult %s: %v %q %v", k, o, res, err)
		}
		m := w.key("", k)
		m.committed, m.at, m.result = true, w.now(), "res-"+k
	}
	// Failed claims: a new key each hour, and one key failed once an hour
	// across every hour (its count grows across partitions).
	for _, k := range []string{fmt.Sprintf("a-%d", h), "a-every"} {
		m := w.key("", k)
		if m.attempts >= 3 {
			continue
		}
		c, err := w.e.Claim(ctx, []byte(k))
		if err != nil || c.Outcome != engine.New {
			t.Fatalf("claim %s: %v %v", k, c.Outcome, err)
		}
		if err := w.e.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		m.attempts++
		m.at = w.now()
	}
	// Forget a key of two hours ago (sealed, moved) and one of this hour.
	for _, id := range []string{fmt.Sprintf("/m-%d-0", h-2), fmt.Sprintf("/m-%d-1", h), fmt.Sprintf("short/m-%d-2", h-1)} {
		m, ok := w.keys[id]
		if !ok {
			continue
		}
		if _, err := w.ns(m.ns).Forget(ctx, []byte(m.key)); err != nil {
			t.Fatal(err)
		}
		m.committed, m.attempts = false, 0
	}
}

// want is what a Lookup of m must answer at engine time now.
func (w *moveWorld) want(m *moveKey, now int64) (engine.Outcome, uint16) {
	engineWindow := enginetest.Retention{Parts: tier.Partitions{Length: int64(time.Hour), Live: int(w.live)}}
	switch {
	case engineWindow.Gone(m.at, now) || m.at/int64(time.Hour) < w.keptFrom:
		return engine.New, 0
	case m.committed && m.ns == "short" && enginetest.Retention{Exact: moveShort}.Gone(m.at, now):
		return engine.New, 0
	case m.committed:
		return engine.Duplicate, 0
	case enginetest.Poisoned(m.attempts, 3):
		return engine.Poison, m.attempts
	}
	return engine.New, m.attempts
}

// check looks every key up and compares it with the model.
func (w *moveWorld) check(what string) {
	t, ctx := w.t, context.Background()
	waitWarm(t, w.e)
	now := w.now()
	bad, dups := 0, 0
	for _, id := range w.order {
		m := w.keys[id]
		info, err := w.ns(m.ns).Lookup(ctx, []byte(m.key))
		if err != nil {
			t.Fatalf("%s: Lookup %s: %v", what, id, err)
		}
		o, a := w.want(m, now)
		if o == engine.Duplicate {
			dups++
		}
		if m.ns == "" && m.key == "a-every" && o != engine.Poison {
			a = info.Attempts // its older counts may have expired with their partitions
		}
		ok := info.Outcome == o && info.Attempts == a
		if o == engine.Duplicate && m.result != "" {
			ok = ok && string(info.Result) == m.result && info.CommittedAt == m.at
		}
		if !ok {
			bad++
			if bad <= 5 {
				t.Errorf("%s: %s (at %v, committed %v, %d attempts): Lookup %v, %d attempts, result %q at %d; want %v, %d attempts, %q",
					what, id, time.Unix(0, m.at).UTC().Format("15:04"), m.committed, m.attempts, info.Outcome, info.Attempts, info.Result, info.CommittedAt, o, a, m.result)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d keys wrong", what, bad, len(w.order))
	}
	st := w.e.Stats()
	t.Logf("%s: %d keys (%d duplicates), mode %s, %d restored, %d journal keys, %d rebuilt, %d cold partitions moved",
		what, len(w.order), dups, st.Bloom.Mode, st.Bloom.Restored, st.Bloom.JournalKeys, st.Bloom.RebuiltKeys, st.Store.ColdPartitions)
}

// reopen crashes (CrashClone of the synced state) or closes the engine and
// opens it again with o changed by change (nil: as it was).
func (w *moveWorld) reopen(crash bool, change func(*engine.Options)) {
	if crash {
		w.fs = w.fs.CrashClone(vfs.CrashCloneCfg{})
		_ = w.e.Close()
	} else if err := w.e.Close(); err != nil {
		w.t.Fatal(err)
	}
	setFS(&w.o, w.fs)
	if change != nil {
		change(&w.o)
	}
	w.e = open(w.t, w.o)
}

// TestMovesModelAcrossMovesCrashesAndImport runs hours of marks,
// stored results, attempt counts and Forgets in two namespaces (one with a
// 90-minute window) while sealed partitions move to the cold database and
// the open one is checkpointed; crashes at several points, a clean
// restart, an export imported into another directory, and a reopen with a
// longer window; after each, every key must answer as acknowledged
// (Duplicate with its result inside its window, New after it or after
// Forget, its attempt count), and after each crash the filters must be
// warm at Open from the checkpoints.
func TestMovesModelAcrossMovesCrashesAndImport(t *testing.T) {
	w := newMoveWorld(t)
	defer func() { _ = w.e.Close() }()
	step := func(crash bool) {
		w.clock.Add(time.Hour)
		w.hour()
		if !crash {
			return
		}
		w.reopen(true, nil)
		s := w.e.Stats()
		if s.Bloom.Mode != "warm" || s.Bloom.Restored == 0 {
			t.Errorf("hour %d: after a crash: mode %s, %d restored, %d rebuilt keys, %d sealed loaded; want warm from the checkpoint",
				w.n, s.Bloom.Mode, s.Bloom.Restored, s.Bloom.RebuiltKeys, s.Bloom.SealedLoaded)
		}
		w.check(fmt.Sprintf("hour %d, after a crash", w.n))
	}
	w.clock.Add(10 * time.Minute)
	w.hour()
	for h := range 9 {
		step(h%2 == 1)
		if h == 4 {
			waitFor(t, "moves", func() bool { return w.e.Stats().Store.ColdPartitions > 0 })
			w.reopen(false, nil)
			w.check(fmt.Sprintf("hour %d, after a clean restart", w.n))
		}
	}
	// Half an hour on: "short" keys of the last hour cross their window.
	w.clock.Add(40 * time.Minute)
	w.check("40 minutes later")

	// Export, import elsewhere, open there (as after a crash), crash that.
	ctx := context.Background()
	if _, err := w.e.Export(ctx, "exp", 1); err != nil {
		t.Fatal(err)
	}
	_ = w.e.Close()
	setDir(&w.o, "other")
	if _, err := importExport(ctx, "exp", &w.o, 0); err != nil {
		t.Fatal(err)
	}
	w.e = open(t, w.o)
	w.check("imported")
	step(true)
	step(false)
	w.check("imported, an hour on")

	// A longer window: nothing dropped comes back, nothing live leaves.
	w.keptFrom = w.now()/int64(time.Hour) - w.live + 1
	w.live = 7
	w.reopen(true, func(o *engine.Options) { o.Window = 6 * time.Hour })
	w.check("crash, then a 6-hour window")
}

// TestMovesConcurrentCrashRestore: four writers mark fresh keys while
// the clock crosses partitions, partitions seal and move and the open
// partitions are checkpointed every 64 keys; the file system is cloned as
// a machine crash would leave it at a random moment. The clone must open
// warm from the checkpoints, and every key acknowledged before the crash
// (all inside the window) must be a Duplicate at once: a key the
// restored filters missed would be New.
func TestMovesConcurrentCrashRestore(t *testing.T) {
	enginetest.SetCheckpointKeys(64)
	defer enginetest.SetCheckpointKeys(0)
	for round := range 6 {
		fs := newCrashFS()
		clock := newClock()
		o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 30 * time.Hour, Partition: time.Hour, Lease: time.Hour, ExpectedKeys: 20000, Logger: quiet}
		e := open(t, o)
		var mu sync.Mutex
		var acked [][]byte
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for wk := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					keys := make([][]byte, 8)
					for j := range keys {
						keys[j] = fmt.Appendf(nil, "r%d-w%d-%d-%d", round, wk, i, j)
					}
					out := make([]engine.Outcome, len(keys))
					if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for j, o := range out {
						if o == engine.New { // InFlight: the lease ran out on the fast clock, nothing marked
							acked = append(acked, keys[j])
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() { // five minutes of engine time every 2 ms
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
					clock.Add(5 * time.Minute)
				}
			}
		}()
		time.Sleep(time.Duration(150+round*60) * time.Millisecond)
		mu.Lock()
		before := acked[:len(acked):len(acked)]
		mu.Unlock()
		crashed := fs.CrashClone(vfs.CrashCloneCfg{})
		close(stop)
		wg.Wait()
		_ = e.Close()
		st := e.Stats()
		setFS(&o, crashed)
		o.Clock = fixedClock(clock.Now().UnixNano())
		e = open(t, o)
		s := e.Stats()
		if s.Bloom.Mode != "warm" {
			t.Errorf("round %d: mode %s after the crash (%d restored), want warm", round, s.Bloom.Mode, s.Bloom.Restored)
		}
		claims := make([]engine.Claim, len(before))
		if err := e.ClaimBatch(context.Background(), before, nil, claims); err != nil {
			t.Fatal(err)
		}
		bad := 0
		for i, c := range claims {
			if c.Outcome != engine.Duplicate {
				if bad++; bad <= 3 {
					t.Errorf("round %d: acknowledged %s is %v after the crash", round, before[i], c.Outcome)
				}
			}
		}
		t.Logf("round %d: %d keys acknowledged before the crash, %d wrong; before: %d checkpoints, %d cold; after: %d restored, %d journal keys, %d sealed loaded, %d rebuilt",
			round, len(before), bad, st.Bloom.Checkpoints, st.Store.ColdPartitions, s.Bloom.Restored, s.Bloom.JournalKeys, s.Bloom.SealedLoaded, s.Bloom.RebuiltKeys)
		_ = e.Close()
		if t.Failed() {
			return
		}
	}
}

// movedEngine is sealedEngine's store with at least one partition
// moved into the cold database, closed cleanly.
func movedEngine(t *testing.T, fs vfs.FS) (engine.Options, [][]byte) {
	t.Helper()
	e, o, keys := sealedEngine(t, fs, newClock(), 4, 50)
	waitFor(t, "a partition moved", func() bool { return e.Stats().Store.ColdPartitions > 0 })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return o, keys
}

// TestMovesColdStoreRefusals: through engine.Open, a cold directory of
// another store and a missing one after a move are refused with ErrLayout
// (errors.Is), no panic; a cold path that is a file is a typed error too.
func TestMovesColdStoreRefusals(t *testing.T) {
	fs := vfs.NewMem()
	o, _ := movedEngine(t, fs)
	other := o
	setDir(&other, "theirs")
	_ = open(t, other).Close()

	// Swap in the other store's cold database.
	if err := fs.Rename("db/cold", "mine-cold"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename("theirs/cold", "db/cold"); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("a cold database of another store: %v, want ErrLayout", err)
	}
	// No cold database at all where one was recorded.
	if err := fs.Rename("db/cold", "theirs/cold"); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("no cold database after a move: %v, want ErrLayout", err)
	}
	// A file where the cold database belongs.
	f, err := fs.Create("db/cold", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) && !errors.Is(err, engine.ErrStorage) {
		t.Fatalf("a file for the cold database: %v, want ErrLayout or ErrStorage", err)
	}
	if err := fs.Remove("db/cold"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename("mine-cold", "db/cold"); err != nil {
		t.Fatal(err)
	}
	_ = open(t, o).Close()
}

// TestMovesRefusedOpenChangesNothing: an Open refused because the
// cold database is missing must leave the store as it was. Asked with a
// longer window, it records that window before it looks at the cold
// database, so once the cold database is back an Open with the store's
// own window is refused (ErrLayout: the window "shrinks").
func TestMovesRefusedOpenChangesNothing(t *testing.T) {
	fs := vfs.NewMem()
	o, keys := movedEngine(t, fs)
	if err := fs.Rename("db/cold", "aside"); err != nil {
		t.Fatal(err)
	}
	longer := o
	longer.Window = 8 * time.Hour
	if _, err := engine.Open(&longer); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("no cold database: %v, want ErrLayout", err)
	}
	if err := fs.Rename("aside", "db/cold"); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatalf("the store's own options after a refused Open: %v", err)
	}
	defer e.Close()
	allDuplicates(t, e, keys)
}

// moveToVersion2 rewrites the closed store in db as the previous layout
// (format version 2) left it: every record in the hot database, no cold
// database, no journal, checkpoint record or checkpoint files, no record
// of a move.
func moveToVersion2(t *testing.T, fs vfs.FS) {
	t.Helper()
	hot, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	cold, err := pebble.Open("db/cold", &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	b := hot.NewBatch()
	it, _ := cold.NewIter(&pebble.IterOptions{LowerBound: []byte{1}, UpperBound: []byte{2}})
	moved := 0
	for ok := it.First(); ok; ok = it.Next() {
		_ = b.Set(it.Key(), it.Value(), nil)
		moved++
	}
	_ = it.Close()
	if moved == 0 {
		t.Fatal("nothing in the cold database to move back")
	}
	_ = b.Delete([]byte{0, 'm', 'v'}, nil)
	_ = b.Delete([]byte{0, 'c', 'k'}, nil)
	_ = b.DeleteRange([]byte{3}, []byte{4}, nil)
	v, closer, err := hot.Get([]byte{0, 'l', 'y'})
	if err != nil {
		t.Fatal(err)
	}
	layout := append([]byte(nil), v...)
	closer.Close()
	if layout[0] != 3 {
		t.Fatalf("layout version %d", layout[0])
	}
	layout[0] = 2
	_ = b.Set([]byte{0, 'l', 'y'}, layout, nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = cold.Close()
	_ = hot.Close()
	if err := fs.RemoveAll("db/cold"); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.List("db/tierdedup-sealed")
	for _, n := range names {
		if strings.HasSuffix(n, ".ckpt") {
			_ = fs.Remove("db/tierdedup-sealed/" + n)
		}
	}
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// TestMovesVersion2StoreOpens: a store of the previous layout (no cold
// database) opens, cleanly closed (warm from its snapshot) and as after a
// crash (no snapshot: scanned), with every key a Duplicate; its sealed
// partitions then move, a Forget reaches them, and a crash after its
// first checkpoint is warm at Open.
func TestMovesVersion2StoreOpens(t *testing.T) {
	enginetest.SetCheckpointKeys(40)
	defer enginetest.SetCheckpointKeys(0)
	for _, clean := range []bool{true, false} {
		t.Run(fmt.Sprintf("clean=%v", clean), func(t *testing.T) {
			ctx := context.Background()
			fs := newCrashFS()
			o, keys := movedEngine(t, fs)
			moveToVersion2(t, fs)
			if !clean {
				if err := fs.Remove("db/tierdedup-bloom.snapshot"); err != nil {
					t.Fatal(err)
				}
			}
			e := open(t, o)
			if s := e.Stats(); clean && s.Bloom.Mode != "warm" {
				t.Errorf("a cleanly closed version 2 store: mode %s", s.Bloom.Mode)
			}
			allDuplicates(t, e, keys)
			waitFor(t, "the version 2 store's sealed partitions to move", func() bool { return e.Stats().Store.ColdPartitions > 0 })
			if _, err := e.Forget(ctx, keys[0]); err != nil {
				t.Fatal(err)
			}
			more := make([][]byte, 100)
			for i := range more {
				more[i] = fmt.Appendf(nil, "v3-%d", i)
			}
			if err := e.MarkBatch(ctx, more, nil, make([]engine.Outcome, len(more))); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a checkpoint", func() bool { return e.Stats().Bloom.Checkpoints > 0 })
			time.Sleep(20 * time.Millisecond)
			crashed := fs.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			setFS(&o, crashed)
			e = open(t, o)
			defer e.Close()
			if s := e.Stats(); s.Bloom.Mode != "warm" || s.Bloom.Restored == 0 {
				t.Errorf("after a crash: mode %s, %d restored", s.Bloom.Mode, s.Bloom.Restored)
			}
			allDuplicates(t, e, append(keys[1:], more...))
			if o, err := e.MarkIfAbsent(ctx, keys[0]); err != nil || o != engine.New {
				t.Fatalf("the forgotten key: %v %v", o, err)
			}
		})
	}
}

// TestMovesExportIsDurable: Export returns, the machine crashes; the
// export (hot and cold databases, sealed filters, manifest) must be whole:
// an Import of it opens with every key a Duplicate.
func TestMovesExportIsDurable(t *testing.T) {
	ctx := context.Background()
	fs := newCrashFS()
	e, o, keys := sealedEngine(t, fs, newClock(), 4, 50)
	waitFor(t, "a partition moved", func() bool { return e.Stats().Store.ColdPartitions > 0 })
	if _, err := e.Export(ctx, "exp", 1); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	setDir(&o, "other")
	if _, err := importExport(ctx, "exp", &o, 0); err != nil {
		t.Fatalf("Import of an export that survived a crash: %v", err)
	}
	e = open(t, o)
	defer e.Close()
	allDuplicates(t, e, keys)
}

// TestMovesAdvanceAndTokensAcrossMovesAndCrash: entity versions
// committed in partitions that then move into the cold database, and
// tokens issued and used there, keep their answers across a crash
// (restored from the checkpoint) and an export imported elsewhere.
func TestMovesAdvanceAndTokensAcrossMovesAndCrash(t *testing.T) {
	enginetest.SetCheckpointKeys(20)
	defer enginetest.SetCheckpointKeys(0)
	ctx := context.Background()
	fs := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	adv := func(e *engine.Engine, entity string, v uint64, want engine.Outcome) {
		t.Helper()
		c, err := e.Advance(ctx, []byte(entity), v)
		if err != nil || c.Outcome != want {
			t.Fatalf("Advance(%s, %d): %v %v, want %v", entity, v, c.Outcome, err, want)
		}
		if c.Outcome == engine.New {
			if err := e.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	adv(e, "order-1", 1, engine.New)
	adv(e, "order-2", 5, engine.New)
	used, err := e.IssueToken(ctx, 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ConsumeToken(ctx, used); err != nil {
		t.Fatal(err)
	}
	unused, err := e.IssueToken(ctx, 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	adv(e, "order-1", 2, engine.New)
	pad := make([][]byte, 50)
	for i := range pad {
		pad[i] = fmt.Appendf(nil, "pad-%d", i)
	}
	if err := e.MarkBatch(ctx, pad, nil, make([]engine.Outcome, len(pad))); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	if err := e.MarkBatch(ctx, [][]byte{[]byte("tick")}, nil, make([]engine.Outcome, 1)); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, e, clock.Now().Add(-2*time.Hour), clock.Now().Add(-time.Hour))
	waitFor(t, "two partitions moved", func() bool { return e.Stats().Store.ColdPartitions >= 2 })
	waitFor(t, "a checkpoint", func() bool { return e.Stats().Bloom.Checkpoints > 0 })
	time.Sleep(20 * time.Millisecond)
	check := func(e *engine.Engine, what string) {
		t.Helper()
		if s := e.Stats(); s.Bloom.Mode != "warm" {
			t.Errorf("%s: mode %s", what, s.Bloom.Mode)
		}
		adv(e, "order-1", 1, engine.Stale)
		adv(e, "order-1", 2, engine.Duplicate)
		adv(e, "order-2", 5, engine.Duplicate)
		adv(e, "order-2", 4, engine.Stale)
		if err := e.ConsumeToken(ctx, used); !errors.Is(err, engine.ErrTokenUsed) {
			t.Fatalf("%s: the used token: %v", what, err)
		}
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = open(t, o)
	check(e, "after a crash")
	if _, err := e.Export(ctx, "exp", 1); err != nil {
		t.Fatal(err)
	}
	_ = e.Close()
	setDir(&o, "other")
	if _, err := importExport(ctx, "exp", &o, 0); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	defer e.Close()
	waitWarm(t, e)
	check(e, "imported")
	if err := e.ConsumeToken(ctx, unused); err != nil {
		t.Fatalf("the unused token, imported: %v", err)
	}
	adv(e, "order-1", 3, engine.New)
}

// TestMovesExpiryAtTheWindowsEnd: keys committed at the start and the
// end of a partition, in the default namespace and in one with a
// 90-minute window, read from the cold database after a crash, are
// Duplicates until the last nanosecond the docs allow and New from then
// on, across a crash at the boundary.
func TestMovesExpiryAtTheWindowsEnd(t *testing.T) {
	enginetest.SetCheckpointKeys(10)
	defer enginetest.SetCheckpointKeys(0)
	ctx := context.Background()
	fs := newCrashFS()
	clock := newClock() // 10:00, a partition's start
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000,
		Namespaces: map[string]engine.NamespaceOptions{"short": {Window: 90 * time.Minute}}}
	e := open(t, o)
	short, _ := e.Namespace("short")
	mark := func(ns *engine.Namespace, k string) {
		if o, err := ns.MarkIfAbsent(ctx, []byte(k)); err != nil || o != engine.New {
			t.Fatalf("mark %s: %v %v", k, o, err)
		}
	}
	def, _ := e.Namespace("")
	mark(def, "early")
	mark(short, "s-early")
	clock.Add(time.Hour - time.Nanosecond) // 10:59:59.999999999
	mark(def, "late")
	start := clock.Now().Add(-(time.Hour - time.Nanosecond))
	at := func(d time.Duration) {
		clock.Add(start.Add(d).Sub(clock.Now()))
	}
	lookup := func(e *engine.Engine, ns, k string, want engine.Outcome) {
		t.Helper()
		n, _ := e.Namespace(ns)
		info, err := n.Lookup(ctx, []byte(k))
		if err != nil || info.Outcome != want {
			t.Fatalf("at %s: %s/%s is %v (%v), want %v", clock.Now().Format("15:04:05.000000000"), ns, k, info.Outcome, err, want)
		}
	}
	pads := 0
	reopen := func() {
		t.Helper()
		before := e.Stats().Bloom.Checkpoints
		for range 12 {
			pads++
			mark(def, fmt.Sprintf("ck-%d", pads))
		}
		waitFor(t, "a checkpoint", func() bool { return e.Stats().Bloom.Checkpoints > before })
		time.Sleep(10 * time.Millisecond)
		crashed := fs.CrashClone(vfs.CrashCloneCfg{})
		_ = e.Close()
		fs = crashed
		setFS(&o, crashed)
		e = open(t, o)
		def, _ = e.Namespace("")
		if st := e.Stats(); st.Bloom.Mode != "warm" || st.Bloom.Restored == 0 {
			t.Errorf("after a crash at %s: mode %s, %d restored", clock.Now().Format("15:04:05"), st.Bloom.Mode, st.Bloom.Restored)
		}
	}
	// Move partition 10 into the cold database.
	at(time.Hour + time.Minute)
	for i := range 20 {
		mark(def, fmt.Sprintf("pad-%d", i))
	}
	waitSealed(t, e, start)
	waitFor(t, "partition 10 moved", func() bool { return e.Stats().Store.ColdPartitions > 0 })
	at(90*time.Minute - time.Nanosecond)
	lookup(e, "short", "s-early", engine.Duplicate)
	reopen()
	lookup(e, "short", "s-early", engine.Duplicate)
	at(90 * time.Minute)
	lookup(e, "short", "s-early", engine.New)
	at(5*time.Hour - time.Nanosecond) // 14:59:59.999999999: partition 10 is live
	lookup(e, "", "early", engine.Duplicate)
	lookup(e, "", "late", engine.Duplicate)
	reopen()
	lookup(e, "", "early", engine.Duplicate)
	lookup(e, "", "late", engine.Duplicate)
	at(5 * time.Hour)
	lookup(e, "", "early", engine.New)
	lookup(e, "", "late", engine.New)
	reopen()
	lookup(e, "", "early", engine.New)
	_ = e.Close()
	o.Window = 6 * time.Hour // a longer window brings nothing dropped back
	e = open(t, o)
	defer e.Close()
	lookup(e, "", "early", engine.New)
	lookup(e, "", "late", engine.New)
}

// TestMovesForgetRightAfterCrashInMove: a crash while a sealed
// partition's move has ingested it into the cold database but not yet
// recorded it (the machine crash is a CrashClone taken at that point);
// the next process forgets a key of that partition right after Open,
// while its mover is completing the move. Forget returns nil and reports
// the key's commit, yet the key is a Duplicate again once the move
// completes, and after a restart: the Forget deleted it from the hot
// database only, and completing the move switched the partition's reads
// to the cold copy ingested before. Open often returns before the mover
// has completed the move (about half the rounds here), so a few rounds
// find it.
func TestMovesForgetRightAfterCrashInMove(t *testing.T) {
	ctx := context.Background()
	defer enginetest.SetInMove(nil)
	for round := range 20 {
		fs := newCrashFS()
		clock := newClock()
		o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
		e := open(t, o)
		keys := make([][]byte, 20)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "k-%d", i)
		}
		if err := e.MarkBatch(ctx, keys, nil, make([]engine.Outcome, len(keys))); err != nil {
			t.Fatal(err)
		}
		var crashed crashFS
		inMove := make(chan struct{})
		enginetest.SetInMove(func() { // ingested, not recorded: the machine crashes here
			enginetest.SetInMove(nil)
			crashed = fs.CrashClone(vfs.CrashCloneCfg{})
			close(inMove)
		})
		clock.Add(time.Hour)
		if err := e.MarkBatch(ctx, [][]byte{[]byte("tick")}, nil, make([]engine.Outcome, 1)); err != nil {
			t.Fatal(err)
		}
		<-inMove
		_ = e.Close()
		setFS(&o, crashed)
		e = open(t, o)
		moved := e.Stats().Store.ColdPartitions
		info, err := e.Forget(ctx, keys[3])
		if err != nil || info.Outcome != engine.Duplicate {
			t.Fatalf("round %d: Forget: %v %v", round, info.Outcome, err)
		}
		waitFor(t, "the interrupted move to complete", func() bool { return e.Stats().Store.ColdPartitions > 0 })
		after, err := e.Lookup(ctx, keys[3])
		if err != nil {
			t.Fatal(err)
		}
		_ = e.Close()
		e = open(t, o)
		reopened, err := e.Lookup(ctx, keys[3])
		_ = e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if after.Outcome != engine.New || reopened.Outcome != engine.New {
			t.Fatalf("round %d: a key forgotten (Forget returned nil) is %v once the interrupted move completed, %v after a restart; want New (the move was %s when Open returned)",
				round, after.Outcome, reopened.Outcome, map[bool]string{true: "complete", false: "not complete"}[moved > 0])
		}
	}
}

// TestMovesColdDirectoryIsNotAStore: a store's cold database opened as
// a store's Dir (a wrong path) must be refused with a typed error, not
// made into a store of its own inside the other store's cold database.
func TestMovesColdDirectoryIsNotAStore(t *testing.T) {
	fs := vfs.NewMem()
	o, keys := movedEngine(t, fs)
	wrong := o
	setDir(&wrong, "db/cold")
	wrong.Logger = quiet
	ctx := context.Background()
	e, err := engine.Open(&wrong)
	if err == nil {
		// What the wrong store acknowledges lands in the real store's cold
		// database, in the partition of the clock.
		if o, err := e.MarkIfAbsent(ctx, []byte("ghost")); err != nil || o != engine.New {
			t.Fatalf("ghost: %v %v", o, err)
		}
		names, _ := fs.List("db/cold")
		_ = e.Close()
		t.Errorf("Open of a store's cold database as a Dir succeeded; it now holds %v", names)
	} else if !errors.Is(err, engine.ErrLayout) && !errors.Is(err, engine.ErrOptions) {
		t.Errorf("Open of a store's cold database as a Dir: %v, want ErrLayout", err)
	}
	e = open(t, o)
	defer func() { _ = e.Close() }()
	allDuplicates(t, e, keys)
	// The real store's open partition seals and moves into its cold
	// database: "ghost", never claimed here, must still be New.
	clock := o.Clock.(*fakeClock)
	sealedAt := clock.Now()
	time.Sleep(100 * time.Millisecond) // the moves Open woke the mover for
	base := e.Stats().Store.ColdPartitions
	clock.Add(time.Hour)
	if err := e.MarkBatch(ctx, [][]byte{[]byte("tick")}, nil, make([]engine.Outcome, 1)); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, e, sealedAt)
	waitFor(t, "the partition moved", func() bool { return e.Stats().Store.ColdPartitions > base })
	// Reopen without saved filters (as after a crash that left none, and
	// with the restore off): the moved partition is scanned from the cold
	// database.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.RemoveAll("db/tierdedup-sealed"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove("db/tierdedup-bloom.snapshot"); err != nil {
		t.Fatal(err)
	}
	enginetest.SetNoRestore(true)
	defer enginetest.SetNoRestore(false)
	e = open(t, o)
	waitWarm(t, e)
	if info, err := e.Lookup(ctx, []byte("ghost")); err != nil || info.Outcome != engine.New {
		t.Errorf("a key never claimed in this store is %v (%v) once its partition moved", info.Outcome, err)
	}
}
