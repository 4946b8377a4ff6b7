package enginetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// faDisk checks that the engine's disk figure is within 10 % of du of
// dir plus extra (directories that count in it), retrying a few times
// for background work; the parts must add up.
func faDisk(t *testing.T, e *engine.Engine, what string, dirs ...string) {
	t.Helper()
	for try := 1; ; try++ {
		st := e.Stats().Store
		var os uint64
		for _, d := range dirs {
			os += faFilesDu(d) // files' st_blocks*512 (du -s also counts directories' own blocks)
		}
		d := st.Disk
		if st.DiskBytes != d.Total || d.Tables+d.ColdTables+d.WAL+d.Filters+d.Other != d.Total {
			t.Fatalf("%s: DiskBytes %d, parts %+v do not add up", what, st.DiskBytes, d)
		}
		if f := float64(d.Total); f >= float64(os)*0.9 && f <= float64(os)*1.1 {
			t.Logf("%s: Stats %d B (tables %d, cold %d, WAL %d, filters %d, other %d), du %d B", what, d.Total, d.Tables, d.ColdTables, d.WAL, d.Filters, d.Other, os)
			return
		}
		if try == 6 {
			t.Errorf("%s: Stats says %d B (tables %d, cold %d, WAL %d, filters %d, other %d), du of %v %d B: more than 10 %% apart",
				what, d.Total, d.Tables, d.ColdTables, d.WAL, d.Filters, d.Other, dirs, os)
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// faFilesDu sums st_blocks*512 over the regular files under dir.
func faFilesDu(dir string) uint64 {
	var n uint64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += uint64(st.Blocks) * 512
			}
		}
		return nil
	})
	return n
}

func faMark(t *testing.T, e *engine.Engine, prefix string, n, size int) [][]byte {
	t.Helper()
	var all [][]byte
	out := make([]engine.Outcome, 500)
	for i := 0; i < n; i += 500 {
		m := min(500, n-i)
		keys := make([][]byte, m)
		for j := range keys {
			k := fmt.Appendf(nil, "%s-%d-", prefix, i+j)
			if size > len(k) {
				k = append(k, bytes.Repeat([]byte{'x'}, size-len(k))...)
			}
			keys[j] = k
		}
		if err := e.MarkBatch(context.Background(), keys, nil, out[:m]); err != nil {
			t.Fatal(err)
		}
		all = append(all, keys...)
	}
	return all
}

