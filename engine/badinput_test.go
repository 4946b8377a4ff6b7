package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// expectErr fails unless err matches want.
func expectErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// TestResultsBadInput: a result over MaxResultSize is refused with
// ErrResultTooLarge by every commit path, before anything is written; one
// of exactly MaxResultSize is stored; DoResult releases the key.
func TestResultsBadInput(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{MaxResultSize: 16, Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			big, max := bytes.Repeat([]byte("x"), 17), bytes.Repeat([]byte("y"), 16)
			a, _ := e.Claim(ctx, []byte("a"))
			b, _ := e.Claim(ctx, []byte("b"))
			a.Result, b.Result = max, big
			expectErr(t, "CommitBatch [ok, too large]", e.CommitBatch(ctx, []engine.Claim{a, b}, nil), engine.ErrResultTooLarge)
			expectErr(t, "Commit too large", e.Commit(ctx, b), engine.ErrResultTooLarge)
			done := make(chan error, 1)
			e.CommitAsync(ctx, b, func(err error) { done <- err })
			expectErr(t, "CommitAsync too large", <-done, engine.ErrResultTooLarge)
			e.CommitBatchAsync(ctx, []engine.Claim{a, b}, nil, func(err error) { done <- err })
			expectErr(t, "CommitBatchAsync too large", <-done, engine.ErrResultTooLarge)
			if err := e.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"a", "b"} {
				if in, err := e.Lookup(ctx, []byte(k)); err != nil || in.Outcome != engine.InFlight {
					t.Errorf("%s after refused commits: %v %v, want still held, uncommitted", k, in.Outcome, err)
				}
			}
			if err := e.Commit(ctx, a); err != nil {
				t.Fatalf("a result of exactly MaxResultSize: %v", err)
			}
			runs := 0
			o, res, err := e.DoResult(ctx, []byte("d"), func(context.Context) ([]byte, error) { runs++; return big, nil })
			expectErr(t, fmt.Sprintf("DoResult too large (%v %q)", o, res), err, engine.ErrResultTooLarge)
			o, res, err = e.DoResult(ctx, []byte("d"), func(context.Context) ([]byte, error) { runs++; return max, nil })
			if err != nil || o != engine.New || !bytes.Equal(res, max) || runs != 2 {
				t.Errorf("DoResult after a refused one: %v %q %v runs %d, want New (the key was released)", o, res, err, runs)
			}
			x := other()
			for _, k := range []string{"a", "d"} {
				if in, err := x.Lookup(ctx, []byte(k)); err != nil || in.Outcome != engine.Duplicate || !bytes.Equal(in.Result, max) {
					t.Errorf("%s from another engine: %v %q %v", k, in.Outcome, in.Result, err)
				}
			}
		})
	}
	for _, m := range []int{-1, engine.MaxResultSize + 1, math.MaxInt} {
		o := engine.Options{Tiers: engine.MemoryOnly, MaxResultSize: m}
		expectErr(t, fmt.Sprintf("MaxResultSize %d", m), o.Validate(), engine.ErrOptions)
	}
	bl := open(t, engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 1000})
	defer bl.Close()
	ran := false
	_, _, err := bl.DoResult(ctx, []byte("k"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	expectErr(t, "bloom-only DoResult", err, engine.ErrOptions)
	if ran {
		t.Errorf("bloom-only DoResult ran its handler")
	}
}

// TestAdvanceBadInput: version 0 anywhere in a batch, empty or long
// entities, mismatched lengths and a namespace too long for its versions'
// name are refused with typed errors and hold nothing; the extreme version
// works.
func TestAdvanceBadInput(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute, MaxKeySize: 8})
			defer e.Close()
			out := make([]engine.Claim, 2)
			expectErr(t, "version 0", e.AdvanceBatch(ctx, bs("p", "q"), []uint64{1, 0}, out), engine.ErrVersion)
			expectErr(t, "empty entity", e.AdvanceBatch(ctx, [][]byte{[]byte("p"), nil}, []uint64{1, 1}, out), engine.ErrEmptyKey)
			expectErr(t, "long entity", e.AdvanceBatch(ctx, bs("p", "123456789"), []uint64{1, 1}, out), engine.ErrKeyTooLong)
			expectErr(t, "lengths", e.AdvanceBatch(ctx, bs("p", "q"), []uint64{1}, out), engine.ErrBatch)
			expectErr(t, "lengths", e.AdvanceBatch(ctx, bs("p", "q"), []uint64{1, 1}, out[:1]), engine.ErrBatch)
			ns, err := e.Namespace(strings.Repeat("n", engine.MaxNamespace))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ns.Advance(ctx, []byte("p"), 1)
			expectErr(t, "Advance in a 255-byte namespace", err, engine.ErrNamespace)
			c, err := e.Advance(ctx, []byte("p"), 1)
			if err != nil || c.Outcome != engine.New {
				t.Errorf("p after refused batches: %v %v, want New (nothing held)", c.Outcome, err)
			}
			c, err = e.Advance(ctx, []byte("q"), math.MaxUint64)
			if err != nil || c.Outcome != engine.New {
				t.Fatalf("max version: %v %v", c.Outcome, err)
			}
			if err := e.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
			for v, want := range map[uint64]engine.Outcome{math.MaxUint64: engine.Duplicate, math.MaxUint64 - 1: engine.Stale, 1: engine.Stale} {
				if c, err := e.Advance(ctx, []byte("q"), v); err != nil || c.Outcome != want || c.Version != math.MaxUint64 {
					t.Errorf("Advance(q, %d) over max: %v (stored %d) %v, want %v", v, c.Outcome, c.Version, err, want)
				}
			}
			c.Result = []byte("r")
			expectErr(t, "Commit of an Advance claim with a Result", e.Commit(ctx, c), engine.ErrOptions)
		})
	}
	for _, cfg := range configs("memory", "postgres") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{})
			defer e.Close()
			_, err := e.Advance(ctx, []byte("p"), 1)
			expectErr(t, "Advance", err, engine.ErrOptions)
		})
	}
}

