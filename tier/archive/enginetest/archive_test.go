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
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// archiveRun commits keysPerDay keys a simulated day into an engine with
// a 7-day window and a 21-day archive, and checks every key committed so
// far through the public API: Duplicate while its partition is inside the
// archive window (from the archive once it left the hot window), New
// after it.
type archiveRun struct {
	t       *testing.T
	clock   *fakeClock
	fs      vfs.FS
	archive tier.ArchiveBackend
	e       *engine.Engine
	days    int // days committed
	perDay  int
	start   int64         // partition of day 0
	window  time.Duration // the hot window, 7 days unless a test changes it on reopen
}

func archiveOptions(clock *fakeClock, fs vfs.FS, archive tier.ArchiveBackend) engine.Options {
	return engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 7 * day, Partition: day,
		ExpectedKeys: 2000, Archive: archive, ArchiveWindow: 21 * day,
	}
}

func (r *archiveRun) open() {
	r.t.Helper()
	o := archiveOptions(r.clock, r.fs, r.archive)
	if r.window > 0 {
		o.Window = r.window
	}
	r.e = open(r.t, o)
}

func archiveKey(d, i int) []byte { return fmt.Appendf(nil, "day%03d-key%04d", d, i) }

// commitDay marks one day's keys, then moves the clock a day on.
func (r *archiveRun) commitDay() {
	r.t.Helper()
	keys := make([][]byte, r.perDay)
	for i := range keys {
		keys[i] = archiveKey(r.days, i)
	}
	out := make([]engine.Outcome, len(keys))
	if err := r.e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		r.t.Fatalf("day %d: %v", r.days, err)
	}
	for i, o := range out {
		if o != engine.New {
			r.t.Fatalf("day %d key %d: %v, want New", r.days, i, o)
		}
	}
	r.days++
	r.clock.Add(day)
}

// check looks every committed key up and returns what disagrees with the
// archive window.
func (r *archiveRun) check() []string {
	r.t.Helper()
	cur := r.start + int64(r.days) // the clock's partition
	var bad []string
	for d := 0; d < r.days; d++ {
		keys := make([][]byte, r.perDay)
		for i := range keys {
			keys[i] = archiveKey(d, i)
		}
		out := make([]engine.KeyInfo, len(keys))
		if err := r.e.LookupBatch(context.Background(), keys, out); err != nil {
			r.t.Fatalf("lookup day %d: %v", d, err)
		}
		p := r.start + int64(d)
		// Kept at least the archive window (21 days: every key younger is
		// a Duplicate) and at most a partition more (every key older than
		// 21 days and its partition is New); a key of exactly 21 days
		// (committed at the hour the check runs) may be either.
		want := engine.Duplicate
		if cur-p >= 22 {
			want = engine.New
		}
		for i, o := range out {
			if cur-p == 21 && o.Outcome == engine.New {
				continue
			}
			if o.Outcome != want {
				bad = append(bad, fmt.Sprintf("day %d (age %d) key %d: %v from %v, want %v", d, cur-p, i, o.Outcome, o.Source, want))
				continue
			}
			if want == engine.Duplicate && cur-p >= 8 && r.window == 0 && o.Source != engine.SourceArchive {
				bad = append(bad, fmt.Sprintf("day %d (age %d) key %d: answered by %v, want the archive", d, cur-p, i, o.Source))
			}
		}
	}
	return bad
}

func newArchiveRun(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) *archiveRun {
	clock := newClock()
	fs := vfs.NewMem()
	r := &archiveRun{t: t, clock: clock, fs: fs, archive: archive(fs), perDay: 200}
	r.start = clock.Now().UnixNano() / int64(day)
	r.open()
	return r
}

func filesArchive(fs vfs.FS) tier.ArchiveBackend { return pebble.ArchiveDir{Dir: "archive", FS: fs} }

// TestArchiveKeepsHistory: over 30 days, with reopens every 4 days, every
// key inside the 21-day archive window stays Duplicate (read from the
// archive once past the 7-day window) and every older one is New; Claim
// agrees with Lookup, Forget reaches the archive, and Stats counts it.
func TestArchiveKeepsHistory(t *testing.T) {
	t.Run("files", func(t *testing.T) { testArchiveKeepsHistory(t, filesArchive) })
	t.Run("postgres", func(t *testing.T) {
		p := postgresPool(t)
		table := fmt.Sprintf("engine_arch_%d", time.Now().UnixNano()%1e9)
		t.Cleanup(func() {
			for _, s := range []string{"", "_layout", "_parts", "_blobs"} {
				_, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
			}
		})
		testArchiveKeepsHistory(t, func(vfs.FS) tier.ArchiveBackend { return postgres.Archive{DB: p, Table: table} })
	})
}

