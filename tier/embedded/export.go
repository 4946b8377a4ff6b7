package embedded

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// An export is a directory holding a consistent copy of an engine's whole
// state (its Pebble store: marks, attempt counts and the caller's records,
// and its sealed Bloom partitions) and a manifest that names every file
// with its size and SHA-256, the caller's version of the state, and a
// checksum of the manifest itself. It is what lets the state of a consumer
// follow the work it describes to another process or machine: one engine
// per unit of work (a Kafka partition), exported by its last owner,
// imported by the next.
//
// What makes an export invalid, and who checks:
//   - a file missing, of another size or content than the manifest says, or
//     a damaged manifest: Import refuses it (ErrExport) and writes nothing
//     into the destination;
//   - an export not newer than the state it would replace (the caller's
//     versions): Import refuses it (ErrStaleExport);
//   - an Export or Import a crash interrupted: its temporary directory is
//     removed by the next Export or Import; an Import interrupted between
//     its two renames is completed or undone by the next Import or Open of
//     the destination, which never finds the destination missing.
//
// The imported store opens as after a crash: its sealed partitions load
// where their seals in the store name them, its open partitions restore
// from the checkpoint the store records and the journal after it, the rest
// is rebuilt from the store, and until then claims read the store.
const (
	exportManifestName = "tierdedup-export.json"
	exportFormat       = 1
	exportTmpSuffix    = ".export-tmp"
	exportOldSuffix    = ".export-old"
	importTmpSuffix    = ".import-tmp"
	importOldSuffix    = ".import-old"
	// pebbleLock is the lock file Pebble takes inside its directory.
	pebbleLock = "LOCK"
)

// exportSubdirs are the directories an export holds files in: its top
// level (the hot Pebble database), the sealed partitions' filters and the
// cold Pebble database.
var exportSubdirs = []string{"", sealedSubdir, pebble.ColdSubdir}

// ExportInfo describes an export (tier.ExportInfo).
type ExportInfo = tier.ExportInfo

type exportManifest struct {
	Format  int    `json:"format"`
	Version uint64 `json:"version"`
	Created int64  `json:"created_unix_nano"`
	// Window and Partition are the exporter's layout (nanoseconds): an
	// engine opened with another would refuse the copy (tier.ErrLayout), so
	// Import refuses it first.
	Window    int64        `json:"window_ns"`
	Partition int64        `json:"partition_ns"`
	Files     []exportFile `json:"files"`
}

type exportFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// exportEnvelope is the manifest file: the manifest and the SHA-256 of its
// JSON encoding.
type exportEnvelope struct {
	Manifest json.RawMessage `json:"manifest"`
	SHA256   string          `json:"sha256"`
}

func (m *exportManifest) info() ExportInfo {
	info := ExportInfo{Version: m.Version, Created: time.Unix(0, m.Created), Files: len(m.Files)}
	for _, f := range m.Files {
		info.Bytes += f.Size
	}
	return info
}