// TestNamespaceBadInput: reserved, too long and NUL-prefixed names
// are ErrNamespace; a namespace Window outside (Lease, Window], or with
// BloomOnly or Postgres, are ErrOptions.
func TestNamespaceBadInput(t *testing.T) {
	e := open(t, engine.Options{Tiers: engine.MemoryOnly})
	defer e.Close()
	for _, name := range []string{"\x00", "\x00token/used", "\x00token/issued", "\x00v/", "\x00v/x", strings.Repeat("a", engine.MaxNamespace+1)} {
		if ns, err := e.Namespace(name); !errors.Is(err, engine.ErrNamespace) || ns != nil {
			t.Errorf("Namespace(%.20q): %v %v, want ErrNamespace", name, ns, err)
		}
	}
	for _, name := range []string{"", "a\x00", strings.Repeat("a", engine.MaxNamespace)} {
		if _, err := e.Namespace(name); err != nil {
			t.Errorf("Namespace(%.20q): %v", name, err)
		}
	}
	lease, window := time.Minute, time.Hour
	// The configurations: o's Tiers and Backend.
	memory, bloom := engine.Options{Tiers: engine.MemoryOnly}, engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly}
	pg := engine.Options{Backend: pgBackend(faultDB{}, "")}
	for _, tc := range []struct {
		config engine.Options
		name   string
		w      time.Duration
	}{
		{memory, "n", -1}, {memory, "n", math.MinInt64},
		{memory, "n", window + 1}, {memory, "n", lease}, {memory, "n", lease - 1},
		{memory, "\x00n", window}, {memory, strings.Repeat("a", 256), window},
		{bloom, "n", window}, {pg, "n", window}, {memory, "n", math.MaxInt64},
	} {
		o := engine.Options{Tiers: tc.config.Tiers, Backend: tc.config.Backend, Window: window, Partition: time.Minute, Lease: lease, Namespaces: map[string]engine.NamespaceOptions{tc.name: {Window: tc.w}}}
		expectErr(t, fmt.Sprintf("%v NamespaceWindows[%.10q] = %v", o.Name(), tc.name, tc.w), o.Validate(), engine.ErrOptions)
		if _, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Open with NamespaceWindows[%.10q] = %v: %v", tc.name, tc.w, err)
		}
	}
	for _, w := range []time.Duration{lease + 1, window} {
		o := engine.Options{Tiers: engine.MemoryOnly, Window: window, Partition: time.Minute, Lease: lease, Namespaces: map[string]engine.NamespaceOptions{"n": {Window: w}, "": {Window: w}}}
		if err := o.Validate(); err != nil {
			t.Errorf("NamespaceWindows %v: %v", w, err)
		}
	}
}

