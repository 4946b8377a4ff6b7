package bench_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// archiveDays is the history BenchmarkArchive builds before it measures:
// a 24 h window and 240 h of archive behind it, full.
const (
	archiveDays      = 11
	archivePerDayEnv = "ARCHIVE_BENCH_PER_DAY" // keys a simulated day; default 100000
	archiveFPEnv     = "ARCHIVE_BENCH_FP"      // Options.ArchiveFalsePositive; default the engine's
)

// benchClock is a clock the benchmark moves by hand.
type benchClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *benchClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *benchClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// archivedEngine is an engine whose archive holds ten windows of keys:
// archiveDays simulated days of perDay keys each, 6 h partitions, the
// clock at the start of the last day and every closed partition
// archived (none when archive is false: the same history, expired).
type archivedEngine struct {
	e      *engine.Engine
	dir    string
	perDay int
	fresh  int // keys handed out by next
	kind   string
}

// dayKey is key i of day d: 32 hex digits, as a hashed or random ID
// (which no compression shrinks).
func dayKey(d, i int) []byte {
	x := uint64(d)<<40 | uint64(i)
	return fmt.Appendf(nil, "%016x%016x", shard.Mix(x), shard.Mix(^x))
}

// archiveNone, archiveFiles and archivePostgres are BenchmarkArchive's
// configurations: no archive (the same history, expired), the files
// archive, the PostgreSQL archive on the loopback server.
const (
	archiveNone     = "none"
	archiveFiles    = "files"
	archivePostgres = "postgres"
)

func newArchivedEngine(b *testing.B, kind string) *archivedEngine {
	perDay := 100000
	if v, err := strconv.Atoi(os.Getenv(archivePerDayEnv)); err == nil && v > 0 {
		perDay = v
	}
	dir := b.TempDir()
	clock := &benchClock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	o := engine.Options{Backend: embedded.Dir(filepath.Join(dir, "store")), Clock: clock, Window: 24 * time.Hour, Partition: 6 * time.Hour,
		ExpectedKeys: perDay / 4, MemoryCapacity: 1 << 16, Logger: quietEngine}
	archive := kind != archiveNone
	switch kind {
	case archiveFiles:
		o.Archive = pebble.ArchiveDir{Dir: filepath.Join(dir, "archive")}
	case archivePostgres:
		p := pgtest.Pool(b)
		table := fmt.Sprintf("bench_archive_%d", time.Now().UnixNano()%1e9)
		b.Cleanup(func() {
			for _, s := range []string{"", "_layout", "_parts", "_blobs"} {
				_, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
			}
		})
		o.Archive = postgres.Archive{DB: p, Table: table}
	}
	o.ArchiveWindow = 240 * time.Hour
	if fp, err := strconv.ParseFloat(os.Getenv(archiveFPEnv), 64); err == nil {
		o.ArchiveFalsePositive = fp
	}
	if !archive {
		o.ArchiveWindow, o.ArchiveFalsePositive = 0, 0
	}
	e, err := engine.Open(&o)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	out := make([]engine.Outcome, 256)
	batch := make([][]byte, 0, 256)
	for d := 0; d < archiveDays; d++ {
		for q := 0; q < 4; q++ { // four partitions a day
			for i := q * perDay / 4; i < (q+1)*perDay/4; i++ {
				batch = append(batch, dayKey(d, i))
				if len(batch) == cap(batch) {
					if err := e.MarkBatch(ctx, batch, nil, out[:len(batch)]); err != nil {
						b.Fatal(err)
					}
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				if err := e.MarkBatch(ctx, batch, nil, out[:len(batch)]); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
			clock.add(6 * time.Hour)
		}
	}
	if err := e.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	// Every closed partition archived, and dropped from the hot store.
	for deadline := time.Now().Add(5 * time.Minute); archive; time.Sleep(10 * time.Millisecond) {
		if e.Stats().Archive.Lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("archive still lags: %+v", e.Stats().Archive)
		}
	}
	return &archivedEngine{e: e, dir: dir, perDay: perDay, kind: kind}
}

// BenchmarkArchive measures what an archive of ten windows costs and
// gives, each configuration built once and measured in the same run:
//
//   - new: MarkBatch of new keys, batch 256, with the archive and without
//     (the same history, expired): keys/s, and the archive's reads a key;
//   - archived-duplicates: MarkBatch of keys committed 1 to 9 days ago,
//     past the window, each found in the archive: keys/s;
//
// and, for the archive, the filter's memory and the archive's disk per
// archived key. ARCHIVE_BENCH_PER_DAY sets the keys a simulated day,
// ARCHIVE_BENCH_FP the archive filter's false-positive target.
func BenchmarkArchive(b *testing.B) {
	ctx := context.Background()
	engines := map[string]*archivedEngine{}
	parent := b // owns the directories: a sub-benchmark's are removed when it ends
	get := func(kind string) *archivedEngine {
		if engines[kind] == nil {
			engines[kind] = newArchivedEngine(parent, kind)
		}
		return engines[kind]
	}
	defer func() {
		for _, a := range engines {
			_ = a.e.Close()
		}
	}()
	mark := func(b *testing.B, a *archivedEngine, key func(i int) []byte, want engine.Outcome) {
		out := make([]engine.Outcome, 256)
		batch := make([][]byte, 0, 256)
		before := a.e.Stats().Archive
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < b.N; i++ {
			batch = append(batch, key(i))
			if len(batch) == cap(batch) || i == b.N-1 {
				if err := a.e.MarkBatch(ctx, batch, nil, out[:len(batch)]); err != nil {
					b.Fatal(err)
				}
				for j, o := range out[:len(batch)] {
					if o != want {
						b.Fatalf("%s: %v, want %v", batch[j], o, want)
					}
				}
				batch = batch[:0]
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "keys/s")
		if after := a.e.Stats().Archive; after != nil && before != nil {
			b.ReportMetric(float64(after.Reads-before.Reads)/float64(b.N), "archive-reads/key")
		}
	}
	kinds := []string{archiveNone, archiveFiles, archivePostgres}
	// Every history is built (and settled) before anything is timed: the
	// background work of a build must not fall into another's timing.
	for _, kind := range kinds {
		get(kind)
	}
	for _, kind := range kinds {
		b.Run("new/archive="+kind, func(b *testing.B) {
			a := get(kind)
			mark(b, a, func(int) []byte { a.fresh++; return dayKey(99, a.fresh) }, engine.New)
		})
	}
	for _, kind := range kinds[1:] {
		b.Run("archived-duplicates/archive="+kind, func(b *testing.B) {
			archivedDuplicates(b, get(kind), mark)
		})
	}
}

// archivedDuplicates marks keys committed 1 to 9 days ago, each once, and
// reports the archive's memory and disk per archived key.
func archivedDuplicates(b *testing.B, a *archivedEngine, mark func(*testing.B, *archivedEngine, func(int) []byte, engine.Outcome)) {
	// Days 2 to 9 of 0..10, the clock at the start of day 11: committed 1
	// to 9 days ago, past the 1-day window, inside the 10-day archive
	// (day 1's first keys are exactly 10 days old: at its edge).
	n := 8 * a.perDay
	if b.N > n {
		b.Skipf("only %d archived keys past the window to mark once each", n)
	}
	mark(b, a, func(i int) []byte { return dayKey(2+i/a.perDay, i%a.perDay) }, engine.Duplicate)
	st := a.e.Stats().Archive
	var disk int64
	_ = filepath.WalkDir(filepath.Join(a.dir, "archive"), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				disk += info.Size()
			}
		}
		return nil
	})
	held := float64(archiveDays-1) * float64(a.perDay) // the closed days the archive holds
	b.ReportMetric(float64(st.FilterBytes)/held, "filter-B/archived-key")
	if a.kind == archiveFiles {
		b.ReportMetric(float64(disk)/held, "disk-B/archived-key")
	}
}