func testArchiveKeepsHistory(t *testing.T, archive func(vfs.FS) tier.ArchiveBackend) {
	r := newArchiveRun(t, archive)
	for r.days < 30 {
		r.commitDay()
		if r.days%4 == 0 {
			if err := r.e.Close(); err != nil {
				t.Fatal(err)
			}
			r.open()
		}
		if bad := r.check(); len(bad) > 0 {
			// Whether the loss lasts: asked again once the archive caught up.
			st := *r.e.Stats().Archive
			waitArchived(t, r.e)
			again := r.check()
			t.Fatalf("after day %d, %d wrong answers, first: %s (archive %+v); once the archive caught up, %d wrong (%v), archive %+v",
				r.days, len(bad), bad[0], st, len(again), again[:min(len(again), 1)], *r.e.Stats().Archive)
		}
	}
	defer r.e.Close()
	waitArchived(t, r.e) // so the answers below come from the archive
	ctx := context.Background()
	// A claim of an archived key is a Duplicate with no claim taken; one
	// of an expired key is New.
	c, err := r.e.Claim(ctx, archiveKey(15, 3)) // age 15: archived
	if err != nil || c.Outcome != engine.Duplicate {
		t.Fatalf("claim of an archived key: %v, %v", c.Outcome, err)
	}
	c, err = r.e.Claim(ctx, archiveKey(2, 3)) // age 28: expired
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim of an expired key: %v, %v", c.Outcome, err)
	}
	if err := r.e.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	// A lookup from the archive says when the key was committed: day 15's
	// commit, 15 days before the clock's day 30.
	in, err := r.e.Lookup(ctx, archiveKey(15, 3))
	if want := r.clock.Now().Add(-15 * day).UnixNano(); err != nil || in.Source != engine.SourceArchive || in.CommittedAt != want {
		t.Fatalf("lookup of an archived key: %+v, %v; want committed at %d, from the archive", in, err, want)
	}
	// Forget reaches the archive.
	info, err := r.e.Forget(ctx, archiveKey(12, 7))
	if err != nil || info.Outcome != engine.Duplicate {
		t.Fatalf("forget of an archived key: %+v, %v", info, err)
	}
	if info, err := r.e.Lookup(ctx, archiveKey(12, 7)); err != nil || info.Outcome != engine.New {
		t.Fatalf("an archived key after Forget: %+v, %v", info, err)
	}
	st := r.e.Stats()
	if st.Archive == nil || st.Archive.Hits == 0 || st.Archive.Reads < st.Archive.Hits {
		t.Fatalf("archive stats %+v", st.Archive)
	}
}

// lossyArchive loses the records of one partition it is given: the
// checker must see it.
type lossyArchive struct {
	tier.ArchiveBackend
	lose int64
}

func (l lossyArchive) Open(ctx context.Context, env tier.ArchiveEnv) (tier.Archive, error) {
	a, err := l.ArchiveBackend.Open(ctx, env)
	if err != nil {
		return nil, err
	}
	return lossyStore{a, l.lose}, nil
}

type lossyStore struct {
	tier.Archive
	lose int64
}

func (l lossyStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	if p == l.lose {
		scan = func(func(*tier.Record) error) error { return nil }
	}
	return l.Archive.Put(ctx, p, scan)
}

// TestArchiveCheckerSeesLoss: the checker of TestArchiveKeepsHistory
// fails when the archive loses one partition.
func TestArchiveCheckerSeesLoss(t *testing.T) {
	var lose int64
	r := newArchiveRun(t, func(fs vfs.FS) tier.ArchiveBackend {
		lose = newClock().Now().UnixNano()/int64(day) + 3
		return lossyArchive{filesArchive(fs), lose}
	})
	defer func() { r.e.Close() }()
	for r.days < 12 {
		r.commitDay()
	}
	// Let the archiver catch up, so the hot store drops the lost day.
	waitArchived(t, r.e)
	bad := r.check()
	if len(bad) == 0 {
		t.Fatal("the checker found nothing with a partition lost")
	}
	t.Logf("%d wrong answers, first: %s", len(bad), bad[0])
}

