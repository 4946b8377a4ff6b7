package pebble

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// FormatVersion is the version of the store's layout, of its values and
// of everything derived from its secret (the fingerprints the engine's
// Bloom filters are built from). A store written with a later version is
// refused; one of version 1 is upgraded at Open (see initLayout).
//
// Version 2 adds a committed value's time and result (value flags 2 and
// 4); its values are a superset of version 1's, which decode unchanged.
// Version 3 moves sealed partitions into the cold database (cold.go): a
// version 2 store is a version 3 store with nothing moved, and a binary of
// version 2, which would not read the cold database, refuses it.
const FormatVersion = 3

// ErrLayout reports a store whose recorded layout differs from the one
// requested; errors.As finds the *LayoutError naming the field.
var ErrLayout = errors.New("pebble: store layout mismatch")

// LayoutError names the field of a layout mismatch and both values.
type LayoutError struct {
	Field          string
	Stored, Wanted string
}

// Error names the field and both values.
func (e *LayoutError) Error() string {
	return fmt.Sprintf("%v: %s is %s in the store, %s requested", ErrLayout, e.Field, e.Stored, e.Wanted)
}

// Unwrap returns ErrLayout.
func (e *LayoutError) Unwrap() error { return ErrLayout }

// Layout is what a store records about itself when it is created, so a
// later Open cannot misread its records: the partition length fixes what a
// stored partition number means, the window how long keys are promised to
// stay, and the secret the fingerprints everything in memory is built from.
type Layout struct {
	// Partition is the retention partition length.
	Partition time.Duration
	// Window is the retention window. A later Open may lengthen it (every
	// key stays at least as long as promised); shortening it is refused.
	Window time.Duration
	// Secret keys the fingerprints of this store's keys; chosen at random
	// when the store is created.
	Secret [16]byte
	// ID names this store; chosen at random when it is created. A Bloom
	// snapshot is bound to it.
	ID [16]byte
	// version is the format version the layout was read with.
	version uint32
}

var (
	keyLayout   = []byte{spaceMeta, 'l', 'y'}
	keySnapshot = []byte{spaceMeta, 's', 'n'}
)

// Layout encoding: version u32 ‖ partition i64 ‖ window i64 ‖ secret [16] ‖
// id [16], little endian: 52 bytes.
const layoutLen = 4 + 8 + 8 + 16 + 16

func appendLayout(dst []byte, l Layout) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, FormatVersion)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(l.Partition))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(l.Window))
	dst = append(dst, l.Secret[:]...)
	return append(dst, l.ID[:]...)
}

func decodeLayout(b []byte) (Layout, error) {
	if len(b) < 4 {
		return Layout{}, fmt.Errorf("%w: layout of %d bytes", ErrCorrupt, len(b))
	}
	v := binary.LittleEndian.Uint32(b)
	if v < 1 || v > FormatVersion {
		return Layout{}, &LayoutError{Field: "format version", Stored: fmt.Sprint(v), Wanted: fmt.Sprint(FormatVersion)}
	}
	if len(b) != layoutLen {
		return Layout{}, fmt.Errorf("%w: layout of %d bytes", ErrCorrupt, len(b))
	}
	l := Layout{
		Partition: time.Duration(binary.LittleEndian.Uint64(b[4:])),
		Window:    time.Duration(binary.LittleEndian.Uint64(b[12:])),
		version:   v,
	}
	copy(l.Secret[:], b[20:36])
	copy(l.ID[:], b[36:52])
	return l, nil
}