// TestExtendBadInput: durations outside (0, Window), nil and non-New
// claims are typed errors and leave the lease as it was.
func TestExtendBadInput(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Window: time.Hour, Partition: time.Minute, Lease: time.Minute})
			defer e.Close()
			c, err := e.Claim(ctx, []byte("k"))
			if err != nil {
				t.Fatal(err)
			}
			until := c.LeaseUntil
			for _, d := range []time.Duration{0, -1, math.MinInt64, time.Hour, time.Hour + 1, math.MaxInt64} {
				expectErr(t, fmt.Sprintf("Extend(%v)", d), e.Extend(ctx, &c, d), engine.ErrOptions)
			}
			if c.LeaseUntil != until {
				t.Errorf("refused Extends moved LeaseUntil")
			}
			expectErr(t, "Extend(nil)", e.Extend(ctx, nil, time.Minute), engine.ErrNotClaimed)
			dup := engine.Claim{Outcome: engine.Duplicate}
			expectErr(t, "Extend(duplicate)", e.Extend(ctx, &dup, time.Minute), engine.ErrNotClaimed)
			forged := engine.Claim{Outcome: engine.New, Key: []byte("k")}
			if p := noPanic(func() { err = e.Extend(ctx, &forged, time.Minute) }); p != nil {
				t.Errorf("Extend of a zero claim marked New panicked: %v", p)
			} else {
				expectErr(t, "Extend of a forged claim", err, engine.ErrLeaseLost)
			}
			if p := noPanic(func() { err = e.Commit(ctx, forged) }); p != nil {
				t.Errorf("Commit of a forged claim panicked: %v", p)
			} else {
				expectErr(t, "Commit of a forged claim", err, engine.ErrLeaseLost)
			}
			if err := e.Extend(ctx, &c, 30*time.Minute); err != nil {
				t.Errorf("a valid Extend after the refused ones: %v", err)
			}
		})
	}
}

// TestKeysAndBatches: nil, empty and oversized keys and mismatched
// batch lengths are typed errors for every call, and nothing is written.
func TestKeysAndBatches(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{MaxKeySize: 8, Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			long := []byte("123456789")
			for _, bad := range []struct {
				key  []byte
				want error
			}{{nil, engine.ErrEmptyKey}, {[]byte{}, engine.ErrEmptyKey}, {long, engine.ErrKeyTooLong}} {
				_, err := e.Claim(ctx, bad.key)
				expectErr(t, "Claim", err, bad.want)
				_, err = e.MarkIfAbsent(ctx, bad.key)
				expectErr(t, "MarkIfAbsent", err, bad.want)
				_, err = e.Lookup(ctx, bad.key)
				expectErr(t, "Lookup", err, bad.want)
				_, err = e.Forget(ctx, bad.key)
				expectErr(t, "Forget", err, bad.want)
				ran := false
				_, err = e.Do(ctx, bad.key, func(context.Context) error { ran = true; return nil })
				expectErr(t, "Do", err, bad.want)
				if ran {
					t.Errorf("Do ran its handler for a bad key")
				}
				out := make([]engine.Claim, 2)
				err = e.ClaimBatch(ctx, [][]byte{[]byte("ok1"), bad.key}, nil, out)
				var ke *engine.KeyError
				if !errors.As(err, &ke) || ke.Index != 1 || !errors.Is(err, bad.want) {
					t.Errorf("ClaimBatch with a bad key at 1: %v", err)
				}
				err = e.MarkBatch(ctx, [][]byte{[]byte("ok2"), bad.key}, nil, make([]engine.Outcome, 2))
				expectErr(t, "MarkBatch", err, bad.want)
			}
			two := bs("ok3", "ok4")
			expectErr(t, "ClaimBatch out", e.ClaimBatch(ctx, two, nil, make([]engine.Claim, 1)), engine.ErrBatch)
			expectErr(t, "ClaimBatch digests", e.ClaimBatch(ctx, two, make([]engine.Digest, 1), make([]engine.Claim, 2)), engine.ErrBatch)
			expectErr(t, "MarkBatch out", e.MarkBatch(ctx, two, nil, make([]engine.Outcome, 3)), engine.ErrBatch)
			expectErr(t, "MarkBatch digests", e.MarkBatch(ctx, two, make([]engine.Digest, 3), make([]engine.Outcome, 2)), engine.ErrBatch)
			expectErr(t, "LookupBatch", e.LookupBatch(ctx, two, make([]engine.KeyInfo, 1)), engine.ErrBatch)
			expectErr(t, "ForgetBatch", e.ForgetBatch(ctx, two, make([]engine.KeyInfo, 3)), engine.ErrBatch)
			c, _ := e.Claim(ctx, []byte("ok5"))
			expectErr(t, "CommitBatch errs", e.CommitBatch(ctx, []engine.Claim{c}, make([]error, 2)), engine.ErrBatch)
			expectErr(t, "ReleaseBatch errs", e.ReleaseBatch(ctx, []engine.Claim{c}, make([]error, 2)), engine.ErrBatch)
			infos := make([]engine.KeyInfo, 6)
			if err := e.LookupBatch(ctx, bs("ok1", "ok2", "ok3", "ok4", "ok5", "12345678"), infos); err != nil {
				t.Fatal(err)
			}
			for i, want := range []engine.Outcome{engine.New, engine.New, engine.New, engine.New, engine.InFlight, engine.New} {
				if infos[i].Outcome != want {
					t.Errorf("key %d after refused calls: %v, want %v", i, infos[i].Outcome, want)
				}
			}
		})
	}
}

