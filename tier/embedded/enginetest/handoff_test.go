package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// exported is a sealed engine's state exported to "exp" with version 7,
// with a caller's record written with the last commit: what a Kafka
// partition's owner hands over.
func exported(t *testing.T) (fs vfs.FS, clock *fakeClock, o engine.Options, keys [][]byte) {
	t.Helper()
	fs, clock = vfs.NewMem(), newClock()
	e, o, keys := sealedEngine(t, fs, clock, 4, 50)
	ctx := context.Background()
	c, err := e.Claim(ctx, []byte("last"))
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, []engine.Write{{Key: []byte("offset"), Value: []byte("7")}}); err != nil {
		t.Fatal(err)
	}
	keys = append(keys, []byte("last"))
	info, err := e.Export(ctx, "exp", 7)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != 7 || info.Files == 0 || info.Bytes == 0 {
		t.Fatalf("export info %+v", info)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return fs, clock, o, keys
}

func record(t *testing.T, e *engine.Engine, key string) string {
	t.Helper()
	var v string
	if err := e.ScanWrites([]byte(key), func(_, value []byte) error { v = string(value); return nil }); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestImportCarriesState: another directory imports the export and opens
// with every committed key a Duplicate, the caller's record, the sealed
// partitions loaded rather than rebuilt, and a new key New.
func TestImportCarriesState(t *testing.T) {
	fs, _, o, keys := exported(t)
	ctx := context.Background()
	if info, err := embedded.ReadExport(fs, "exp"); err != nil || info.Version != 7 {
		t.Fatalf("ReadExport: %+v %v", info, err)
	}
	setDir(&o, "other")
	info, err := importExport(ctx, "exp", &o, 0)
	if err != nil || info.Version != 7 {
		t.Fatalf("Import: %+v %v", info, err)
	}
	e := open(t, o)
	defer e.Close()
	if got := record(t, e, "offset"); got != "7" {
		t.Fatalf("record %q, want 7", got)
	}
	allDuplicates(t, e, keys)
	if n := e.Stats().Bloom.SealedLoaded; n != closed {
		t.Fatalf("%d sealed partitions loaded, want %d", n, closed)
	}
	if c, err := e.Claim(ctx, []byte("brand-new")); err != nil || c.Outcome != engine.New {
		t.Fatalf("new key: %v %v", c.Outcome, err)
	}
}

// TestImportRefusals: an export that is not newer, damaged, incomplete or
// whose manifest was changed is refused with its own error, and the
// destination keeps its state; a destination held open is refused.
func TestImportRefusals(t *testing.T) {
	ctx := context.Background()
	fs, _, o, keys := exported(t)

	// The destination holds state of its own: one committed key and a record.
	setDir(&o, "dst")
	e := open(t, o)
	c, err := e.Claim(ctx, []byte("mine"))
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, []engine.Write{{Key: []byte("offset"), Value: []byte("mine")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := importExport(ctx, "exp", &o, 0); !errors.Is(err, engine.ErrLocked) {
		t.Fatalf("import into an open directory: %v, want ErrLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	copyDir(t, fs, "exp", "pristine")
	files := exportFiles(t, fs, "exp")
	sst := files[slices.IndexFunc(files, func(n string) bool { return strings.HasSuffix(n, ".sst") })]
	sealed := files[slices.IndexFunc(files, func(n string) bool { return strings.HasSuffix(n, ".sealed") })]
	cases := []struct {
		name     string
		damage   func()
		newer    uint64
		want     error
		wantText string
	}{
		{"not newer", func() {}, 7, engine.ErrStaleExport, "version 7"},
		{"sstable flipped", func() { rewrite(t, fs, "exp/"+sst, func(b []byte) { b[len(b)/2] ^= 1 }) }, 0, engine.ErrExport, sst},
		{"sealed file truncated", func() {
			write(t, fs, "exp/"+sealed, read(t, fs, "exp/"+sealed)[:10])
		}, 0, engine.ErrExport, sealed},
		{"file missing", func() {
			if err := fs.Remove("exp/" + sst); err != nil {
				t.Fatal(err)
			}
		}, 0, engine.ErrExport, "missing"},
		{"manifest edited", func() {
			rewrite(t, fs, "exp/tierdedup-export.json", func(b []byte) {
				copy(b, strings.Replace(string(b), `"version":7`, `"version":9`, 1))
			})
		}, 0, engine.ErrExport, "checksum"},
		{"manifest missing", func() {
			if err := fs.Remove("exp/tierdedup-export.json"); err != nil {
				t.Fatal(err)
			}
		}, 0, engine.ErrNoExport, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := fs.RemoveAll("exp"); err != nil {
				t.Fatal(err)
			}
			copyDir(t, fs, "pristine", "exp")
			tc.damage()
			_, err := importExport(ctx, "exp", &o, tc.newer)
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.wantText) {
				t.Fatalf("Import: %v, want %v naming %q", err, tc.want, tc.wantText)
			}
			if _, err := fs.Stat("dst.import-tmp"); err == nil {
				t.Fatal("a refused import left its copy behind")
			}
			e := open(t, o)
			defer e.Close()
			if got := record(t, e, "offset"); got != "mine" {
				t.Fatalf("destination's record %q after a refused import", got)
			}
			if c, err := e.Claim(ctx, keys[0]); err != nil || c.Outcome != engine.New {
				t.Fatalf("an exported key is %v %v in the destination after a refused import", c.Outcome, err)
			}
		})
	}
}

// TestInterruptedImportIsFinished: a crash between Import's two renames
// leaves the destination missing and its old state beside it; the next Open
// puts it back, never opening an empty store in its place. A crash after
// them leaves the old state to be removed.
func TestInterruptedImportIsFinished(t *testing.T) {
	ctx := context.Background()
	fs, _, o, keys := exported(t)
	setDir(&o, "dst")
	if _, err := importExport(ctx, "exp", &o, 0); err != nil {
		t.Fatal(err)
	}
	// Between the renames: dst moved aside, the new copy not yet in place.
	if err := fs.Rename("dst", "dst.import-old"); err != nil {
		t.Fatal(err)
	}
	e := open(t, o)
	if got := record(t, e, "offset"); got != "7" {
		t.Fatalf("record %q: the interrupted import's old state was not put back", got)
	}
	allDuplicates(t, e, keys)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// After the renames: the old state is removed.
	copyDir(t, fs, "dst", "dst.import-old")
	e = open(t, o)
	defer e.Close()
	if _, err := fs.Stat("dst.import-old"); err == nil {
		t.Fatal("the replaced state was left beside the destination")
	}
}

// TestExportReplacesExport: a second export replaces the first whole; an
// export interrupted between its renames leaves the previous one readable.
func TestExportReplacesExport(t *testing.T) {
	ctx := context.Background()
	fs, _, o, _ := exported(t)
	e := open(t, o)
	defer e.Close()
	if _, err := e.Export(ctx, "exp", 8); err != nil {
		t.Fatal(err)
	}
	if info, err := embedded.ReadExport(fs, "exp"); err != nil || info.Version != 8 {
		t.Fatalf("ReadExport: %+v %v", info, err)
	}
	if err := fs.Rename("exp", "exp.export-old"); err != nil {
		t.Fatal(err)
	}
	if info, err := embedded.ReadExport(fs, "exp"); err != nil || info.Version != 8 {
		t.Fatalf("ReadExport of an interrupted export: %+v %v", info, err)
	}
	dst := o
	setDir(&dst, "dst")
	if _, err := importExport(ctx, "exp", &dst, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Export(ctx, "", 1); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("export to an empty path: %v", err)
	}
	mem := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock()})
	defer mem.Close()
	if _, err := mem.Export(ctx, "x", 1); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("export of a memory-only engine: %v", err)
	}
}