// initLayout reads the stored layout, creates it for a new store, or
// refuses a mismatch. A store with records but no layout was written by a
// format before layouts were recorded, and is refused too: its partition
// length is unknown.
func (s *Store) initLayout(partition, window time.Duration, now int64) error {
	raw, closer, err := s.db.Get(keyLayout)
	if err == nil {
		defer closer.Close()
		l, err := decodeLayout(raw)
		if err != nil {
			return err
		}
		switch {
		case l.Partition != partition:
			return &LayoutError{Field: "Partition", Stored: l.Partition.String(), Wanted: partition.String()}
		case window < l.Window:
			return &LayoutError{Field: "Window", Stored: l.Window.String(), Wanted: window.String() + " (a window may grow, never shrink: keys were promised the stored one)"}
		case window > l.Window || l.version < FormatVersion:
			// A longer window keeps every promise; version 1's values read
			// unchanged as version 2's, and a version 2 store is one of
			// version 3 with nothing moved. Recorded by recordLayout once
			// Open has checked everything else (a refused Open changes
			// nothing) and before anything is written, so an older binary
			// then refuses the store at Open instead of failing on a value
			// it cannot read or missing the partitions moved out of its
			// sight.
			l.Window, l.version = window, FormatVersion
			s.layoutChanged = true
		}
		s.layout = l
		return nil
	}
	if !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if _, err := s.meta(keyCreated); err == nil {
		return &LayoutError{Field: "format version", Stored: "0 (no layout record)", Wanted: fmt.Sprint(FormatVersion)}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	// No layout: a new store only if it holds nothing at all. A store's
	// cold database (its ID record, markers, records) opened as a Dir is
	// refused, as is anything else that holds keys.
	if empty, err := isEmpty(s.db); err != nil {
		return err
	} else if !empty {
		stored := "keys without a layout record"
		if _, closer, err := s.db.Get(keyColdID); err == nil {
			closer.Close()
			stored = "another store's cold database (" + ColdSubdir + ")"
		}
		return &LayoutError{Field: "store", Stored: stored, Wanted: "a store or an empty directory"}
	}
	l := Layout{Partition: partition, Window: window, version: FormatVersion}
	_, _ = rand.Read(l.Secret[:]) // crypto/rand.Read never fails on supported platforms.
	_, _ = rand.Read(l.ID[:])
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(keyLayout, appendLayout(nil, l), nil)
	if now == 0 {
		now = time.Now().UnixNano()
	}
	_ = b.Set(keyCreated, binary.LittleEndian.AppendUint64(nil, uint64(now)), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	s.layout, s.fresh = l, true
	return nil
}

// recordLayout records, synced, the layout initLayout changed (a longer
// window, a newer format version); Open calls it once every check passed.
func (s *Store) recordLayout() error {
	if !s.layoutChanged {
		return nil
	}
	if err := s.db.Set(keyLayout, appendLayout(nil, s.layout), pebble.Sync); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	s.layoutChanged = false
	return nil
}

// Fresh reports whether this Open created the store: it holds no records.
func (s *Store) Fresh() bool { return s.fresh }

// Layout returns the store's recorded layout.
func (s *Store) Layout() Layout { return s.layout }

// SealSnapshot records a new random epoch, synced, and returns it. Call it
// after the last write of this Store, then save the Bloom snapshot with the
// store's ID and this epoch: only that pair will match at the next Open,
// and only once.
func (s *Store) SealSnapshot() (epoch uint64, err error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	defer s.guard(&err)
	var b [8]byte
	for epoch == 0 {
		_, _ = rand.Read(b[:])
		epoch = binary.LittleEndian.Uint64(b[:])
	}
	if err := s.set(keySnapshot, b[:]); err != nil {
		return 0, err
	}
	return epoch, nil
}

// TakeSnapshotEpoch returns the epoch of the last SealSnapshot (0 if none)
// and deletes it, synced, before anything else can be written: a snapshot
// can match the store only at the first Open after it was sealed, so a
// snapshot left on disk (rejected, or not removed) is never trusted later.
func (s *Store) TakeSnapshotEpoch() (epoch uint64, err error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	defer s.guard(&err)
	v, err := s.meta(keySnapshot)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Delete(keySnapshot, nil) // a batch's Delete fails only when it is committing
	if err := s.apply(b, pebble.Sync); err != nil {
		return 0, err
	}
	return uint64(v), nil
}