// TestNilContext: a nil context is refused or treated as Background,
// never a panic, by every call.
func TestNilContext(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			c, _ := e.Claim(ctx, []byte("held"))
			tok, _ := e.IssueToken(ctx, time.Minute)
			var nilctx context.Context
			calls := map[string]func(){
				"Claim":        func() { _, _ = e.Claim(nilctx, []byte("a")) },
				"MarkIfAbsent": func() { _, _ = e.MarkIfAbsent(nilctx, []byte("b")) },
				"Lookup":       func() { _, _ = e.Lookup(nilctx, []byte("c")) },
				"Forget":       func() { _, _ = e.Forget(nilctx, []byte("d")) },
				"Advance":      func() { _, _ = e.Advance(nilctx, []byte("e"), 1) },
				"IssueToken":   func() { _, _ = e.IssueToken(nilctx, time.Minute) },
				"ConsumeToken": func() { _ = e.ConsumeToken(nilctx, tok) },
				"Extend":       func() { _ = e.Extend(nilctx, &c, time.Minute) },
				"Commit":       func() { _ = e.Commit(nilctx, c) },
				"Release":      func() { _ = e.Release(nilctx, c) },
				"Do":           func() { _, _ = e.Do(nilctx, []byte("f"), func(context.Context) error { return nil }) },
				"CommitAsync":  func() { e.CommitAsync(nilctx, c, nil) },
				"Flush":        func() { _ = e.Flush(nilctx) },
			}
			for _, name := range []string{"Claim", "MarkIfAbsent", "Lookup", "Forget", "Advance", "IssueToken", "ConsumeToken", "Extend", "Do", "CommitAsync", "Flush", "Commit", "Release"} {
				if p := noPanic(calls[name]); p != nil {
					t.Errorf("%s(nil ctx) panicked: %v", name, p)
				}
			}
		})
	}
}

