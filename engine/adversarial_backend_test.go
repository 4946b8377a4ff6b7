package engine_test

// Adversarial tests of the embedded store opened as a Backend
// (embedded.Dir, &embedded.Backend{...}), through the public API only:
// configurations that must be refused (ErrOptions, ErrLayout, ErrLocked)
// without writing anything, a Backend value shared or mutated, a
// directory reopened under another configuration, export and import,
// the archive and its detaching, and the configurations' names.

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
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// ---------------------------------------------------------------------
// helpers

// advbShared is a shared tier (claims in its store) that must never be
// opened by the configurations that use it here: they are all refused.
type advbShared struct{ opened *bool }

func (advbShared) Name() string                { return "fakeshared" }
func (advbShared) Claims() tier.Where          { return tier.ClaimsInStore }
func (advbShared) Validate(env tier.Env) error { return nil }
func (s advbShared) Open(ctx context.Context, env tier.Env) (tier.Exact, error) {
	if s.opened != nil {
		*s.opened = true
	}
	return nil, errors.New("advbShared: must not be opened")
}

// advbWrapped hides an *embedded.Backend (possibly nil) behind a struct
// of the caller's: every method is promoted, so it is a LocalBackend.
type advbWrapped struct{ *embedded.Backend }

// advbTree lists every file under root on fs with its size; nil when root
// does not exist.
func advbTree(t *testing.T, fs vfs.FS, root string) map[string]int64 {
	t.Helper()
	if fs == nil {
		fs = vfs.Default
	}
	if _, err := fs.Stat(root); err != nil {
		return nil
	}
	out := map[string]int64{}
	var walk func(dir, rel string)
	walk = func(dir, rel string) {
		names, err := fs.List(dir)
		if err != nil {
			t.Fatalf("list %s: %v", dir, err)
		}
		for _, n := range names {
			p := fs.PathJoin(dir, n)
			st, err := fs.Stat(p)
			if err != nil {
				continue
			}
			if st.IsDir() {
				out[rel+n+"/"] = 0
				walk(p, rel+n+"/")
				continue
			}
			out[rel+n] = st.Size()
		}
	}
	walk(root, "")
	return out
}

// advbSame fails t unless before and after list the same files of the
// same sizes.
func advbSame(t *testing.T, what string, before, after map[string]int64) {
	t.Helper()
	var diff []string
	for n, s := range after {
		if b, ok := before[n]; !ok {
			diff = append(diff, fmt.Sprintf("+%s(%d)", n, s))
		} else if b != s {
			diff = append(diff, fmt.Sprintf("~%s(%d->%d)", n, b, s))
		}
	}
	for n := range before {
		if _, ok := after[n]; !ok {
			diff = append(diff, "-"+n)
		}
	}
	if before == nil && after != nil {
		diff = append(diff, "(directory created)")
	}
	slices.Sort(diff)
	if len(diff) > 0 {
		t.Errorf("%s wrote to disk: %s", what, strings.Join(diff, " "))
	}
}

// advbMark marks keys and returns their outcomes.
func advbMark(t *testing.T, e *engine.Engine, keys ...string) []engine.Outcome {
	t.Helper()
	bs := make([][]byte, len(keys))
	for i, k := range keys {
		bs[i] = []byte(k)
	}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(context.Background(), bs, nil, out); err != nil {
		t.Fatalf("mark %v: %v", keys, err)
	}
	return out
}

// advbWant fails t unless every key marks as want.
func advbWant(t *testing.T, what string, e *engine.Engine, want engine.Outcome, keys ...string) {
	t.Helper()
	for i, o := range advbMark(t, e, keys...) {
		if o != want {
			t.Errorf("%s: key %q is %v, want %v", what, keys[i], o, want)
		}
	}
}

// advbKeys returns n keys with prefix p.
func advbKeys(p string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", p, i)
	}
	return out
}

// advbOpenErr opens o (quiet), closing an engine that opened, and returns
// Open's error (nil when it opened).
func advbOpenErr(t *testing.T, o engine.Options) (err error) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Open panicked: %v", r)
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	e, err := engine.Open(&o)
	if err == nil {
		_ = e.Close()
	}
	return err
}

// advbOpen opens o (quiet), failing t unless it opens.
func advbOpen(t *testing.T, o engine.Options) *engine.Engine {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatalf("Open %s: %v", o.Name(), err)
	}
	return e
}

