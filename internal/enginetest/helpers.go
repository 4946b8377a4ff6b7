package enginetest

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// ClaimEach claims keys in batches of 256 through e and hands each key's
// claim to check.
func ClaimEach(t testing.TB, e *engine.Engine, keys [][]byte, check func(key []byte, c engine.Claim)) {
	t.Helper()
	for i := 0; i < len(keys); i += 256 {
		batch := keys[i:min(i+256, len(keys))]
		out := make([]engine.Claim, len(batch))
		if err := e.ClaimBatch(context.Background(), batch, nil, out); err != nil {
			t.Fatal(err)
		}
		for j, c := range out {
			check(batch[j], c)
		}
	}
}

// ImportExport imports the export in src into the directory of o's
// embedded store (embedded.Backend.Import), with o's layout.
func ImportExport(ctx context.Context, src string, o *engine.Options, newerThan uint64) (engine.ExportInfo, error) {
	if o == nil {
		return engine.ExportInfo{}, fmt.Errorf("%w: Import needs the embedded store", engine.ErrOptions)
	}
	if _, ok := o.Backend.(*embedded.Backend); !ok || o.Tiers != engine.Default {
		return engine.ExportInfo{}, fmt.Errorf("%w: Import needs the embedded store", engine.ErrOptions)
	}
	if err := o.Validate(); err != nil {
		return engine.ExportInfo{}, err
	}
	b := BackendOf(o)
	d := o.WithDefaults()
	return b.Import(ctx, src, d.Window, d.Partition, newerThan)
}

// ReadFile returns the bytes of name on fs, nil when it cannot be opened.
func ReadFile(t testing.TB, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// SetDir makes o's Backend the embedded store in dir, its other settings
// kept.
func SetDir(o *engine.Options, dir string) {
	b := BackendOf(o)
	b.Dir = dir
	o.Backend = &b
}

// SetFS makes o's embedded store live on fs.
func SetFS(o *engine.Options, fs vfs.FS) {
	b := BackendOf(o)
	b.FS = fs
	o.Backend = &b
}

// WaitFor polls cond for up to 10 s.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// WaitWarm waits up to 30 s for e's filters to be warm.
func WaitWarm(t testing.TB, e *engine.Engine) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); e.Stats().Bloom.Mode != "warm"; {
		if time.Now().After(deadline) {
			t.Fatalf("the filters did not become warm: still %q after 30 s", e.Stats().Bloom.Mode)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BackendOf returns a copy of the embedded store's Backend that o names
// (a zero one when it names none), for a test to change without touching
// the Options it was copied from.
func BackendOf(o *engine.Options) embedded.Backend {
	if b, ok := o.Backend.(*embedded.Backend); ok && b != nil {
		return *b
	}
	return embedded.Backend{}
}

// WriteFile writes b to name on fs, failing t if it cannot.
func WriteFile(t testing.TB, fs vfs.FS, name string, b []byte) {
	t.Helper()
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
}