// TestFootprintAttackDiskAcrossRotationsAndReopen: the figure follows du through
// hourly rotations past the window (drops, seals, cold moves), after
// Close and reopen, and after reopen of a Bloom-only store.
func TestFootprintAttackDiskAcrossRotationsAndReopen(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(dir), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 50_000, Logger: quiet}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for h := range 7 {
		keys = append(keys, faMark(t, e, fmt.Sprintf("h%d", h), 20_000, 0)...)
		faDisk(t, e, fmt.Sprintf("hour %d", h), dir)
		clock.Add(time.Hour)
		faMark(t, e, fmt.Sprintf("tick%d", h), 1, 0)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	faDisk(t, e, "reopened after Close", dir)
	waitWarm(t, e)
	faDisk(t, e, "reopened, warm", dir)
	// The last 4 hours' keys are still in the window: Duplicate.
	recent := keys[len(keys)-3*20_000:]
	out := make([]engine.Outcome, len(recent))
	if err := e.MarkBatch(context.Background(), recent, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, oc := range out {
		if oc != engine.Duplicate {
			t.Fatalf("reopened: key %s in the window answered %v", recent[i], oc)
		}
	}
	clock.Add(24 * time.Hour) // everything expires
	faMark(t, e, "late", 10, 0)
	time.Sleep(time.Second)
	faDisk(t, e, "a day later, all dropped", dir)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFootprintAttackDiskBloomOnly(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 50_000, Logger: quiet}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	faMark(t, e, "b", 1, 0)
	faDisk(t, e, "bloom-only, one key", dir)
	for h := range 3 {
		faMark(t, e, fmt.Sprintf("b%d", h), 30_000, 0)
		clock.Add(time.Hour)
		faMark(t, e, fmt.Sprintf("bt%d", h), 1, 0)
		faDisk(t, e, fmt.Sprintf("bloom-only hour %d", h), dir)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	faDisk(t, e, "bloom-only reopened", dir)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFootprintAttackDiskTinyAndHugeKeys: one-byte keys and 60 KiB keys.
func TestFootprintAttackDiskTinyAndHugeKeys(t *testing.T) {
	for _, c := range []struct {
		name    string
		n, size int
	}{{"tiny", 200_000, 1}, {"huge", 600, 60 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			o := engine.Options{Backend: embedded.Dir(dir), MaxKeySize: engine.MaxKeySize, Logger: quiet}
			e, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			out := make([]engine.Outcome, 256)
			if c.size == 1 {
				// 1-byte and 2-byte keys: all 256 one-byte keys, then two-byte ones.
				keys := make([][]byte, 256)
				for i := range keys {
					keys[i] = []byte{byte(i)}
				}
				if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
					t.Fatal(err)
				}
				faMark(t, e, "", c.n, 0)
			} else {
				faMark(t, e, "H", c.n, c.size)
			}
			faDisk(t, e, c.name+" keys", dir)
		})
	}
}

// TestFootprintAttackDiskAfterCrash: a child marking keys is killed; the figure
// after reopen matches du.
func TestFootprintAttackDiskAfterCrash(t *testing.T) {
	dir := t.TempDir()
	for r := range 2 {
		child := crashtest.Start(t, "crash", fmt.Sprintf("%s|%d|sync", dir, r), &crashtest.Options{Timeout: time.Minute})
		n := 0
		for {
			line, ok := child.Next()
			if !ok {
				t.Fatalf("child ended: %s", child.Stderr())
			}
			if strings.HasPrefix(line, "N ") {
				n++
			}
			if n > 20_000 {
				break
			}
		}
		child.Signal(syscall.SIGKILL)
		_ = child.Wait()
	}
	o := engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 100_000, Logger: quiet}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	faDisk(t, e, "reopened after SIGKILL", dir)
	waitWarm(t, e)
	faDisk(t, e, "reopened after SIGKILL, warm", dir)
}

// faLeftover returns the stacks of goroutines running the repository's
// or Pebble's code, except this test's own.
func faLeftover() []string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "growth_concurrency_test") || strings.Contains(g, "testing.tRunner") || strings.Contains(g, "testing.(*T).Run") {
			continue
		}
		if strings.Contains(g, "tierdedup/tierdedup/") || strings.Contains(g, "cockroachdb/pebble") || strings.Contains(g, "runtime/debug.FreeOSMemory") {
			left = append(left, g)
		}
	}
	return left
}