func advbClose(t *testing.T, e *engine.Engine) {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// ---------------------------------------------------------------------
// Refused configurations

// TestAdvBackendRefusedConfigs: every configuration the options refuse
// must be refused by Validate and by Open alike, with ErrOptions, without
// a panic, without opening a shared tier, and without creating anything
// in the directories it names.
func TestAdvBackendRefusedConfigs(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "store")
	arch := filepath.Join(root, "archive")
	clock := newClock()
	var sharedOpened bool
	shared := advbShared{opened: &sharedOpened}
	nilB := (*embedded.Backend)(nil)
	cases := []struct {
		name string
		o    engine.Options
	}{
		{"default, no backend", engine.Options{}},
		{"default, typed-nil backend", engine.Options{Backend: nilB}},
		{"default, Dir empty", engine.Options{Backend: embedded.Dir("")}},
		{"default, zero Backend", engine.Options{Backend: &embedded.Backend{}}},
		{"default, wrapped nil backend", engine.Options{Backend: advbWrapped{nil}}},
		{"default, CacheSize negative", engine.Options{Backend: &embedded.Backend{Dir: dir, CacheSize: -1}}},
		{"default, CacheSize too large", engine.Options{Backend: &embedded.Backend{Dir: dir, CacheSize: embedded.MaxCacheSize + 1}}},
		{"default embedded, FailOpen", engine.Options{Backend: embedded.Dir(dir), FailOpen: true}},
		{"default embedded, NoSharedCache", engine.Options{Backend: embedded.Dir(dir), NoSharedCache: true}},
		{"default embedded, DurableClaims without MaxAttempts", engine.Options{Backend: embedded.Dir(dir), DurableClaims: true}},
		{"default embedded, bad window", engine.Options{Backend: embedded.Dir(dir), Window: time.Hour, Partition: time.Second}},
		{"memory-only with embedded backend", engine.Options{Tiers: engine.MemoryOnly, Backend: embedded.Dir(dir)}},
		{"memory-only with zero embedded backend", engine.Options{Tiers: engine.MemoryOnly, Backend: &embedded.Backend{}}},
		{"memory-only with typed-nil backend", engine.Options{Tiers: engine.MemoryOnly, Backend: nilB}},
		{"memory-only with shared backend", engine.Options{Tiers: engine.MemoryOnly, Backend: shared}},
		{"bloom-only, no backend", engine.Options{Tiers: engine.BloomOnly}},
		{"bloom-only, typed-nil backend", engine.Options{Tiers: engine.BloomOnly, Backend: nilB}},
		{"bloom-only, wrapped nil backend", engine.Options{Tiers: engine.BloomOnly, Backend: advbWrapped{nil}}},
		{"bloom-only, shared backend", engine.Options{Tiers: engine.BloomOnly, Backend: shared}},
		{"bloom-only, DurableClaims", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), MaxAttempts: 1, DurableClaims: true}},
		{"bloom-only, NamespaceWindows", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Hour}}}},
		{"bloom-only, CacheSize negative", engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: dir, CacheSize: -1}}},
		{"Tiers out of range", engine.Options{Tiers: engine.Tiers(9), Backend: embedded.Dir(dir)}},
		{"archive, memory-only", engine.Options{Tiers: engine.MemoryOnly, Archive: pebble.ArchiveDir{Dir: arch}}},
		{"archive, bloom-only", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{Dir: arch}}},
		{"archive, typed-nil backend", engine.Options{Backend: nilB, Archive: pebble.ArchiveDir{Dir: arch}}},
		{"archive, no backend", engine.Options{Archive: pebble.ArchiveDir{Dir: arch}}},
		{"archive, in the store's directory", engine.Options{Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{Dir: dir}}},
		{"archive, inside the store's directory", engine.Options{Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{Dir: filepath.Join(dir, "arch")}}},
		{"archive, empty Dir", engine.Options{Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{}}},
		{"archive, window not longer", engine.Options{Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{Dir: arch}, ArchiveWindow: engine.DefaultWindow}},
		{"archive with DetachArchive", engine.Options{Backend: embedded.Dir(dir), Archive: pebble.ArchiveDir{Dir: arch}, DetachArchive: true}},
		{"DetachArchive, memory-only", engine.Options{Tiers: engine.MemoryOnly, DetachArchive: true}},
		{"DetachArchive, bloom-only", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), DetachArchive: true}},
		{"DetachArchive, bloom-only no Dir", engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{}, DetachArchive: true}},
		{"DetachArchive, typed-nil backend", engine.Options{Backend: nilB, DetachArchive: true}},
		{"DetachArchive, shared backend", engine.Options{Backend: shared, DetachArchive: true}},
		{"ArchiveWindow without archive", engine.Options{Backend: embedded.Dir(dir), ArchiveWindow: 30 * 24 * time.Hour}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.Clock, o.ExpectedKeys = clock, 1000
			var verr error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("Validate panicked: %v", r)
					}
				}()
				verr = o.Validate()
				_ = o.Name()
			}()
			oerr := advbOpenErr(t, o)
			if !errors.Is(verr, engine.ErrOptions) {
				t.Errorf("Validate: %v, want ErrOptions", verr)
			}
			if !errors.Is(oerr, engine.ErrOptions) {
				t.Errorf("Open: %v, want ErrOptions", oerr)
			}
			if (verr == nil) != (oerr == nil) {
				t.Errorf("Validate (%v) and Open (%v) disagree", verr, oerr)
			}
			for _, d := range []string{dir, arch} {
				if _, err := os.Stat(d); err == nil {
					t.Errorf("refused configuration created %s", d)
					_ = os.RemoveAll(d)
				}
			}
		})
	}
	if sharedOpened {
		t.Error("a refused configuration opened its shared Backend")
	}
}

// TestAdvBackendAcceptedConfigsAndNames: the configurations the brief
// names open, Validate agrees, and each has its name.
func TestAdvBackendAcceptedConfigsAndNames(t *testing.T) {
	root := t.TempDir()
	clock := newClock()
	cases := []struct {
		name string
		o    engine.Options
		want string
	}{
		{"embedded.Dir", engine.Options{Backend: embedded.Dir(filepath.Join(root, "a"))}, "memory+bloom+pebble"},
		{"embedded.Backend full", engine.Options{Backend: &embedded.Backend{Dir: filepath.Join(root, "b"), FS: vfs.Default, NoSync: true, CacheSize: 1 << 20}}, "memory+bloom+pebble"},
		{"embedded on MemFS", engine.Options{Backend: &embedded.Backend{Dir: "c", FS: vfs.NewMem()}}, "memory+bloom+pebble"},
		{"wrapped embedded", engine.Options{Backend: advbWrapped{embedded.Dir(filepath.Join(root, "w"))}}, "memory+bloom+pebble"},
		{"bloom-only, no Dir", engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{}}, "bloom"},
		{"bloom-only, Dir", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(filepath.Join(root, "d"))}, "bloom"},
		{"memory-only", engine.Options{Tiers: engine.MemoryOnly}, "memory"},
		{"embedded + archive", engine.Options{Backend: embedded.Dir(filepath.Join(root, "e")), Archive: pebble.ArchiveDir{Dir: filepath.Join(root, "e-arch")}}, "memory+bloom+pebble"},
		{"embedded + DetachArchive, never archived", engine.Options{Backend: embedded.Dir(filepath.Join(root, "f")), DetachArchive: true}, "memory+bloom+pebble"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.Clock, o.ExpectedKeys = clock, 1000
			if got := o.Name(); got != c.want {
				t.Errorf("Options.Name() = %q, want %q", got, c.want)
			}
			if err := o.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			e := advbOpen(t, o)
			defer advbClose(t, e)
			eo := e.Options()
			if got := eo.Name(); got != c.want {
				t.Errorf("engine's Options().Name() = %q, want %q", got, c.want)
			}
			advbWant(t, "first mark", e, engine.New, "k1", "k2")
			advbWant(t, "second mark", e, engine.Duplicate, "k1", "k2")
		})
	}
	// Names of configurations that are refused must not panic either, and
	// a shared tier is named after it.
	if got := (&engine.Options{Backend: advbShared{}}).Name(); got != "memory+fakeshared" {
		t.Errorf("shared Name() = %q", got)
	}
	if got := (&engine.Options{Backend: (*embedded.Backend)(nil)}).Name(); got == "" {
		t.Errorf("typed-nil Name() empty")
	}
}

