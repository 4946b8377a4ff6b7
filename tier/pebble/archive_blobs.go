package pebble

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
)

// checkBlobName refuses names that are not plain file names.
func checkBlobName(name string) error {
	if name == "" || len(name) > 128 || strings.HasSuffix(name, blobTmpSuffix) {
		return fmt.Errorf("%w: blob name %q", tier.ErrOptions, name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fmt.Errorf("%w: blob name %q", tier.ErrOptions, name)
		}
	}
	return nil
}

// PutBlob writes the blob beside its place, syncs it, and renames it
// into place, syncing the directory.
func (ar *archive) PutBlob(_ context.Context, name string, write func(io.Writer) error) error {
	if err := ar.usable(); err != nil {
		return err
	}
	if err := checkBlobName(name); err != nil {
		return err
	}
	if err := ar.fs.MkdirAll(ar.blobs, 0o755); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	tmp := ar.fs.PathJoin(ar.blobs, name+blobTmpSuffix)
	f, err := ar.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	werr := write(f)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = ar.fs.Rename(tmp, ar.fs.PathJoin(ar.blobs, name))
	}
	if werr == nil {
		werr = syncDir(ar.fs, ar.blobs)
	}
	if werr != nil {
		_ = ar.fs.Remove(tmp)
		return fmt.Errorf("%w: blob %s: %w", tier.ErrStorage, name, werr)
	}
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type blobFile struct {
	vfs.File
	size int64
}

func (b blobFile) Size() int64 { return b.size }

// Blob opens the named blob.
func (ar *archive) Blob(_ context.Context, name string) (tier.ReadBlob, bool, error) {
	if err := ar.usable(); err != nil {
		return nil, false, err
	}
	if err := checkBlobName(name); err != nil {
		return nil, false, err
	}
	f, err := ar.fs.Open(ar.fs.PathJoin(ar.blobs, name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, false, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return blobFile{File: f, size: st.Size()}, true, nil
}

// Blobs lists the blobs, leaving out any a crash left half written.
func (ar *archive) Blobs(context.Context) ([]string, error) {
	if err := ar.usable(); err != nil {
		return nil, err
	}
	names, err := ar.fs.List(ar.blobs)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	out := names[:0]
	for _, n := range names {
		if checkBlobName(n) == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DeleteBlob removes a blob.
func (ar *archive) DeleteBlob(_ context.Context, name string) error {
	if err := ar.usable(); err != nil {
		return err
	}
	if err := checkBlobName(name); err != nil {
		return err
	}
	if err := ar.fs.Remove(ar.fs.PathJoin(ar.blobs, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// removeSuffixed removes the files of dir whose name ends with suffix.
func removeSuffixed(fs vfs.FS, dir, suffix string) error {
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			if err := fs.Remove(fs.PathJoin(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}