// TestFootprintAttackConcurrentEnginesGrowAndClose: four default engines (default
// ExpectedKeys: rings grow past 8 MiB, so each growth calls FreeOSMemory)
// fill at once from 4 goroutines each; two are closed while they grow.
// Every acknowledged key is a Duplicate after reopening, no fresh key is
// anything but New, and after Close no goroutine of the engine, Pebble
// or FreeOSMemory is left.
func TestFootprintAttackConcurrentEnginesGrowAndClose(t *testing.T) {
	const engines = 4
	perEngine := int64(120_000)
	if enginetest.RaceEnabled() {
		perEngine = 60_000 // past the growth from an 8 MiB ring, which returns memory to the OS
	}
	dirs := make([]string, engines)
	ledgers := make([]*ledger, engines)
	es := make([]*engine.Engine, engines)
	for i := range engines {
		dirs[i] = t.TempDir()
		ledgers[i] = &ledger{}
		var err error
		if es[i], err = engine.Open(&engine.Options{Backend: embedded.Dir(dirs[i]), Logger: quiet}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, engines)
	for i := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var next atomic.Int64
			errs[i] = gaMarkFresh(es[i], ledgers[i], fmt.Sprintf("e%d", i), &next, perEngine, 4, 500, nil)
		}()
	}
	// Close engines 0 and 1 while they grow (after a third and two thirds
	// of their keys).
	for i, at := range []int{int(perEngine / 3), int(2 * perEngine / 3)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ledgers[i].len() < at {
				time.Sleep(time.Millisecond)
			}
			if err := es[i].Close(); err != nil {
				errs[i] = errors.Join(errs[i], fmt.Errorf("close during growth: %w", err))
			}
		}()
	}
	wg.Wait()
	for i := range engines {
		if errs[i] != nil {
			t.Errorf("engine %d: %v", i, errs[i])
		}
		st := es[i].Stats()
		t.Logf("engine %d: %d acknowledged, bloom %d bytes", i, ledgers[i].len(), st.Bloom.Bytes)
		if err := es[i].Close(); err != nil && !errors.Is(err, engine.ErrClosed) {
			t.Errorf("engine %d close: %v", i, err)
		}
	}
	// No goroutine left after every Close.
	deadline := time.Now().Add(10 * time.Second)
	var left []string
	for {
		if left = faLeftover(); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("%d goroutines left 10 s after Close, e.g.\n%s", len(left), left[0])
	}
	// Reopen each: every acknowledged key is a Duplicate, a fresh key New.
	for i := range engines {
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dirs[i]), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		gaAllDuplicate(t, e, ledgers[i].snapshot(), fmt.Sprintf("engine %d reopened", i))
		if ok, err := e.MarkIfAbsent(context.Background(), []byte("fresh-after")); err != nil || ok != engine.New {
			t.Errorf("engine %d: a fresh key: %v %v", i, ok, err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFootprintAttackManyCallersRaceGrowth: 32 goroutines mark fresh keys and,
// interleaved, keys acknowledged before, through every growth of a
// default engine: fresh keys New, acknowledged keys Duplicate, at once.
func TestFootprintAttackManyCallersRaceGrowth(t *testing.T) {
	faRaceGrowth(t, engine.Options{MemoryCapacity: 1})
}

// The same with the default memory tier (no growth of the filters is
// needed to answer: memory holds every key).
func TestFootprintAttackManyCallersDefaultMemory(t *testing.T) { faRaceGrowth(t, engine.Options{}) }

// The same with filters at their full size from the start (ExpectedKeys
// small enough that the ring does not grow... it always grows in Default,
// so: a 1M-key ceiling, whose ring reaches its full size early).
func TestFootprintAttackManyCallersSmallCeiling(t *testing.T) {
	faRaceGrowth(t, engine.Options{MemoryCapacity: 1, ExpectedKeys: 20_000})
}

func faRaceGrowth(t *testing.T, o engine.Options) {
	dir := t.TempDir()
	o.Backend, o.Logger = embedded.Dir(dir), quiet
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var l ledger
	var next atomic.Int64
	stop := make(chan struct{})
	var rerr atomic.Value
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]engine.Outcome, 64)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				snap := l.snapshot()
				if len(snap) < 64 {
					time.Sleep(time.Millisecond)
					continue
				}
				b := make([][]byte, 64)
				for j := range b {
					b[j] = snap[(i*7919+g*131+j)%len(snap)] // 64 distinct keys
				}
				if err := e.MarkBatch(context.Background(), b, nil, out); err != nil {
					rerr.Store(err)
					return
				}
				for j, o := range out {
					// InFlight is allowed: with almost nothing in memory,
					// two re-marks of one key meet, the second finding the
					// first's claim while it reads the store. Never New.
					if o != engine.Duplicate && o != engine.InFlight {
						rerr.Store(fmt.Errorf("acknowledged key %s answered %v during growth", b[j], o))
						return
					}
				}
			}
		}()
	}
	total := int64(200_000)
	if enginetest.RaceEnabled() {
		total = 60_000
	}
	if err := gaMarkFresh(e, &l, "race", &next, total, 24, 256, nil); err != nil {
		t.Error(err)
	}
	close(stop)
	wg.Wait()
	if v := rerr.Load(); v != nil {
		t.Error(v)
	}
	t.Logf("%d keys, bloom %d bytes", l.len(), e.Stats().Bloom.Bytes)
	gaAllDuplicate(t, e, l.snapshot(), "after the growths")
}