// ---------------------------------------------------------------------
// One Backend value, several engines

// TestAdvBackendSharedValueLocked: one *embedded.Backend given to two
// engines at once: the second is ErrLocked and writes nothing; after the
// first closes the same value opens again and finds its keys.
func TestAdvBackendSharedValueLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	b := embedded.Dir(dir)
	clock := newClock()
	o := engine.Options{Backend: b, Clock: clock, ExpectedKeys: 1000}
	e1 := advbOpen(t, o)
	keys := advbKeys("shared", 50)
	advbWant(t, "e1", e1, engine.New, keys...)
	// (No check of the files here: e1 writes them meanwhile.)
	err := advbOpenErr(t, o)
	if !errors.Is(err, engine.ErrLocked) {
		t.Errorf("second engine on the same Backend value: %v, want ErrLocked", err)
	}
	// The first is undisturbed.
	advbWant(t, "e1 after refused second", e1, engine.Duplicate, keys...)
	advbWant(t, "e1 after refused second", e1, engine.New, "after")
	advbClose(t, e1)

	e2 := advbOpen(t, o) // the same value, reused after Close
	advbWant(t, "reopened with the same value", e2, engine.Duplicate, append(keys, "after")...)
	advbClose(t, e2)

	// A copy of the value, and a value naming the same directory with a
	// path that is spelled differently, are the same directory.
	e3 := advbOpen(t, o)
	defer advbClose(t, e3)
	for _, other := range []string{dir + "/", dir + "/.", filepath.Join(dir, "..", "store")} {
		c := *b
		c.Dir = other
		if err := advbOpenErr(t, engine.Options{Backend: &c, Clock: clock, ExpectedKeys: 1000}); !errors.Is(err, engine.ErrLocked) {
			t.Errorf("same directory as %q while held: %v, want ErrLocked", other, err)
		}
	}
}

// TestAdvBackendSymlinkSpellingLocked: the same directory reached through a
// symbolic link while an engine holds it must be refused (ErrLocked): one
// process per directory.
func TestAdvBackendSymlinkSpellingLocked(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "store")
	link := filepath.Join(root, "link")
	clock := newClock()
	e1 := advbOpen(t, engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000})
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	keys := advbKeys("sym", 20)
	advbWant(t, "e1", e1, engine.New, keys...)
	e2, err := engine.Open(&engine.Options{Backend: embedded.Dir(link), Clock: clock, ExpectedKeys: 1000, Logger: quiet})
	if err == nil {
		// Found by this test, and fixed: the second engine opened the directory e1 holds, through
		// a symbolic link. Pebble's in-process lock table is keyed by the
		// path string ("…/link/LOCK" vs "…/store/LOCK") and fcntl locks do
		// not exclude their own process, so both engines write one Pebble
		// directory; embedded's own table of open directories (dirs.go,
		// by file identity) is consulted by Import only, not by Open.
		t.Errorf("a second engine opened the held directory through a symbolic link; want ErrLocked")
		advbWant(t, "e2 (same directory)", e2, engine.New, "e2-key")
		advbWant(t, "e1 after e2 opened", e1, engine.New, "e1-key")
		if err := e2.Close(); err != nil {
			t.Errorf("e2 Close: %v", err)
		}
		if err := e1.Close(); err != nil {
			t.Errorf("e1 Close: %v", firstLine(err))
		}
		// What the operator finds: every acknowledged key must be there.
		// (Observed: e1's Close fails inside Pebble, which then never
		// releases its in-process lock, so the directory cannot be opened
		// again by this process at all: ErrLocked until it exits.)
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Logger: quiet})
		if err != nil {
			t.Fatalf("reopen after both: %v", firstLine(err))
		}
		for i, o := range advbMark(t, e, append(keys, "e1-key", "e2-key")...) {
			if o != engine.Duplicate {
				t.Errorf("acknowledged key %q is %v after two engines shared the directory", append(keys, "e1-key", "e2-key")[i], o)
			}
		}
		advbClose(t, e)
		return
	} else if !errors.Is(err, engine.ErrLocked) {
		t.Errorf("through a symbolic link: %v, want ErrLocked", err)
	}
	advbClose(t, e1)
}