// TestPlanArchiveFilterIsTheEngines: the plan's archive filter memory is
// the ring the engine allocates for the same load and windows, and its
// archived keys and disk follow from them.
func TestPlanArchiveFilterIsTheEngines(t *testing.T) {
	in := bench.PlanInput{IDsPerDay: 2.4e6, Window: 4 * time.Hour, Partition: time.Hour, FalsePositive: 0.01,
		Shape: bench.UUIDv4, ArchiveWindow: 100 * time.Hour}
	pl, err := bench.MakePlan(in, bench.Calibration{TableBytesPerKey: 50})
	if err != nil {
		t.Fatal(err)
	}
	if pl.ArchiveLayout.Partitions != 101 || pl.ArchiveLayout.Group != 4 || pl.ArchiveKeysHeld != pl.KeysPerPartition*(101-float64(pl.Live)) {
		t.Fatalf("plan layout %+v, %.0f keys held past the window", pl.ArchiveLayout, pl.ArchiveKeysHeld)
	}
	dir := t.TempDir()
	clock := &benchClock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "s")), Clock: clock, Window: in.Window, Partition: in.Partition,
		ExpectedKeys: int(pl.KeysPerPartition), Archive: pebble.ArchiveDir{Dir: filepath.Join(dir, "a")}, ArchiveWindow: in.ArchiveWindow, Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	if _, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	clock.add(time.Hour)
	if _, err := e.MarkIfAbsent(ctx, []byte("l")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); e.Stats().Archive.FilterBytes == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing archived: %+v", e.Stats().Archive)
		}
	}
	if got := float64(e.Stats().Archive.FilterBytes); got != pl.ArchiveFilterBytes {
		t.Fatalf("engine's archive filter %.0f bytes, plan %.0f", got, pl.ArchiveFilterBytes)
	}
	if want := pl.KeysPerPartition*100*50 + pl.ArchiveBlobBytes; pl.ArchiveDiskBytes != want {
		t.Fatalf("plan disk %.0f, want %.0f", pl.ArchiveDiskBytes, want)
	}
}