// exportFiles lists the files of the export in dir (its top level and the
// sealed directory), as names relative to dir.
func exportFiles(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	var out []string
	for _, sub := range []string{"", "tierdedup-sealed"} {
		names, err := fs.List(fs.PathJoin(dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if st, err := fs.Stat(fs.PathJoin(dir, sub, n)); err == nil && !st.IsDir() {
				out = append(out, strings.TrimPrefix(sub+"/"+n, "/"))
			}
		}
	}
	return out
}

func copyDir(t *testing.T, fs vfs.FS, from, to string) {
	t.Helper()
	if err := fs.MkdirAll(to+"/tierdedup-sealed", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range exportFiles(t, fs, from) {
		write(t, fs, to+"/"+n, read(t, fs, from+"/"+n))
	}
}

// commitKeys claims and commits each key.
func commitKeys(t *testing.T, e *engine.Engine, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		c, err := e.Claim(ctx, []byte(k))
		if err != nil || c.Outcome != engine.New {
			t.Fatalf("claim %s: %v %v", k, c.Outcome, err)
		}
		if err := e.Commit(ctx, c); err != nil {
			t.Fatalf("commit %s: %v", k, err)
		}
	}
}

// osExport writes an export of an engine holding "theirs" (version 5) to
// base/exp on the operating system's file system, with options o.
func osExport(t *testing.T, base string, o engine.Options) string {
	t.Helper()
	setDir(&o, filepath.Join(base, "exporter"))
	e := open(t, o)
	commitKeys(t, e, "theirs")
	exp := filepath.Join(base, "exp")
	if _, err := e.Export(context.Background(), exp, 5); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return exp
}

// TestImportRefusesOpenDirectoryAnySpelling: an engine of this process
// holds a directory; Import into it is refused under its absolute path, a
// relative one and a symbolic link (a file lock does not exclude its own
// process), and the engine's commits stay.
func TestImportRefusesOpenDirectoryAnySpelling(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	exp := osExport(t, base, engine.Options{})
	// The engine opens the directory through a symbolic link, so its own
	// lock is taken under the link's path.
	db := filepath.Join(base, "db")
	if err := os.Mkdir(db, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(db, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	e := open(t, engine.Options{Backend: embedded.Dir(filepath.Join(base, "link"))})
	defer e.Close()
	commitKeys(t, e, "mine")
	t.Chdir(base)
	for _, dst := range []string{db, "db", "./x/../db", "link", filepath.Join(base, "link")} {
		o := engine.Options{Backend: embedded.Dir(dst)}
		if _, err := importExport(ctx, exp, &o, 0); !errors.Is(err, engine.ErrLocked) {
			t.Errorf("Import into the open directory as %q: %v, want ErrLocked", dst, err)
		}
	}
	if c, err := e.Claim(ctx, []byte("mine")); err != nil || c.Outcome != engine.Duplicate {
		t.Fatalf("the open engine's key after the refused imports: %v %v", c.Outcome, err)
	}
}

// TestExportRefusesItsOwnDirectory: an export into the engine's directory,
// one of its ancestors or a directory inside it is refused, and the engine
// keeps every key.
func TestExportRefusesItsOwnDirectory(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	db := filepath.Join(base, "p", "db")
	e := open(t, engine.Options{Backend: embedded.Dir(db)})
	defer e.Close()
	commitKeys(t, e, "mine")
	for _, dir := range []string{db, filepath.Dir(db), base, filepath.Join(db, "sub"), db + "/../db"} {
		if _, err := e.Export(ctx, dir, 1); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Export to %s: %v, want ErrOptions", dir, err)
		}
	}
	if _, err := e.Export(ctx, filepath.Join(base, "p", "exp"), 1); err != nil {
		t.Fatalf("Export beside the directory: %v", err)
	}
	if c, err := e.Claim(ctx, []byte("mine")); err != nil || c.Outcome != engine.Duplicate {
		t.Fatalf("the engine's key after the exports: %v %v", c.Outcome, err)
	}
}

// TestImportRefusesAnotherLayout: an export of an engine with another
// window or partition is refused before the destination is touched (Open
// would refuse the copy, and the destination's own state would be gone).
func TestImportRefusesAnotherLayout(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	exp := osExport(t, base, engine.Options{Window: 4 * time.Hour, Partition: time.Hour})
	o := engine.Options{Backend: embedded.Dir(filepath.Join(base, "dst"))}
	e := open(t, o)
	commitKeys(t, e, "mine")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := importExport(ctx, exp, &o, 0); !errors.Is(err, engine.ErrLayout) || !strings.Contains(err.Error(), "Window") {
		t.Fatalf("Import of another layout: %v, want ErrLayout naming Window", err)
	}
	o.Window = 4 * time.Hour
	if _, err := importExport(ctx, exp, &o, 0); !errors.Is(err, engine.ErrLayout) || !strings.Contains(err.Error(), "Partition") {
		t.Fatalf("Import of another partition length: %v, want ErrLayout naming Partition", err)
	}
	o.Window = 0
	e = open(t, o)
	defer e.Close()
	if c, err := e.Claim(ctx, []byte("mine")); err != nil || c.Outcome != engine.Duplicate {
		t.Fatalf("the destination's key after the refused imports: %v %v", c.Outcome, err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fo := engine.Options{Backend: embedded.Dir(file)}
	if _, err := importExport(ctx, exp, &fo, 0); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("Import over a file: %v, want ErrOptions", err)
	}
}
