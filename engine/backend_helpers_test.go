package engine_test

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// backendOf returns a copy of the embedded store's Backend that o names
// (a zero one when it names none), for a test to change without touching
// the Options it was copied from.
func backendOf(o *engine.Options) embedded.Backend {
	if b, ok := o.Backend.(*embedded.Backend); ok && b != nil {
		return *b
	}
	return embedded.Backend{}
}

// setDir makes o's Backend the embedded store in dir, its other settings
// kept.
func setDir(o *engine.Options, dir string) {
	b := backendOf(o)
	b.Dir = dir
	o.Backend = &b
}

// setFS makes o's embedded store live on fs.
func setFS(o *engine.Options, fs vfs.FS) {
	b := backendOf(o)
	b.FS = fs
	o.Backend = &b
}

// setNoSync makes o's embedded store skip fsync; nothing when o names
// none (memory-only, a shared tier).
func setNoSync(o *engine.Options, on bool) {
	if _, ok := o.Backend.(*embedded.Backend); !ok {
		return
	}
	b := backendOf(o)
	b.NoSync = on
	o.Backend = &b
}

// dirOf and fsOf return o's embedded store's directory and filesystem.
func dirOf(o engine.Options) string { return backendOf(&o).Dir }
func fsOf(o engine.Options) vfs.FS  { return backendOf(&o).FS }

// importExport imports the export in src into the directory of o's
// embedded store (embedded.Backend.Import), with o's layout.
func importExport(ctx context.Context, src string, o *engine.Options, newerThan uint64) (engine.ExportInfo, error) {
	if o == nil {
		return engine.ExportInfo{}, fmt.Errorf("%w: Import needs the embedded store", engine.ErrOptions)
	}
	if _, ok := o.Backend.(*embedded.Backend); !ok || o.Tiers != engine.Default {
		return engine.ExportInfo{}, fmt.Errorf("%w: Import needs the embedded store", engine.ErrOptions)
	}
	if err := o.Validate(); err != nil {
		return engine.ExportInfo{}, err
	}
	b := backendOf(o)
	d := o.WithDefaults()
	return b.Import(ctx, src, d.Window, d.Partition, newerThan)
}