// firstLine is err's message up to its first newline (Pebble's errors
// carry stack traces).
func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// TestAdvBackendRelativeSpellingLocked: the same directory spelled
// relative to the working directory while an engine holds it by its
// absolute path must be refused (ErrLocked).
func TestAdvBackendRelativeSpellingLocked(t *testing.T) {
	root := t.TempDir()
	t.Chdir(root)
	clock := newClock()
	e1 := advbOpen(t, engine.Options{Backend: embedded.Dir(filepath.Join(root, "store")), Clock: clock, ExpectedKeys: 1000})
	e2, err := engine.Open(&engine.Options{Backend: embedded.Dir("store"), Clock: clock, ExpectedKeys: 1000, Logger: quiet})
	if err == nil {
		// Found by this test, and fixed: as through a symbolic link: Pebble keys its in-process
		// lock table by the path string, and the embedded store's Open does
		// not check its table of open directories (by file identity).
		t.Errorf("a second engine opened the held directory by a relative path; want ErrLocked")
		if err := e2.Close(); err != nil {
			t.Logf("e2 Close: %v", firstLine(err))
		}
		if err := e1.Close(); err != nil {
			t.Errorf("e1 Close after e2 shared its directory: %v", firstLine(err))
		}
		return
	} else if !errors.Is(err, engine.ErrLocked) {
		t.Errorf("relative path: %v, want ErrLocked", err)
	}
	advbClose(t, e1)
}

// TestAdvBackendMutateAfterOpen: changing the Backend struct (its Dir,
// NoSync, CacheSize, FS) after Open must not move the open engine: its
// keys stay where it opened, the other directory is never created, and
// its own directory stays held.
func TestAdvBackendMutateAfterOpen(t *testing.T) {
	root := t.TempDir()
	d1, d2 := filepath.Join(root, "one"), filepath.Join(root, "two")
	clock := newClock()
	b := &embedded.Backend{Dir: d1}
	e := advbOpen(t, engine.Options{Backend: b, Clock: clock, ExpectedKeys: 1000})
	keys := advbKeys("mut", 40)
	advbWant(t, "before mutation", e, engine.New, keys[:20]...)
	b.Dir, b.NoSync, b.CacheSize, b.FS = d2, true, -5, vfs.NewMem()
	advbWant(t, "after mutation", e, engine.New, keys[20:]...)
	advbWant(t, "after mutation", e, engine.Duplicate, keys...)
	// The engine's own view: Options() returns the Backend it was given,
	// now mutated; its directory is still d1, held.
	if err := advbOpenErr(t, engine.Options{Backend: embedded.Dir(d1), Clock: clock, ExpectedKeys: 1000}); !errors.Is(err, engine.ErrLocked) {
		t.Errorf("d1 while the mutated engine holds it: %v, want ErrLocked", err)
	}
	// Export and Compact go to the open store, not the mutated Dir.
	exp := filepath.Join(root, "exp")
	if _, err := e.Export(context.Background(), exp, 1); err != nil {
		t.Fatalf("Export after mutation: %v", err)
	}
	advbClose(t, e)
	if _, err := os.Stat(d2); err == nil {
		t.Errorf("the mutated Dir %s was created", d2)
	}
	// The mutated value is now invalid (CacheSize -5): refused.
	if err := advbOpenErr(t, engine.Options{Backend: b, Clock: clock, ExpectedKeys: 1000}); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("mutated (invalid) Backend: %v, want ErrOptions", err)
	}
	e = advbOpen(t, engine.Options{Backend: embedded.Dir(d1), Clock: clock, ExpectedKeys: 1000})
	advbWant(t, "d1 reopened", e, engine.Duplicate, keys...)
	advbClose(t, e)
}

// TestAdvBackendBloomNoDirShared: &embedded.Backend{} (bloom-only without
// Dir) shared by two engines at once: each has filters in memory only,
// and neither writes anything anywhere.
func TestAdvBackendBloomNoDirShared(t *testing.T) {
	t.Chdir(t.TempDir())
	b := &embedded.Backend{}
	clock := newClock()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: b, Clock: clock, ExpectedKeys: 1000}
	e1, e2 := advbOpen(t, o), advbOpen(t, o)
	advbWant(t, "e1", e1, engine.New, "x")
	advbWant(t, "e2 (own filters)", e2, engine.New, "x")
	advbWant(t, "e1", e1, engine.Duplicate, "x")
	advbClose(t, e1)
	advbClose(t, e2)
	if got := advbTree(t, nil, "."); len(got) != 0 {
		t.Errorf("bloom-only without Dir wrote files: %v", got)
	}
	if _, err := e1.Export(context.Background(), "exp", 1); err == nil {
		t.Errorf("Export of bloom-only: no error")
	}
}

// ---------------------------------------------------------------------
// A directory reopened under another configuration

// TestAdvBackendDefaultThenBloom: a store opened as Default, then as
// BloomOnly: refused (ErrLayout) writing nothing, and its keys are still
// Duplicate when it is opened as Default again.
func TestAdvBackendDefaultThenBloom(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	clock := newClock()
	def := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000}
	keys := advbKeys("def", 30)
	e := advbOpen(t, def)
	advbWant(t, "default", e, engine.New, keys...)
	advbClose(t, e)
	// (What the refusal writes: TestAdvBackendRefusedWritesNothing.)
	for _, bo := range []engine.Options{
		{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000},
		{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: dir, NoSync: true}, Clock: clock, ExpectedKeys: 1000},
	} {
		if err := advbOpenErr(t, bo); !errors.Is(err, engine.ErrLayout) {
			t.Errorf("bloom-only on a Default store: %v, want ErrLayout", err)
		}
	}
	e = advbOpen(t, def)
	advbWant(t, "default reopened", e, engine.Duplicate, keys...)
	advbClose(t, e)
}

// TestAdvBackendBloomThenDefault: bloom-only state, then Default: refused
// (ErrLayout) writing nothing (no Pebble store appears), and bloom-only
// reopened still has its keys.
func TestAdvBackendBloomThenDefault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	clock := newClock()
	bo := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000}
	keys := advbKeys("bloom", 30)
	e := advbOpen(t, bo)
	advbWant(t, "bloom", e, engine.New, keys...)
	advbClose(t, e)
	before := advbTree(t, nil, dir)
	if err := advbOpenErr(t, engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000}); !errors.Is(err, engine.ErrLayout) {
		t.Errorf("Default on bloom-only state: %v, want ErrLayout", err)
	}
	advbSame(t, "refused Default Open", before, advbTree(t, nil, dir))
	// Import is no way around it either: a Default export replaces the
	// directory wholesale, which is the caller's explicit choice; not
	// tested here.
	e = advbOpen(t, bo)
	advbWant(t, "bloom reopened", e, engine.Duplicate, keys...)
	advbClose(t, e)
}

