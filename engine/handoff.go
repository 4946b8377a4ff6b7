package engine

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier/embedded"
)

// ExportInfo describes an export (embedded.ExportInfo).
type ExportInfo = embedded.ExportInfo

// Export writes a consistent copy of the engine's state into dir (Default
// only), replacing a previous export there (a path that is a file, or a
// directory holding anything but an export, is refused with ErrOptions:
// nothing of the caller's is replaced), with version, the caller's
// version of the state. It first waits for every commit enqueued before it
// (Flush); commits made during the export may or may not be in it. The
// copy is written beside dir and renamed into place once every file and the
// manifest are synced, so dir always holds a whole export. Hard links are
// used where dir is on the store's file system. Claims and commits proceed
// meanwhile. What makes an export invalid, and who checks, is in package
// embedded.
func (e *Engine) Export(ctx context.Context, dir string, version uint64) (ExportInfo, error) {
	if err := e.need(e.local != nil && e.exact != nil, "Export", "the embedded store"); err != nil {
		return ExportInfo{}, err
	}
	dir, err := e.local.ExportTarget(dir)
	if err != nil {
		return ExportInfo{}, err
	}
	if err := e.Flush(ctx); err != nil {
		return ExportInfo{}, err
	}
	var info ExportInfo
	err = e.unlessClosed(func() (err error) {
		info, err = e.local.Export(ctx, dir, version)
		return err
	})
	return info, err
}

// ReadExport returns the description of the export in dir (fsys nil means
// the operating system's), checking its manifest but not its files (Import
// checks those). No export there is ErrNoExport; a damaged manifest
// ErrExport.
func ReadExport(fsys vfs.FS, dir string) (ExportInfo, error) {
	return embedded.ReadExport(fsys, dir)
}

// Import replaces the engine directory o.Dir (on o.FS; no engine may hold
// it open) with the export in src, if the export's Version is greater than
// newerThan, the caller's version of the state in o.Dir (0 when it holds
// none). o are the Options the directory will be opened with: an export
// of another layout (Window, Partition) is refused (ErrLayout) rather than
// left for Open to refuse. Every file is copied and checked against the
// manifest's size and SHA-256 before o.Dir is touched: a damaged or
// incomplete export is ErrExport, one not newer ErrStaleExport, a
// directory held by an engine ErrLocked (in this process too, under any
// spelling of its path), and each leaves o.Dir as it was. Open o.Dir
// afterwards, as after a crash.
func Import(ctx context.Context, src string, o *Options, newerThan uint64) (ExportInfo, error) {
	if o == nil || o.Tiers != Default || o.Backend != nil {
		return ExportInfo{}, fmt.Errorf("%w: Import needs the Options of an embedded engine (Tiers: Default, no Backend)", ErrOptions)
	}
	if err := o.Validate(); err != nil {
		return ExportInfo{}, err
	}
	d := o.WithDefaults()
	return embedded.Import(ctx, src, &embedded.Options{Dir: d.Dir, FS: d.FS, Window: d.Window, Partition: d.Partition}, newerThan)
}

// Compact flushes and compacts the embedded store now (Default only), so
// that dropped partitions leave the disk and its size reflects compacted
// data; for maintenance windows and capacity measurements. It can take
// minutes on a large store; calls proceed meanwhile.
func (e *Engine) Compact(ctx context.Context) error {
	if err := e.need(e.local != nil && e.exact != nil, "Compact", "the embedded store"); err != nil {
		return err
	}
	return e.unlessClosed(func() error { return e.local.Compact(ctx) })
}
