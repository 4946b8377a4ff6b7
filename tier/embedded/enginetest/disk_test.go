package enginetest_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// du returns what du counts for dir: the blocks allocated to it, in
// bytes.
func du(t *testing.T, dir string) uint64 {
	t.Helper()
	// du exits 1 when a file it listed is gone before it reads its size
	// (the store's background work retires a WAL, renames a temporary
	// file): taken again, up to five times.
	var out []byte
	var err error
	for try := 1; ; try++ {
		if out, err = exec.Command("du", "-s", "-B1", dir).Output(); err == nil {
			break
		}
		if try == 5 {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("du: %v: %s", err, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f := strings.Fields(string(out))
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		t.Fatalf("du printed %q", out)
	}
	return n
}

// TestDiskIsWhatTheOSCounts: Stats.Store.DiskBytes is what du counts for
// the store's directory (within 10 %), its parts add up to it, and it
// names the parts Pebble's own sizes leave out: the WAL's preallocation
// and the filters' files. Checked on a store of one key, and after 100k
// keys and a closed partition.
func TestDiskIsWhatTheOSCounts(t *testing.T) {
	dir := t.TempDir()
	clock := enginetest.NewClock()
	e := open(t, engine.Options{Backend: embedded.Dir(dir), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour})
	defer e.Close()
	ctx := context.Background()
	// The store's background work (a flush retiring a WAL, a compaction)
	// may change the directory between Stats and du: a comparison that
	// differs is taken again, up to five times, before it fails.
	check := func(what string) engine.DiskParts {
		t.Helper()
		for try := 1; ; try++ {
			st := e.Stats().Store
			os := du(t, dir)
			d := st.Disk
			t.Logf("%s: Stats %d B (tables %d, cold %d, WAL %d, filters %d, other %d); du %d B; Pebble's own: tables %d, WAL %d + %d recycled",
				what, st.DiskBytes, d.Tables, d.ColdTables, d.WAL, d.Filters, d.Other, os, st.TableBytes, st.WALBytes, st.WALRecycledBytes)
			if st.DiskBytes != d.Total || d.Tables+d.ColdTables+d.WAL+d.Filters+d.Other != d.Total {
				t.Fatalf("%s: DiskBytes %d, parts %+v do not add up", what, st.DiskBytes, d)
			}
			lo, hi := float64(os)*0.9, float64(os)*1.1
			if float64(d.Total) >= lo && float64(d.Total) <= hi {
				return d
			}
			if try == 5 {
				t.Fatalf("%s: Stats says %d B, du %d B: more than 10 %% apart", what, d.Total, os)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if _, err := e.MarkIfAbsent(ctx, []byte("one")); err != nil {
		t.Fatal(err)
	}
	d := check("one key")
	if d.WAL == 0 {
		t.Fatal("one key: no WAL counted")
	}
	markMany(t, e, 100)
	clock.Add(time.Hour) // the partition closes: its filter is sealed to a file
	if _, err := e.MarkIfAbsent(ctx, []byte("next")); err != nil {
		t.Fatal(err)
	}
	enginetest.WaitFor(t, "the closed partition's seal", func() bool { return e.Stats().Bloom.Sealed > 0 })
	if d := check("100k keys, a partition sealed"); d.Filters == 0 {
		t.Fatal("a sealed partition: no filter file counted")
	}
}

// TestDiskOfTheArchive: a files archive (pebble.ArchiveDir) lives in a
// directory of its own; Stats.Archive.DiskBytes is what du counts for it
// (within 10 %), once partitions have left the window into it, so the
// store's and the archive's figures together are the engine's whole disk.
func TestDiskOfTheArchive(t *testing.T) {
	dir, arch := t.TempDir(), t.TempDir()
	clock := enginetest.NewClock()
	e := open(t, engine.Options{Backend: embedded.Dir(dir), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour,
		ExpectedKeys: 50_000, Archive: pebble.ArchiveDir{Dir: arch}, ArchiveWindow: 48 * time.Hour})
	defer e.Close()
	for h := range 8 {
		markBatches(t, e, fmt.Sprintf("h%d", h), 20)
		clock.Add(time.Hour)
	}
	enginetest.WaitFor(t, "partitions archived", func() bool {
		a := e.Stats().Archive
		return a != nil && a.Partitions >= 3 && a.Lag == 0
	})
	for try := 1; ; try++ {
		got, os := e.Stats().Archive.DiskBytes, du(t, arch)
		t.Logf("archive: Stats %d B, du %d B", got, os)
		if float64(got) >= 0.9*float64(os) && float64(got) <= 1.1*float64(os) && got > 0 {
			break
		}
		if try == 5 {
			t.Fatalf("archive: Stats says %d B, du %d B: more than 10 %% apart", got, os)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// markBatches marks batches of 1000 new keys named after prefix.
func markBatches(t *testing.T, e *engine.Engine, prefix string, batches int) {
	t.Helper()
	keys := make([][]byte, 1000)
	out := make([]engine.Outcome, len(keys))
	for i := range batches {
		for j := range keys {
			keys[j] = fmt.Appendf(keys[j][:0], "%s-%d-%d", prefix, i, j)
		}
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
	}
}