// TestArchiveOptions: what cannot work is refused at Open.
func TestArchiveOptions(t *testing.T) {
	fs := vfs.NewMem()
	a := pebble.ArchiveDir{Dir: "archive", FS: fs}
	for name, o := range map[string]engine.Options{
		"memory-only":       {Tiers: engine.MemoryOnly, Archive: a},
		"bloom-only":        {Tiers: engine.BloomOnly, Archive: a},
		"window not longer": {Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: 7 * day, Archive: a, ArchiveWindow: 7 * day},
		"window alone":      {Backend: &embedded.Backend{Dir: "s", FS: fs}, ArchiveWindow: 30 * day},
		"bad fp":            {Backend: &embedded.Backend{Dir: "s", FS: fs}, Archive: a, ArchiveFalsePositive: 1.5},
		"no archive dir":    {Backend: &embedded.Backend{Dir: "s", FS: fs}, Archive: pebble.ArchiveDir{FS: fs}},
		"detach, memory":    {Tiers: engine.MemoryOnly, DetachArchive: true},
		"detach, archive":   {Backend: &embedded.Backend{Dir: "s", FS: fs}, Archive: a, DetachArchive: true},
		// Hourly partitions over 90 days at the largest ExpectedKeys:
		// about 270 GB of archive filters (without the check, Open
		// succeeds on lent pages; the first seal's blob is of that size).
		"filters over memory": {Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: day, Partition: time.Hour, ExpectedKeys: engine.MaxExpectedKeys, Archive: a, ArchiveWindow: 90 * day},
	} {
		_, err := engine.Open(&o)
		if !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%s: %v, want ErrOptions", name, err)
		}
		if name == "filters over memory" && (err == nil || !strings.Contains(err.Error(), "set ExpectedKeys")) {
			t.Errorf("%s: %v, want the remedy named", name, err)
		}
	}
	// Filters over memory are refused before any tier is opened: a new
	// store's directory and the archive's are not created.
	huge := engine.Options{Backend: &embedded.Backend{Dir: "fresh", FS: fs}, Window: day, Partition: time.Hour, ExpectedKeys: engine.MaxExpectedKeys,
		Archive: pebble.ArchiveDir{Dir: "fresh-archive", FS: fs}, ArchiveWindow: 90 * day}
	if _, err := engine.Open(&huge); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("filters over memory: %v, want ErrOptions", err)
	}
	for _, d := range []string{"fresh", "fresh-archive"} {
		if _, err := fs.Stat(d); err == nil {
			t.Errorf("%s written by an Open refused for its archive's filters", d)
		}
	}
	// An archive of another store is refused.
	clock := newClock()
	o := archiveOptions(clock, fs, a)
	e := open(t, o)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.Backend = &embedded.Backend{Dir: "other", FS: fs}
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("an archive of another store: %v, want ErrLayout", err)
	}
	// A shorter archive window than recorded is refused.
	o = archiveOptions(clock, fs, a)
	o.ArchiveWindow = 14 * day
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("a shorter archive window: %v, want ErrLayout", err)
	}
}

// wrappedArchive is an archive backend whose opened archives wrap wraps:
// the tests' faults.
type wrappedArchive struct {
	tier.ArchiveBackend
	wrap func(tier.Archive) tier.Archive
}

func (w wrappedArchive) Open(ctx context.Context, env tier.ArchiveEnv) (tier.Archive, error) {
	a, err := w.ArchiveBackend.Open(ctx, env)
	if err != nil {
		return nil, err
	}
	return w.wrap(a), nil
}

// failingArchive is b refusing every Put while down is set.
func failingArchive(b tier.ArchiveBackend, down *atomic.Bool) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return failingStore{a, down} }}
}

type failingStore struct {
	tier.Archive
	down *atomic.Bool
}

func (f failingStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	if f.down.Load() {
		return errors.New("archive down")
	}
	return f.Archive.Put(ctx, p, scan)
}

// TestArchiveLagsBehindWindow: while the archive takes nothing, the
// exact tier keeps the partitions that leave the window and answers for
// them; once it is back, it catches up and they go.
func TestArchiveLagsBehindWindow(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	r := newArchiveRun(t, func(fs vfs.FS) tier.ArchiveBackend { return failingArchive(filesArchive(fs), &down) })
	defer func() { r.e.Close() }()
	for r.days < 12 {
		r.commitDay()
	}
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("archive down: %d wrong answers, first: %s", len(bad), bad[0])
	}
	if st := r.e.Stats().Archive; st.Lag < 12 || st.LagReads == 0 {
		t.Fatalf("archive down: stats %+v", st)
	}
	// The archiver tries once the first closed partition is sealed.
	for deadline := time.Now().Add(20 * time.Second); r.e.Stats().Archive.Failures == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("archive down: no failed try counted: %+v", r.e.Stats().Archive)
		}
	}
	if err := r.e.Close(); err != nil {
		t.Fatal(err)
	}
	r.open() // the partitions that left the window survive a restart
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("archive down, reopened: %d wrong answers, first: %s", len(bad), bad[0])
	}
	down.Store(false)
	r.commitDay()
	waitArchived(t, r.e)
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("archive back: %d wrong answers, first: %s", len(bad), bad[0])
	}
}