// TestExportDirs: Export to the engine's directory (by any spelling:
// relative, through a symlink, a parent, a child) is refused with a typed
// error; Import from or into bad directories (a regular file, missing,
// the export itself, an open engine's by any spelling, another layout) is
// refused and leaves the destination as it was.
func TestExportDirs(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "engine")
	o := engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000}
	e := open(t, o)
	defer func() { e.Close() }()
	if _, err := e.MarkIfAbsent(ctx, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	cwd, _ := os.Getwd()
	rel, err := filepath.Rel(cwd, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, dir + "/", dir + "/./", link, rel, root, filepath.Join(dir, "sub"), filepath.Join(link, "x"), ""} {
		if _, err := e.Export(ctx, d, 1); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Export(%q) (the engine's directory): %v, want ErrOptions", d, err)
		}
	}
	file := filepath.Join(root, "plain.txt")
	if err := os.WriteFile(file, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A good export, then bad imports.
	exp := filepath.Join(root, "exp")
	if _, err := e.Export(ctx, exp, 5); err != nil {
		t.Fatal(err)
	}
	imp := filepath.Join(root, "imp")
	for _, tc := range []struct {
		src  string
		o    *engine.Options
		want error
	}{
		{filepath.Join(root, "missing"), &engine.Options{Backend: embedded.Dir(imp)}, engine.ErrNoExport},
		{exp, nil, engine.ErrOptions},
		{exp, &engine.Options{Backend: embedded.Dir(file)}, engine.ErrOptions},
		{exp, &engine.Options{Backend: embedded.Dir(exp)}, engine.ErrOptions},
		{exp, &engine.Options{Backend: embedded.Dir(filepath.Join(exp, "in"))}, engine.ErrOptions},
		{"", &engine.Options{Backend: embedded.Dir(imp)}, engine.ErrOptions},
		{exp, &engine.Options{Backend: embedded.Dir(dir)}, engine.ErrLocked},
		{exp, &engine.Options{Backend: embedded.Dir(link)}, engine.ErrLocked},
		{exp, &engine.Options{Backend: embedded.Dir(rel)}, engine.ErrLocked},
		{exp, &engine.Options{Backend: embedded.Dir(imp), Window: 2 * engine.DefaultWindow}, engine.ErrLayout},
		{exp, &engine.Options{Backend: embedded.Dir(imp)}, engine.ErrStaleExport}, // newerThan 5 below
		{exp, &engine.Options{Tiers: engine.MemoryOnly}, engine.ErrOptions},
	} {
		newer := uint64(0)
		if tc.want == engine.ErrStaleExport {
			newer = 5
		}
		_, err := importExport(ctx, tc.src, tc.o, newer)
		if !errors.Is(err, tc.want) {
			t.Errorf("Import(%q, %+v): %v, want %v", tc.src, tc.o, err, tc.want)
		}
	}
	if b, rerr := os.ReadFile(file); rerr != nil || string(b) != "precious" {
		t.Errorf("the regular file after the refused imports: %q %v", b, rerr)
	}
	if _, err := os.Stat(imp); !os.IsNotExist(err) {
		t.Errorf("refused imports created the destination: %v", err)
	}
	if in, err := e.Lookup(ctx, []byte("kept")); err != nil || in.Outcome != engine.Duplicate {
		t.Errorf("the engine after the refused calls: %v %v", in.Outcome, err)
	}
	e.Close()
	e = open(t, o)
	if in, err := e.Lookup(ctx, []byte("kept")); err != nil || in.Outcome != engine.Duplicate {
		t.Errorf("the engine reopened after the refused calls: %v %v", in.Outcome, err)
	}
}

// TestExportRefusesCallersFiles: Export "replaces a previous
// export there"; a path that holds a regular file, or a directory of the
// caller's that holds no export, is not a previous export and must be
// refused (a typed error), not removed.
func TestExportRefusesCallersFiles(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	e := open(t, engine.Options{Backend: embedded.Dir(filepath.Join(root, "engine")), ExpectedKeys: 1000})
	defer e.Close()
	file := filepath.Join(root, "notes.txt")
	if err := os.WriteFile(file, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := e.Export(ctx, file, 1)
	if err == nil {
		t.Errorf("Export onto a regular file: nil error")
	}
	if b, rerr := os.ReadFile(file); rerr != nil || string(b) != "precious" {
		t.Errorf("Export onto a regular file (err %v) replaced it: %q %v", err, b, rerr)
	}
	mine := filepath.Join(root, "mine")
	if err := os.MkdirAll(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine, "thesis.tex"), []byte("years of work"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = e.Export(ctx, mine, 1)
	if b, rerr := os.ReadFile(filepath.Join(mine, "thesis.tex")); rerr != nil || string(b) != "years of work" {
		t.Errorf("Export into a directory that held no export (err %v) removed its files: %v", err, rerr)
	}
}

// TestImportFromRegularFile: "No export there is ErrNoExport"; a
// regular file where the export should be is no export (not a storage
// failure of the engine).
func TestImportFromRegularFile(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "plain.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := importExport(context.Background(), file, &engine.Options{Backend: embedded.Dir(filepath.Join(root, "imp"))}, 0)
	expectErr(t, "Import from a regular file", err, engine.ErrNoExport)
	_, err = embedded.ReadExport(nil, file)
	expectErr(t, "ReadExport of a regular file", err, engine.ErrNoExport)
}
