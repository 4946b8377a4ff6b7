package embedded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/tierdedup/tierdedup/tier"
)

// ReadExport returns the description of the export in dir (fsys nil means
// the operating system's), checking its manifest but not its files (Import
// checks those). No export there is ErrNoExport; a damaged manifest
// ErrExport.
func ReadExport(fsys vfs.FS, dir string) (ExportInfo, error) {
	if fsys == nil {
		fsys = vfs.Default
	}
	m, _, err := readExport(fsys, dir)
	if err != nil {
		return ExportInfo{}, err
	}
	return m.info(), nil
}

// readExport reads the manifest of the export in dir or, when an Export
// was interrupted between its renames, of the previous export beside it,
// and returns the directory it read.
func readExport(fs vfs.FS, dir string) (*exportManifest, string, error) {
	m, err := readManifest(fs, dir)
	if errors.Is(err, ErrNoExport) {
		if old, oerr := readManifest(fs, dir+exportOldSuffix); oerr == nil {
			return old, dir + exportOldSuffix, nil
		}
	}
	return m, dir, err
}

// Import replaces the store directory o.Dir (on o.FS; no store may hold
// it open) with the export in src, if the export's Version is greater than
// newerThan, the caller's version of the state in o.Dir (0 when it holds
// none). o are the Options the directory will be opened with: an export
// of another layout (Window, Partition) is refused (tier.ErrLayout) rather
// than left for Open to refuse. Every file is copied and checked against
// the manifest's size and SHA-256 before o.Dir is touched: a damaged or
// incomplete export is ErrExport, one not newer ErrStaleExport, a
// directory held by a store tier.ErrLocked (in this process too, under
// any spelling of its path), and each leaves o.Dir as it was. Open o.Dir
// afterwards, as after a crash.
func Import(ctx context.Context, src string, o *Options, newerThan uint64) (ExportInfo, error) {
	if o == nil || o.Dir == "" || o.BloomOnly {
		return ExportInfo{}, fmt.Errorf("%w: Import needs the Options of an embedded store, with its Dir", tier.ErrOptions)
	}
	if src == "" {
		return ExportInfo{}, fmt.Errorf("%w: Import from an empty path", tier.ErrOptions)
	}
	opts := *o
	fsys := opts.FS
	if fsys == nil {
		fsys = vfs.Default
	}
	dst := canonical(fsys, opts.Dir)
	if overlap(fsys, src, dst) {
		return ExportInfo{}, fmt.Errorf("%w: Import from %s into %s: one holds the other", tier.ErrOptions, src, dst)
	}
	if st, err := fsys.Stat(dst); err == nil && !st.IsDir() {
		return ExportInfo{}, fmt.Errorf("%w: Import into %s, which is not a directory", tier.ErrOptions, dst)
	}
	if heldOpen(fsys, dst) {
		return ExportInfo{}, fmt.Errorf("%w: %s is open in this process", tier.ErrLocked, dst)
	}
	if err := finishImport(fsys, dst); err != nil {
		return ExportInfo{}, err
	}
	m, src, err := readExport(fsys, src)
	if err != nil {
		return ExportInfo{}, err
	}
	if m.Window != int64(opts.Window) {
		return ExportInfo{}, fmt.Errorf("%w (export %s)", layoutError("Window", time.Duration(m.Window).String(), opts.Window.String()), src)
	}
	if m.Partition != int64(opts.Partition) {
		return ExportInfo{}, fmt.Errorf("%w (export %s)", layoutError("Partition", time.Duration(m.Partition).String(), opts.Partition.String()), src)
	}
	if m.Version <= newerThan {
		return ExportInfo{}, fmt.Errorf("%w: export version %d, destination's %d", ErrStaleExport, m.Version, newerThan)
	}
	if _, err := fsys.Stat(dst); err == nil {
		l, err := fsys.Lock(fsys.PathJoin(dst, pebbleLock))
		if err != nil {
			return ExportInfo{}, fmt.Errorf("%w: %s: %w", tier.ErrLocked, dst, err)
		}
		defer l.Close()
	}
	tmp := dst + importTmpSuffix
	if err := fsys.RemoveAll(tmp); err != nil {
		return ExportInfo{}, fmt.Errorf("%w: import: %w", tier.ErrStorage, err)
	}
	done := false
	defer func() {
		if !done {
			_ = fsys.RemoveAll(tmp)
		}
	}()
	for _, sub := range exportSubdirs {
		if err := fsys.MkdirAll(fsys.PathJoin(tmp, sub), 0o755); err != nil {
			return ExportInfo{}, fmt.Errorf("%w: import: %w", tier.ErrStorage, err)
		}
	}
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return ExportInfo{}, err
		}
		sum, size, err := copyFile(fsys, fsys.PathJoin(src, f.Name), fsys.PathJoin(tmp, f.Name))
		switch {
		case fileMissing(err):
			return ExportInfo{}, fmt.Errorf("%w: %s: %s missing", ErrExport, src, f.Name)
		case err != nil:
			return ExportInfo{}, fmt.Errorf("%w: import: %w", tier.ErrStorage, err)
		case size != f.Size || sum != f.SHA256:
			return ExportInfo{}, fmt.Errorf("%w: %s: %s has %d bytes and SHA-256 %s, manifest says %d and %s",
				ErrExport, src, f.Name, size, sum, f.Size, f.SHA256)
		}
	}
	// Every directory of the copy, its top level too: the renames that
	// follow make it the destination, and a crash must find its files.
	for _, sub := range exportSubdirs {
		if err := syncDir(fsys, fsys.PathJoin(tmp, sub)); err != nil {
			return ExportInfo{}, fmt.Errorf("%w: import: %w", tier.ErrStorage, err)
		}
	}
	if err := replaceDir(fsys, tmp, dst, importOldSuffix); err != nil {
		return ExportInfo{}, fmt.Errorf("%w: import: %w", tier.ErrStorage, err)
	}
	done = true
	return m.info(), nil
}

// finishImport completes or undoes an Import of dst that a crash
// interrupted: the replaced directory is removed once dst is in place, or
// put back when the crash came between the two renames; a partial copy is
// removed.
func finishImport(fs vfs.FS, dst string) error {
	old := dst + importOldSuffix
	if _, err := fs.Stat(old); err == nil {
		if _, err := fs.Stat(dst); fileMissing(err) {
			if err := fs.Rename(old, dst); err != nil {
				return fmt.Errorf("%w: undo interrupted import: %w", tier.ErrStorage, err)
			}
			if err := syncDir(fs, fs.PathDir(dst)); err != nil {
				return fmt.Errorf("%w: undo interrupted import: %w", tier.ErrStorage, err)
			}
		} else if err := fs.RemoveAll(old); err != nil {
			return fmt.Errorf("%w: finish interrupted import: %w", tier.ErrStorage, err)
		}
	}
	if err := fs.RemoveAll(dst + importTmpSuffix); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

func replaceDir(fs vfs.FS, tmp, dst, oldSuffix string) error {
	old := dst + oldSuffix
	if err := fs.RemoveAll(old); err != nil {
		return err
	}
	if _, err := fs.Stat(dst); err == nil {
		if err := fs.Rename(dst, old); err != nil {
			return err
		}
	}
	if err := fs.Rename(tmp, dst); err != nil {
		return err
	}
	if err := syncDir(fs, fs.PathDir(dst)); err != nil {
		return err
	}
	return fs.RemoveAll(old)
}