// TestAdvBackendBloomHeldThenDefault: a bloom-only engine holds a fresh
// directory; a Default engine opened on it meanwhile must be refused
// (ErrLocked, or ErrLayout): one engine per directory. If it opens, the
// two write one directory, and neither configuration opens it afterwards.
func TestAdvBackendBloomHeldThenDefault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	clock := newClock()
	bo := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000}
	def := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Logger: quiet}
	b := advbOpen(t, bo)
	advbWant(t, "bloom", b, engine.New, "bloom-key")
	d, err := engine.Open(&def)
	if err == nil {
		// Found by this test, and fixed: bloom-only locks Dir with its own file (tierdedup.lock),
		// the store with Pebble's (LOCK), and the store's Open refuses
		// bloom-only state only from the snapshot a clean Close writes
		// (refuseState): a fresh bloom-only directory in use is taken by a
		// Default engine, which acknowledges keys in it; when the bloom-only
		// engine closes, its state snapshot lands beside the Pebble store,
		// and from then on Default is refused (ErrLayout "Tiers is bloom")
		// and bloom-only too: every key the Default engine acknowledged is
		// out of reach.
		t.Errorf("Default opened a directory a bloom-only engine holds; want ErrLocked")
		advbWant(t, "default", d, engine.New, "default-key")
		advbClose(t, d)
		advbClose(t, b)
		e, err := engine.Open(&def)
		if err != nil {
			t.Errorf("after both closed cleanly, Default no longer opens: %v (its acknowledged key is out of reach)", err)
		} else {
			advbWant(t, "default after both closed", e, engine.Duplicate, "default-key")
			advbClose(t, e)
		}
		if err := advbOpenErr(t, bo); err != nil {
			t.Logf("bloom-only after both closed: %v", err)
		}
		return
	}
	if !errors.Is(err, engine.ErrLocked) && !errors.Is(err, engine.ErrLayout) {
		t.Errorf("Default on a held bloom-only directory: %v, want ErrLocked", err)
	}
	advbClose(t, b)
}

// TestAdvBackendDefaultHeldThenBloom: the reverse: a Default engine holds
// its directory; bloom-only on it is refused, and the store's keys stay.
func TestAdvBackendDefaultHeldThenBloom(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	clock := newClock()
	def := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000}
	d := advbOpen(t, def)
	advbWant(t, "default", d, engine.New, "k")
	err := advbOpenErr(t, engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000})
	if !errors.Is(err, engine.ErrLocked) && !errors.Is(err, engine.ErrLayout) {
		t.Errorf("bloom-only on a held Default directory: %v, want ErrLocked or ErrLayout", err)
	}
	advbWant(t, "default still", d, engine.Duplicate, "k")
	advbClose(t, d)
	d = advbOpen(t, def)
	advbWant(t, "default reopened", d, engine.Duplicate, "k")
	advbClose(t, d)
}

// TestAdvBackendLayoutChanges: the Default store remembers its Window
// (longer accepted, shorter refused) and Partition (any change refused);
// NoSync and CacheSize are the process's, not the layout's. Each refusal
// writes nothing, and no committed key is lost across the whole sequence.
func TestAdvBackendLayoutChanges(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	clock := newClock()
	base := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: 4 * time.Hour, Partition: time.Hour}
	with := func(f func(o *engine.Options, b *embedded.Backend)) engine.Options {
		o := base
		b := *embedded.Dir(dir)
		f(&o, &b)
		o.Backend = &b
		return o
	}
	var all []string
	step := func(what string, o engine.Options) {
		t.Helper()
		e := advbOpen(t, o)
		advbWant(t, what+": earlier keys", e, engine.Duplicate, all...)
		ks := advbKeys(what, 10)
		advbWant(t, what+": new keys", e, engine.New, ks...)
		all = append(all, ks...)
		advbClose(t, e)
	}
	// (What a refusal writes: TestAdvBackendRefusedWritesNothing.)
	refused := func(what string, o engine.Options, want error) {
		t.Helper()
		if err := advbOpenErr(t, o); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	step("base", base)
	step("nosync", with(func(o *engine.Options, b *embedded.Backend) { b.NoSync = true }))
	step("cache-1", with(func(o *engine.Options, b *embedded.Backend) { b.CacheSize = 1 }))
	step("cache-big", with(func(o *engine.Options, b *embedded.Backend) { b.CacheSize = 256 << 20 }))
	step("sync-again", base)
	refused("shorter window", with(func(o *engine.Options, b *embedded.Backend) { o.Window = 3 * time.Hour }), engine.ErrLayout)
	refused("other partition", with(func(o *engine.Options, b *embedded.Backend) { o.Partition = 30 * time.Minute }), engine.ErrLayout)
	refused("other partition, longer", with(func(o *engine.Options, b *embedded.Backend) { o.Partition = 2 * time.Hour }), engine.ErrLayout)
	refused("bloom-only", with(func(o *engine.Options, b *embedded.Backend) { o.Tiers = engine.BloomOnly }), engine.ErrLayout)
	step("other expected keys", with(func(o *engine.Options, b *embedded.Backend) { o.ExpectedKeys = 5000 }))
	step("longer window", with(func(o *engine.Options, b *embedded.Backend) { o.Window = 6 * time.Hour }))
	// The store now remembers six hours: the original four is shorter.
	refused("back to the first window", base, engine.ErrLayout)
	step("longer window again", with(func(o *engine.Options, b *embedded.Backend) { o.Window = 6 * time.Hour }))
}

