package kafkadedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// tp names a topic-partition.
type tp struct {
	topic string
	part  int32
}

// partition is one assigned partition's engine and where it resumes.
type partition struct {
	e *engine.Engine
	// next is the offset stored with the marks, -1 for none: written by
	// Process, read by assignment and Offset beside it.
	next atomic.Int64
	// stopped is the offset a batch stopped at (a handler error, a key in
	// flight, a failed commit), -1 for none: the partition's records are
	// ignored until a batch starts there again, so records the caller
	// already holds from beyond the stop are never committed past it.
	stopped atomic.Int64
	key     []byte
	// progress is when the partition last committed (or was opened), why
	// the cause of its stop, and reported when its stall was last logged:
	// used by Process's goroutine only.
	progress, reported time.Time
	why                string
}

// offsetKey is the record that holds a partition's next offset for group.
func offsetKey(group, topic string, part int32) []byte {
	return []byte(offsetPrefix + url.PathEscape(group) + "/" + topic + "/" + strconv.FormatInt(int64(part), 10))
}

const offsetPrefix = "kafkadedup/offset/"

// partDir is partition t's directory under root: root/<group>/<topic>.<partition>,
// the group escaped (a topic name has no separator).
func (m *Member) partDir(root string, t tp) string {
	return filepath.Join(root, url.PathEscape(m.o.Group), url.PathEscape(t.topic)+"."+strconv.FormatInt(int64(t.part), 10))
}

func (m *Member) dir(t tp) string       { return m.partDir(m.o.Dir, t) }
func (m *Member) exportDir(t tp) string { return m.partDir(m.o.Exports, t) }

