package engine

import (
	"context"

	"github.com/tierdedup/tierdedup/tier"
)

// ExportInfo describes an export (tier.ExportInfo).
type ExportInfo = tier.ExportInfo

// Export writes a consistent copy of the engine's state into dir (a
// store that hands off its state: the embedded one), replacing a previous
// export there (a path that is a file, or a directory holding anything but
// an export, is refused with ErrOptions: nothing of the caller's is
// replaced), with version, the caller's version of the state. It first
// waits for every commit enqueued before it (Flush); commits made during
// the export may or may not be in it. The copy is written beside dir and
// renamed into place once every file and the manifest are synced, so dir
// always holds a whole export. Hard links are used where dir is on the
// store's file system. Claims and commits proceed meanwhile. The store's
// own package imports an export (embedded.Backend.Import) and says what
// makes one invalid, and who checks.
func (e *Engine) Export(ctx context.Context, dir string, version uint64) (ExportInfo, error) {
	if err := e.serve(NeedHandoff, "Export"); err != nil {
		return ExportInfo{}, err
	}
	dir, err := e.handoff.ExportTarget(dir)
	if err != nil {
		return ExportInfo{}, err
	}
	if err := e.Flush(ctx); err != nil {
		return ExportInfo{}, err
	}
	var info ExportInfo
	err = e.unlessClosed(func() (err error) {
		info, err = e.handoff.Export(ctx, dir, version)
		return err
	})
	return info, err
}

// Compact flushes and compacts the embedded store now, so that dropped
// partitions leave the disk and its size reflects compacted data; for
// maintenance windows and capacity measurements. It can take minutes on a
// large store; calls proceed meanwhile. When ctx ends first, Compact
// returns ctx's error at once and the compaction runs on; Close waits for
// it.
func (e *Engine) Compact(ctx context.Context) error {
	if err := e.serve(NeedHandoff, "Compact"); err != nil {
		return err
	}
	return e.unlessClosed(func() error { return e.handoff.Compact(ctx) })
}