// TestArchiveNamespaceWindows: a namespace's own archive window, shorter
// than ArchiveWindow, ends its keys' Duplicate answers on time; a
// namespace with a window shorter than Window is not answered from the
// archive; Forget reaches the archive in both; the combinations that
// cannot work are refused.
func TestArchiveNamespaceWindows(t *testing.T) {
	clock := newClock()
	fs := vfs.NewMem()
	o := archiveOptions(clock, fs, filesArchive(fs))
	o.Namespaces = map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 10 * day}, "telemetry": {Window: time.Hour}}
	e := open(t, o)
	defer func() { e.Close() }()
	ctx := context.Background()
	names := []string{"", "short", "telemetry"}
	mark := func(d int) {
		for _, name := range names {
			ns, err := e.Namespace(name)
			if err != nil {
				t.Fatal(err)
			}
			if o, err := ns.MarkIfAbsent(ctx, archiveKey(d, 0)); err != nil || o != engine.New {
				t.Fatalf("ns %q day %d: %v, %v", name, d, o, err)
			}
		}
	}
	for d := 0; d < 16; d++ {
		mark(d)
		clock.Add(day)
	}
	waitArchived(t, e)
	// Now is day 16: day 3 is 13 days old, day 8 is 8 days old.
	for _, c := range []struct {
		ns   string
		d    int
		want engine.Outcome
	}{
		{"", 3, engine.Duplicate}, {"", 8, engine.Duplicate},
		{"short", 3, engine.New}, {"short", 8, engine.Duplicate}, {"short", 15, engine.Duplicate},
		{"telemetry", 8, engine.New}, {"telemetry", 15, engine.New},
	} {
		ns, _ := e.Namespace(c.ns)
		info, err := ns.Lookup(ctx, archiveKey(c.d, 0))
		if err != nil || info.Outcome != c.want {
			t.Errorf("ns %q, key of day %d: lookup %v from %v (%v), want %v", c.ns, c.d, info.Outcome, info.Source, err, c.want)
		}
		cl, err := ns.Claim(ctx, archiveKey(c.d, 0))
		if err != nil || cl.Outcome != c.want {
			t.Errorf("ns %q, key of day %d: claim %v (%v), want %v", c.ns, c.d, cl.Outcome, err, c.want)
		}
		if cl.Outcome == engine.New {
			if err := e.Release(ctx, cl); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Forget reaches the archive in a namespace it does not answer for:
	// once that namespace is given an archive window, nothing comes back.
	tele, _ := e.Namespace("telemetry")
	if _, err := tele.Forget(ctx, archiveKey(5, 0)); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.Namespaces = map[string]engine.NamespaceOptions{"telemetry": {ArchiveWindow: 20 * day}}
	e = open(t, o)
	tele, _ = e.Namespace("telemetry")
	for d, want := range map[int]engine.Outcome{5: engine.New, 6: engine.Duplicate} {
		if info, err := tele.Lookup(ctx, archiveKey(d, 0)); err != nil || info.Outcome != want {
			t.Errorf("telemetry with an archive window, key of day %d: %v from %v (%v), want %v", d, info.Outcome, info.Source, err, want)
		}
	}
	for name, bad := range map[string]engine.Options{
		"both windows":       {Namespaces: map[string]engine.NamespaceOptions{"x": {Window: time.Hour, ArchiveWindow: 10 * day}}},
		"not past Window":    {Namespaces: map[string]engine.NamespaceOptions{"x": {ArchiveWindow: 7 * day}}},
		"past ArchiveWindow": {Namespaces: map[string]engine.NamespaceOptions{"x": {ArchiveWindow: 22 * day}}},
	} {
		b := archiveOptions(clock, fs, filesArchive(fs))
		b.Namespaces = bad.Namespaces
		if err := b.Validate(); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%s: %v, want ErrOptions", name, err)
		}
	}
	if err := (&engine.Options{Backend: embedded.Dir("x"), Namespaces: map[string]engine.NamespaceOptions{"x": {ArchiveWindow: 10 * day}}}).Validate(); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("a namespace ArchiveWindow without an archive: %v", err)
	}
}
