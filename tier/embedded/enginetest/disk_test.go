package enginetest_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// du returns what du counts for dir: the blocks allocated to it, in
// bytes.
func du(t *testing.T, dir string) uint64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "-B1", dir).Output()
	if err != nil {
		t.Fatalf("du: %v", err)
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