// assign opens (importing first where an export is newer) the engine of
// every newly assigned partition and resumes each at its stored offset.
//
// An error (the session ended meanwhile, a directory or import that
// failed) closes what this call opened and ends the group session; the
// client joins again and the partitions are assigned anew.
func (m *Member) assign(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (_ map[string]map[int32]kgo.Offset, err error) {
	var opened []tp
	defer func() {
		if err == nil {
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, t := range opened {
			if p := m.parts[t]; p != nil {
				_ = p.e.Close()
				delete(m.parts, t)
			}
		}
	}()
	for topic, parts := range offsets {
		for part := range parts {
			t := tp{topic, part}
			m.mu.Lock()
			p := m.parts[t]
			m.mu.Unlock()
			if p == nil {
				// Assignment may run beside Process (kgo gates only
				// OnPartitionsAssigned): a partition still held keeps its
				// engine, which a batch may be using.
				var err error
				if p, err = m.open(ctx, t); err != nil {
					m.log.Printf("kafkadedup: assign %s/%d: %v", topic, part, err)
					return nil, fmt.Errorf("kafkadedup: assign %s/%d: %w", topic, part, err)
				}
				opened = append(opened, t)
				m.mu.Lock()
				m.parts[t] = p
				m.mu.Unlock()
			}
			m.stats.assigned.Add(1)
			next := p.next.Load()
			if next >= 0 {
				parts[part] = kgo.NewOffset().At(next).WithEpoch(-1)
			}
			m.log.Printf("kafkadedup: assigned %s/%d at offset %d", topic, part, next)
		}
	}
	return offsets, nil
}

// open opens partition t's engine, first importing the export of t if it
// is newer than the directory's state.
func (m *Member) open(ctx context.Context, t tp) (*partition, error) {
	p, err := m.openDir(ctx, t)
	if err != nil || m.o.Exports == "" {
		return p, err
	}
	info, err := embedded.ReadExport(nil, m.exportDir(t))
	switch {
	case errors.Is(err, engine.ErrNoExport):
		return p, nil
	case err != nil:
		// A damaged export is not trusted: the directory's own state is.
		m.log.Printf("kafkadedup: %s/%d: export not used: %v", t.topic, t.part, err)
		return p, nil
	case int64(info.Version) <= p.next.Load():
		return p, nil
	}
	if err := p.e.Close(); err != nil {
		return nil, err
	}
	o := inDir(m.o.Engine, m.dir(t)).WithDefaults()
	_, err = o.Backend.(*embedded.Backend).Import(ctx, m.exportDir(t), o.Window, o.Partition, uint64(max(p.next.Load(), 0)))
	switch {
	case errors.Is(err, engine.ErrExport), errors.Is(err, engine.ErrStaleExport), errors.Is(err, engine.ErrLayout):
		// Refused on its merits: the directory's own state stands.
		m.log.Printf("kafkadedup: %s/%d: import refused, keeping the directory's state: %v", t.topic, t.part, err)
	case err != nil:
		// Not done (canceled, a failing disk): the partition is not
		// taken with a state older than the export.
		return nil, err
	default:
		m.stats.imports.Add(1)
		m.log.Printf("kafkadedup: %s/%d: imported state at offset %d (directory had %d)", t.topic, t.part, info.Version, p.next.Load())
	}
	return m.openDir(ctx, t)
}

// openDir opens partition t's directory, waiting while another engine
// holds it, and reads its stored offset.
func (m *Member) openDir(ctx context.Context, t tp) (*partition, error) {
	o := inDir(m.o.Engine, m.dir(t))
	if err := os.MkdirAll(filepath.Dir(m.dir(t)), 0o755); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(m.o.OpenWait)
	for {
		e, err := engine.Open(&o)
		if err == nil {
			p := &partition{e: e, key: offsetKey(m.o.Group, t.topic, t.part), progress: time.Now()}
			p.stopped.Store(-1)
			next, err := readOffset(e, p.key)
			if err != nil {
				_ = e.Close()
				return nil, err
			}
			p.next.Store(next)
			return p, nil
		}
		if !errors.Is(err, engine.ErrLocked) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readOffset returns the offset stored under key, -1 for none; a stored
// offset of another partition is ErrForeignDir.
func readOffset(e *engine.Engine, key []byte) (int64, error) {
	next := int64(-1)
	err := e.ScanWrites([]byte(offsetPrefix), func(k, v []byte) error {
		if string(k) != string(key) {
			return fmt.Errorf("%w: %q", ErrForeignDir, k)
		}
		if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) < 0 {
			// Not a record this package wrote: a damaged store.
			return fmt.Errorf("%w: kafkadedup: offset record %x of %d bytes", engine.ErrStorage, v, len(v))
		}
		next = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	return next, err
}

// revoke returns the callback for revoked (export) or lost (no export: the
// partition may already be another member's) partitions: each engine is
// flushed, exported when asked, and closed before the partition is handed
// over.
func (m *Member) revoke(export bool) func(context.Context, *kgo.Client, map[string][]int32) {
	return func(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
		if m.o.CommitToGroup && export {
			if err := cl.CommitMarkedOffsets(ctx); err != nil {
				m.log.Printf("kafkadedup: commit to group on revocation: %v", err)
			}
		}
		for topic, parts := range revoked {
			for _, part := range parts {
				t := tp{topic, part}
				m.mu.Lock()
				p := m.parts[t]
				delete(m.parts, t)
				m.mu.Unlock()
				if p == nil {
					continue
				}
				m.stats.revoked.Add(1)
				if !export {
					m.log.Printf("kafkadedup: %s/%d: lost (not exported: it may already be another member's)", t.topic, t.part)
				}
				m.release(ctx, t, p, export)
			}
		}
	}
}

// release flushes, exports (if asked and configured) and closes p.
func (m *Member) release(ctx context.Context, t tp, p *partition, export bool) {
	if err := p.e.Flush(ctx); err != nil {
		m.log.Printf("kafkadedup: %s/%d: flush: %v", t.topic, t.part, err)
	}
	// The export's version is the offset the store holds now: a commit
	// whose caller stopped waiting may have landed since Process saw it.
	next, err := readOffset(p.e, p.key)
	if err != nil {
		m.log.Printf("kafkadedup: %s/%d: read offset: %v", t.topic, t.part, err)
		export = false
	}
	if export && m.o.Exports != "" && next > 0 {
		if info, err := p.e.Export(ctx, m.exportDir(t), uint64(next)); err != nil {
			m.log.Printf("kafkadedup: %s/%d: export: %v", t.topic, t.part, err)
		} else {
			m.stats.exports.Add(1)
			m.log.Printf("kafkadedup: %s/%d: exported at offset %d (%d files, %d bytes)", t.topic, t.part, next, info.Files, info.Bytes)
		}
	}
	if err := p.e.Close(); err != nil {
		m.log.Printf("kafkadedup: %s/%d: close: %v", t.topic, t.part, err)
	}
}

// inDir returns the engine Options of a partition's directory: the
// template's, with its embedded store's settings (the defaults when it
// names none) in dir.
func inDir(o engine.Options, dir string) engine.Options {
	var b embedded.Backend
	if eb, ok := o.Backend.(*embedded.Backend); ok && eb != nil {
		b = *eb
	}
	b.Dir = dir
	o.Backend = &b
	return o
}