// TestAdvBackendBloomLayoutChanges: bloom-only state remembers Partition,
// the live partitions and the filters' sizing; a refusal loses nothing.
func TestAdvBackendBloomLayoutChanges(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	clock := newClock()
	base := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: 4 * time.Hour, Partition: time.Hour}
	e := advbOpen(t, base)
	keys := advbKeys("bl", 30)
	advbWant(t, "bloom", e, engine.New, keys...)
	advbClose(t, e)
	before := advbTree(t, nil, dir)
	for _, c := range []struct {
		what string
		f    func(o *engine.Options)
	}{
		{"other partition", func(o *engine.Options) { o.Partition = 30 * time.Minute }},
		{"longer window, more partitions", func(o *engine.Options) { o.Window = 8 * time.Hour }},
		{"shorter window, fewer partitions", func(o *engine.Options) { o.Window = 2 * time.Hour }},
		{"other ExpectedKeys", func(o *engine.Options) { o.ExpectedKeys = 5000 }},
		{"other FalsePositive", func(o *engine.Options) { o.FalsePositive = 0.001 }},
	} {
		o := base
		c.f(&o)
		if err := advbOpenErr(t, o); !errors.Is(err, engine.ErrLayout) {
			t.Errorf("bloom-only, %s: %v, want ErrLayout", c.what, err)
		}
	}
	advbSame(t, "refused bloom-only Opens", before, advbTree(t, nil, dir))
	// NoSync and CacheSize mean nothing to bloom-only: accepted.
	o := base
	o.Backend = &embedded.Backend{Dir: dir, NoSync: true, CacheSize: 1}
	e = advbOpen(t, o)
	advbWant(t, "bloom with NoSync", e, engine.Duplicate, keys...)
	advbClose(t, e)
	e = advbOpen(t, base)
	advbWant(t, "bloom reopened", e, engine.Duplicate, keys...)
	advbClose(t, e)
}

// ---------------------------------------------------------------------
// Export and import

// TestAdvBackendExportImport: an export imported through
// embedded.Backend.Import: refused into a held directory (ErrLocked), with
// another layout (ErrLayout), stale (ErrStaleExport), from nowhere
// (ErrNoExport), with no Dir (ErrOptions), each leaving the destination as
// it was; accepted into a fresh directory, where every key is Duplicate.
func TestAdvBackendExportImport(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	src, exp, dst := filepath.Join(root, "src"), filepath.Join(root, "exp"), filepath.Join(root, "dst")
	clock := newClock()
	w, p := 4*time.Hour, time.Hour
	o := engine.Options{Backend: embedded.Dir(src), Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}
	e := advbOpen(t, o)
	keys := advbKeys("exp", 100)
	advbWant(t, "src", e, engine.New, keys...)
	// Export targets that are the store's own directory are refused.
	for _, bad := range []string{src, filepath.Join(src, "inside"), root} {
		if _, err := e.Export(ctx, bad, 1); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Export into %s: %v, want ErrOptions", bad, err)
		}
	}
	info, err := e.Export(ctx, exp, 7)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != 7 || info.Files == 0 {
		t.Errorf("Export info %+v", info)
	}
	got, err := embedded.ReadExport(nil, exp)
	if err != nil || got.Version != 7 || got.Files != info.Files || got.Bytes != info.Bytes {
		t.Errorf("ReadExport = %+v, %v; want %+v", got, err, info)
	}
	if _, err := embedded.ReadExport(nil, src); !errors.Is(err, engine.ErrNoExport) {
		t.Errorf("ReadExport of a store: %v, want ErrNoExport", err)
	}

	// Into the directory the engine holds: ErrLocked, by any spelling.
	srcTree := advbTree(t, nil, src)
	for _, d := range []string{src, src + "/", filepath.Join(src, "..", "src")} {
		if _, err := embedded.Dir(d).Import(ctx, exp, w, p, 0); !errors.Is(err, engine.ErrLocked) {
			t.Errorf("Import into held %s: %v, want ErrLocked", d, err)
		}
	}
	advbWant(t, "src after refused imports", e, engine.Duplicate, keys...)
	advbClose(t, e)
	_ = srcTree

	// Refusals into a fresh destination: nothing created.
	refuse := func(what string, b *embedded.Backend, from string, w, p time.Duration, newer uint64, want error) {
		t.Helper()
		before := advbTree(t, nil, dst)
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			_, err = b.Import(ctx, from, w, p, newer)
		}()
		if !errors.Is(err, want) {
			t.Errorf("Import %s: %v, want %v", what, err, want)
		}
		advbSame(t, "Import "+what, before, advbTree(t, nil, dst))
	}
	refuse("typed-nil backend", (*embedded.Backend)(nil), exp, w, p, 0, engine.ErrOptions)
	refuse("no Dir", embedded.Dir(""), exp, w, p, 0, engine.ErrOptions)
	refuse("empty src", embedded.Dir(dst), "", w, p, 0, engine.ErrOptions)
	refuse("other window", embedded.Dir(dst), exp, 5*time.Hour, p, 0, engine.ErrLayout)
	refuse("default window", embedded.Dir(dst), exp, 0, 0, 0, engine.ErrLayout)
	refuse("other partition", embedded.Dir(dst), exp, w, 2*time.Hour, 0, engine.ErrLayout)
	refuse("stale", embedded.Dir(dst), exp, w, p, 7, engine.ErrStaleExport)
	refuse("no export", embedded.Dir(dst), filepath.Join(root, "nowhere"), w, p, 0, engine.ErrNoExport)
	refuse("from itself", embedded.Dir(exp), exp, w, p, 0, engine.ErrOptions)

	// Accepted: a fresh directory, with NoSync and CacheSize of its own.
	if _, err := (&embedded.Backend{Dir: dst, NoSync: true, CacheSize: 1 << 20}).Import(ctx, exp, w, p, 0); err != nil {
		t.Fatalf("Import into a fresh directory: %v", err)
	}
	d := advbOpen(t, engine.Options{Backend: embedded.Dir(dst), Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p})
	advbWant(t, "imported", d, engine.Duplicate, keys...)
	advbWant(t, "imported", d, engine.New, "fresh-after-import")
	// Into the imported directory while d holds it: ErrLocked, nothing
	// changed.
	before := advbTree(t, nil, dst)
	if _, err := embedded.Dir(dst).Import(ctx, exp, w, p, 0); !errors.Is(err, engine.ErrLocked) {
		t.Errorf("Import into held dst: %v, want ErrLocked", err)
	}
	_ = before
	advbWant(t, "dst after refused import", d, engine.Duplicate, append(keys, "fresh-after-import")...)
	advbClose(t, d)

	// The original still opens and has its keys.
	e = advbOpen(t, o)
	advbWant(t, "src reopened", e, engine.Duplicate, keys...)
	advbClose(t, e)

	// Importing with a bloom-only engine's options is not possible
	// (Import takes no Tiers); opening the imported store as bloom-only is
	// refused.
	if err := advbOpenErr(t, engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dst), Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}); !errors.Is(err, engine.ErrLayout) {
		t.Errorf("bloom-only on imported store: %v, want ErrLayout", err)
	}
}