// ExportTarget checks that dir may receive an export of this store (a
// path that is a file, or a directory holding anything but an export, or
// one that is, holds or lies in the store's directory, is refused with
// tier.ErrOptions: nothing of the caller's is replaced) and returns its
// canonical spelling, for Export.
func (s *Store) ExportTarget(dir string) (string, error) {
	if s.store == nil {
		return "", fmt.Errorf("%w: Export needs the embedded store, not bloom-only state", tier.ErrOptions)
	}
	if dir == "" {
		return "", fmt.Errorf("%w: Export to an empty path", tier.ErrOptions)
	}
	dir = canonical(s.snapshots.fs, dir)
	for _, d := range []string{dir, dir + exportTmpSuffix, dir + exportOldSuffix} {
		if overlap(s.snapshots.fs, d, s.snapshots.dir) {
			return "", fmt.Errorf("%w: Export to %s, which is, holds or lies in the engine's directory %s", tier.ErrOptions, d, s.snapshots.dir)
		}
	}
	if err := exportTarget(s.snapshots.fs, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// Export writes a consistent copy of the store's state into dir (checked
// by ExportTarget), replacing a previous export there, with version, the
// caller's version of the state. Writes made during the export may or may
// not be in it. The copy is written beside dir and renamed into place once
// every file and the manifest are synced, so dir always holds a whole
// export. Hard links are used where dir is on the store's file system.
func (s *Store) Export(ctx context.Context, dir string, version uint64) (info ExportInfo, err error) {
	fs := s.snapshots.fs
	tmp := dir + exportTmpSuffix
	if err := fs.RemoveAll(tmp); err != nil {
		return info, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	defer func() {
		if err != nil {
			_ = fs.RemoveAll(tmp)
		}
	}()
	if err := fs.MkdirAll(fs.PathDir(dir), 0o755); err != nil {
		return info, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	if err := s.store.Checkpoint(tmp); err != nil {
		return info, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	if err := s.copySealed(ctx, fs.PathJoin(tmp, sealedSubdir)); err != nil {
		return info, err
	}
	m, err := manifestOf(ctx, fs, tmp)
	if err != nil {
		return info, err
	}
	m.Version, m.Created = version, time.Now().UnixNano()
	m.Window, m.Partition = int64(s.window), s.parts.Length
	if err := writeManifest(fs, tmp, m); err != nil {
		return info, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	if err := replaceDir(fs, tmp, dir, exportOldSuffix); err != nil {
		return info, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	return m.info(), nil
}

// copySealed copies the sealed partitions' files and the checkpoint's
// files into dir, after the copy of the store was taken. A file the sealer
// or the checkpointer removes meanwhile is left out, and one written after
// the copy of the store is not named by it: either way its partition is
// rebuilt from the store when the export is opened, as is one whose seal
// or checkpoint record the copy of the store lacks. A checkpoint's files
// are never newer than the record that names them (they are written
// first), and the journal after that record is in the copy of the store,
// so the open partitions restore without a scan.
func (s *Store) copySealed(ctx context.Context, dir string) error {
	fs := s.sealedDir.fs
	names, err := fs.List(s.sealedDir.dir)
	if err != nil {
		return nil // no sealed partition yet
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	for _, n := range names {
		if !strings.HasSuffix(n, sealedSuffix) && !strings.HasSuffix(n, checkpointSuffix) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		_, _, err := copyFile(fs, fs.PathJoin(s.sealedDir.dir, n), fs.PathJoin(dir, n))
		if err != nil && !fileMissing(err) {
			return fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
		}
	}
	return syncDir(fs, dir)
}

// manifestOf lists and checksums every file of the export in dir (its top
// level and the sealed partitions' directory), syncing each.
func manifestOf(ctx context.Context, fs vfs.FS, dir string) (*exportManifest, error) {
	m := &exportManifest{Format: exportFormat}
	for _, sub := range exportSubdirs {
		names, err := fs.List(fs.PathJoin(dir, sub))
		if err != nil {
			if sub != "" && fileMissing(err) {
				continue
			}
			return nil, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
		}
		for _, n := range names {
			name := path.Join(sub, n)
			p := fs.PathJoin(dir, name)
			st, err := fs.Stat(p)
			if err != nil {
				return nil, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
			}
			if st.IsDir() || n == pebbleLock {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			sum, size, err := hashFile(fs, p)
			if err != nil {
				return nil, fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
			}
			m.Files = append(m.Files, exportFile{Name: name, Size: size, SHA256: sum})
		}
	}
	return m, nil
}

func writeManifest(fs vfs.FS, dir string, m *exportManifest) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	env, err := json.Marshal(exportEnvelope{Manifest: body, SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return err
	}
	f, err := fs.Create(fs.PathJoin(dir, exportManifestName), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(env); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, sub := range exportSubdirs[1:] {
		if err := syncDir(fs, fs.PathJoin(dir, sub)); err != nil && !fileMissing(err) {
			return err
		}
	}
	return syncDir(fs, dir)
}

// maxManifest bounds the manifest file read: a store has a few hundred files.
const maxManifest = 16 << 20

// readManifest reads and checks the manifest of the export in dir. A
// missing export is ErrNoExport; a damaged one ErrExport.
func readManifest(fs vfs.FS, dir string) (*exportManifest, error) {
	f, err := fs.Open(fs.PathJoin(dir, exportManifestName))
	if err != nil {
		if fileMissing(err) || errors.Is(err, syscall.ENOTDIR) { // nothing there, or a file
			return nil, fmt.Errorf("%w: %s", ErrNoExport, dir)
		}
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	bad := func(why string) error { return fmt.Errorf("%w: %s: manifest %s", ErrExport, dir, why) }
	if len(raw) > maxManifest {
		return nil, bad("too large")
	}
	var env exportEnvelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, bad("unreadable")
	}
	sum := sha256.Sum256(env.Manifest)
	if env.SHA256 != hex.EncodeToString(sum[:]) {
		return nil, bad("checksum mismatch")
	}
	var m exportManifest
	dec := json.NewDecoder(bytes.NewReader(env.Manifest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, bad("unreadable")
	}
	if m.Format != exportFormat {
		return nil, bad(fmt.Sprintf("format %d, want %d", m.Format, exportFormat))
	}
	for _, f := range m.Files {
		if !validExportName(f.Name) || f.Size < 0 || len(f.SHA256) != 2*sha256.Size {
			return nil, bad(fmt.Sprintf("file entry %q", f.Name))
		}
	}
	return &m, nil
}

// validExportName accepts the names an export holds: a file at its top
// level or in one of its subdirectories, nothing that leaves it.
func validExportName(name string) bool {
	dir, file := path.Split(name)
	return file != "" && file != "." && file != ".." && !strings.ContainsAny(file, `/\`) &&
		slices.Contains(exportSubdirs, strings.TrimSuffix(dir, "/")) && file != pebbleLock
}

// replaceDir puts the synced directory tmp in dst's place: dst (if any)
// moves to dst+oldSuffix, tmp to dst, the parent is synced and the old
// directory removed.
// exportTarget refuses an Export to dir unless replacing it loses nothing
// of the caller's: dir must not exist, be empty, or hold an export (its
// manifest, damaged or not).
func exportTarget(fs vfs.FS, dir string) error {
	st, err := fs.Stat(dir)
	switch {
	case fileMissing(err):
		return nil
	case err != nil:
		return fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	case !st.IsDir():
		return fmt.Errorf("%w: Export to %s, a file", tier.ErrOptions, dir)
	}
	names, err := fs.List(dir)
	if err != nil {
		return fmt.Errorf("%w: export: %w", tier.ErrStorage, err)
	}
	if len(names) == 0 || slices.Contains(names, exportManifestName) {
		return nil
	}
	return fmt.Errorf("%w: Export to %s, which holds files and no export: it would replace them", tier.ErrOptions, dir)
}

// hashFile returns the hex SHA-256 and size of the file at p, synced.
func hashFile(fs vfs.FS, p string) (string, int64, error) {
	f, err := fs.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	if err := f.Sync(); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// copyFile copies src to dst (created), synced, and returns the hex
// SHA-256 and size of what it copied.
func copyFile(fs vfs.FS, src, dst string) (string, int64, error) {
	in, err := fs.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	out, err := fs.Create(dst, vfs.WriteCategoryUnspecified)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	// The hash sees each buffer before the file does: a writer may change
	// what it was given (Pebble's in-memory file system does, on purpose,
	// when built with its invariants, as under -race).
	n, err := io.Copy(io.MultiWriter(h, out), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// fileMissing reports a file or directory that does not exist.
func fileMissing(err error) bool { return errors.Is(err, os.ErrNotExist) }
