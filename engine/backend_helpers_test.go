package engine_test

import (
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

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

var importExport = enginetest.ImportExport

var setDir = enginetest.SetDir

var setFS = enginetest.SetFS
var backendOf = enginetest.BackendOf