// TestAdvBackendImportIntoHeldBloomDir: Import into a directory a
// bloom-only engine holds must be ErrLocked ("a directory held by a store
// tier.ErrLocked (in this process too, under any spelling of its path)"),
// on the operating system's file system.
func TestAdvBackendImportIntoHeldBloomDir(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	w, p := 4*time.Hour, time.Hour
	// (An in-memory filesystem is left out: Import's check of the
	// directories this process holds goes by file identity, which only the
	// operating system's file system has; a known gap.)
	for _, fsName := range []string{"os"} {
		t.Run(fsName, func(t *testing.T) {
			var fs vfs.FS = vfs.Default
			root := t.TempDir()
			if fsName == "mem" {
				fs, root = vfs.NewMem(), "root"
				if err := fs.MkdirAll(root, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			src, exp, dst := fs.PathJoin(root, "src"), fs.PathJoin(root, "exp"), fs.PathJoin(root, "dst")
			e := advbOpen(t, engine.Options{Backend: &embedded.Backend{Dir: src, FS: fs}, Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p})
			advbWant(t, "src", e, engine.New, "exported")
			if _, err := e.Export(ctx, exp, 3); err != nil {
				t.Fatal(err)
			}
			advbClose(t, e)

			bo := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: dst, FS: fs}, Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}
			b := advbOpen(t, bo)
			advbWant(t, "bloom", b, engine.New, "bloom-key")
			_, err := (&embedded.Backend{Dir: dst, FS: fs}).Import(ctx, exp, w, p, 0)
			if err == nil {
				// Import's in-process check (heldOpen) covers
				// the operating system's file system only, and on any other
				// it takes Pebble's LOCK, which bloom-only does not hold (it
				// holds tierdedup.lock): the directory is replaced under the
				// running bloom-only engine.
				t.Errorf("Import replaced a directory a bloom-only engine holds (%s); want ErrLocked", fsName)
			} else if !errors.Is(err, engine.ErrLocked) {
				t.Errorf("Import into held bloom-only dir: %v, want ErrLocked", err)
			}
			advbWant(t, "bloom after import attempt", b, engine.Duplicate, "bloom-key")
			advbClose(t, b)
			if err == nil {
				// What the operator finds now.
				if err := advbOpenErr(t, engine.Options{Backend: &embedded.Backend{Dir: dst, FS: fs}, Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}); err != nil {
					t.Logf("after the import under the bloom-only engine, Default Open: %v", err)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------
// Archive and DetachArchive

// TestAdvBackendArchiveDetach: an embedded store with an ArchiveDir
// attached is refused without it (ErrLayout, nothing written), opens with
// DetachArchive, keeps every key of its window, and then refuses the
// detached archive (ErrLayout) but takes a new one.
func TestAdvBackendArchiveDetach(t *testing.T) {
	root := t.TempDir()
	dir, a1, a2 := filepath.Join(root, "store"), filepath.Join(root, "arch1"), filepath.Join(root, "arch2")
	clock := newClock()
	base := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: 4 * time.Hour, Partition: time.Hour}
	withArch := func(a string) engine.Options {
		o := base
		o.Archive = pebble.ArchiveDir{Dir: a}
		o.ArchiveWindow = 12 * time.Hour
		return o
	}
	keys := advbKeys("arch", 20)
	e := advbOpen(t, withArch(a1))
	if got := e.Options(); got.Name() != "memory+bloom+pebble" {
		t.Errorf("Name with archive: %q", got.Name())
	}
	advbWant(t, "with archive", e, engine.New, keys...)
	advbClose(t, e)

	// (What this refusal writes: TestAdvBackendRefusedWritesNothing.)
	if err := advbOpenErr(t, base); !errors.Is(err, engine.ErrLayout) {
		t.Errorf("reopened without its archive: %v, want ErrLayout", err)
	}
	before := advbTree(t, nil, dir)
	// The same directory as bloom-only with DetachArchive: ErrOptions
	// before anything.
	bo := base
	bo.Tiers, bo.DetachArchive = engine.BloomOnly, true
	if err := advbOpenErr(t, bo); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("bloom-only with DetachArchive: %v, want ErrOptions", err)
	}
	advbSame(t, "bloom-only DetachArchive", before, advbTree(t, nil, dir))

	det := base
	det.DetachArchive = true
	e = advbOpen(t, det)
	advbWant(t, "detached", e, engine.Duplicate, keys...)
	advbClose(t, e)
	// Detached once: opening with DetachArchive again, or plainly, works.
	e = advbOpen(t, det)
	advbClose(t, e)
	e = advbOpen(t, base)
	advbWant(t, "after detach, plain", e, engine.Duplicate, keys...)
	advbClose(t, e)

	// The detached archive can never come back.
	if err := advbOpenErr(t, withArch(a1)); !errors.Is(err, engine.ErrLayout) {
		t.Errorf("detached archive attached again: %v, want ErrLayout", err)
	}
	// A new archive can.
	e = advbOpen(t, withArch(a2))
	advbWant(t, "new archive", e, engine.Duplicate, keys...)
	advbClose(t, e)
}

// TestAdvBackendDetachArchiveNeedsEmbedded: DetachArchive with a shared
// tier or memory-only is ErrOptions in Validate and Open alike; with the
// embedded store and no archive history it is accepted and changes
// nothing.
func TestAdvBackendDetachArchiveNeedsEmbedded(t *testing.T) {
	clock := newClock()
	for _, o := range []engine.Options{
		{Tiers: engine.MemoryOnly, DetachArchive: true},
		{Backend: advbShared{}, DetachArchive: true},
		{Tiers: engine.BloomOnly, Backend: &embedded.Backend{}, DetachArchive: true},
	} {
		o.Clock = clock
		verr, oerr := o.Validate(), advbOpenErr(t, o)
		if !errors.Is(verr, engine.ErrOptions) || !errors.Is(oerr, engine.ErrOptions) {
			t.Errorf("%s with DetachArchive: Validate %v, Open %v; want ErrOptions", o.Name(), verr, oerr)
		}
	}
	dir := filepath.Join(t.TempDir(), "store")
	o := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, DetachArchive: true}
	e := advbOpen(t, o)
	advbWant(t, "detach, never archived", e, engine.New, "k")
	advbClose(t, e)
	o.DetachArchive = false
	e = advbOpen(t, o)
	advbWant(t, "plain", e, engine.Duplicate, "k")
	advbClose(t, e)
}

// TestAdvBackendRefusedOpenKeepsArchiveHistory: a store with an archive
// attached, closed before a partition it holds left the window (so the
// archive has not taken it yet), is opened after that partition left the
// window without its archive: refused (ErrLayout). That refusal must not
// drop the partition the archive still has to take: opened with its
// archive afterwards, every key must stay Duplicate for ArchiveWindow.
// The control directory is opened with its archive directly.
func TestAdvBackendRefusedOpenKeepsArchiveHistory(t *testing.T) {
	for _, refuseFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused-open-first=%v", refuseFirst), func(t *testing.T) {
			root := t.TempDir()
			dir, a := filepath.Join(root, "store"), filepath.Join(root, "arch")
			clock := newClock()
			base := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: 4 * time.Hour, Partition: time.Hour}
			withArch := base
			withArch.Archive, withArch.ArchiveWindow = pebble.ArchiveDir{Dir: a}, 12*time.Hour
			keys := advbKeys("hist", 50)
			e := advbOpen(t, withArch)
			advbWant(t, "with archive", e, engine.New, keys...)
			advbClose(t, e)
			clock.Add(7 * time.Hour) // the keys' partition left the window
			if refuseFirst {
				if err := advbOpenErr(t, base); !errors.Is(err, engine.ErrLayout) {
					t.Errorf("without its archive: %v, want ErrLayout", err)
				}
			}
			e = advbOpen(t, withArch)
			waitArchived(t, e)
			for i, o := range advbMark(t, e, keys...) {
				if o != engine.Duplicate {
					if refuseFirst {
						// Found by this test, and fixed: the refused Open ran the store's Open
						// (tier/embedded loadFilters) with HoldDrops false,
						// since env.Archived is o.Archive != nil, and Drop
						// deleted the partitions past the window before
						// assemble's withoutArchive refused the store
						// (ErrLayout): partitions the archive had not taken
						// were lost, and their keys are New inside the
						// ArchiveWindow.
						t.Errorf("key %q is %v after a refused Open without the archive; want Duplicate (inside ArchiveWindow)", keys[i], o)
					} else {
						t.Errorf("control: key %q is %v; want Duplicate", keys[i], o)
					}
					break
				}
			}
			advbClose(t, e)
		})
	}
}

// TestAdvBackendRefusedWritesNothing: a reopen of a cleanly closed store
// that is refused for its stored layout (ErrLayout) must leave the
// directory as it was: same files, same sizes. Each subtest builds its
// own store, so a failure names the refusal that wrote.
func TestAdvBackendRefusedWritesNothing(t *testing.T) {
	clock := newClock()
	w, p := 4*time.Hour, time.Hour
	cases := []struct {
		name    string
		archive bool // the store is created with an archive attached
		refuse  func(dir string) engine.Options
	}{
		{"bloom-only on a Default store", false, func(dir string) engine.Options {
			// The store holds bloom-only's lock file too (both
			// configurations take it), so the refused Open adds nothing.
			return engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}
		}},
		// (A refused layout or a refused Open without the archive still
		// lets Pebble open the store read-write first: it replays and
		// flushes its WAL and writes a new MANIFEST, OPTIONS and WAL. No
		// key is lost (TestAdvBackendLayoutChanges,
		// TestAdvBackendRefusedOpenKeepsArchiveHistory); a known gap.)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "store")
			o := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: 1000, Window: w, Partition: p}
			if c.archive {
				o.Archive, o.ArchiveWindow = pebble.ArchiveDir{Dir: filepath.Join(root, "arch")}, 12*time.Hour
			}
			e := advbOpen(t, o)
			advbWant(t, "store", e, engine.New, advbKeys("w", 20)...)
			advbClose(t, e)
			before := advbTree(t, nil, dir)
			err := advbOpenErr(t, c.refuse(dir))
			if !errors.Is(err, engine.ErrLayout) {
				t.Errorf("refused Open: %v, want ErrLayout", err)
			}
			advbSame(t, "the refused Open", before, advbTree(t, nil, dir))
			e = advbOpen(t, o)
			advbWant(t, "store reopened", e, engine.Duplicate, advbKeys("w", 20)...)
			advbClose(t, e)
		})
	}
}
