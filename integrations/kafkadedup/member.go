package kafkadedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
)

// Errors a Member returns or passes to Options.Reject.
var (
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("kafkadedup: invalid options")
	// ErrPoison is the reason a record is rejected when its key answered
	// engine.Poison: its handler failed Options.Engine.MaxAttempts times.
	ErrPoison = errors.New("kafkadedup: handler keeps failing (poison)")
	// ErrConflict is the reason a record is rejected when its key was
	// committed with another payload digest (Options.Digest).
	ErrConflict = errors.New("kafkadedup: key committed with another payload")
	// ErrForeignDir reports a partition directory whose stored offset
	// belongs to another topic-partition.
	ErrForeignDir = errors.New("kafkadedup: directory holds another partition's state")
)

// Handler handles one New record. It returns the records of its effect,
// written in the same atomic batch as the record's mark and the
// partition's offset (a ledger entry, an outbox row), or an error: the
// record's claim is released (an attempt counted) and the partition
// resumes at it on the next poll. A handler must not keep r or the writes'
// byte slices changed after it returns.
type Handler func(ctx context.Context, r *kgo.Record) ([]engine.Write, error)

// Options configure a Member. The zero value of each field is its default.
type Options struct {
	// Group is the consumer group; required. Opts sets it on the client,
	// and it names the directories and the stored offsets, so members of
	// two groups never take each other's state for their own.
	Group string
	// Dir holds one engine directory per assigned partition,
	// Dir/<group>/<topic>.<partition>; required. Members that share it
	// hand partitions over without a copy.
	Dir string
	// Exports, if not empty, is a directory every member can read and
	// write: on revocation a member exports each partition's state to
	// Exports/<group>/<topic>.<partition>, on assignment it imports that
	// export when it is newer than its own directory's state.
	Exports string
	// Engine is the template of every partition's engine; Dir is set per
	// partition, Tiers must be Default (the offset is written with the
	// marks). MaxAttempts > 0 is recommended: a record whose handler keeps
	// failing then becomes Poison and is rejected instead of blocking its
	// partition forever.
	Engine engine.Options
	// Key returns a record's dedup key; nil means the record's Key. A key
	// the engine refuses (empty, too long) rejects the record.
	Key func(*kgo.Record) []byte
	// Digest, if set, returns a record's payload digest: a key committed
	// with another digest rejects the record with ErrConflict.
	Digest func(*kgo.Record) engine.Digest
	// Reject is called with each record that is skipped rather than
	// handled, and why (ErrPoison, ErrConflict, or an error matching
	// engine.ErrEmptyKey or engine.ErrKeyTooLong); dead-letter it there.
	// Its offset is committed with the batch, after Reject returned: a
	// crash or a failed commit between the two calls Reject again for the
	// same record (dead-lettering is at least once). nil: skipped (counted
	// in Stats.Rejected).
	Reject func(ctx context.Context, r *kgo.Record, why error)
	// CommitToGroup also commits each partition's stored offset to the
	// consumer group after it is durable (with kgo.AutoCommitMarks), for
	// lag monitoring and for a member that starts with no state. The
	// stored offset stays the one a partition resumes at.
	CommitToGroup bool
	// OpenWait bounds how long assignment waits for a partition directory
	// that a previous owner still holds; default 30s, at most 10 minutes.
	OpenWait time.Duration
	// Logger receives assignment and handoff events; nil means log.Default.
	Logger *log.Logger
}

// Stats are a Member's counters since New.
type Stats struct {
	// Records is every record Process saw; New those handed to the
	// handler and committed; Duplicates those whose key was committed
	// (earlier, or by an earlier copy in the same batch); Rejected those
	// given to Options.Reject; Failed handler errors.
	Records, New, Duplicates, Rejected, Failed uint64
	// Assigned and Revoked count partitions; Imports and Exports the
	// handoffs made.
	Assigned, Revoked, Imports, Exports uint64
}

// Member is one consumer-group member's dedup state: an engine per
// assigned partition. Its callbacks run inside the kgo.Client's group
// management; Process and Run are called from one goroutine.
type Member struct {
	o     Options
	log   *log.Logger
	mu    sync.Mutex // protects parts; Process reads it without the lock only between the client's rebalances
	parts map[tp]*partition
	stats struct{ records, news, dups, rejected, failed, assigned, revoked, imports, exports atomic.Uint64 }
}

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
}

// maxOpenWait bounds Options.OpenWait.
const maxOpenWait = 10 * time.Minute

// New checks opts and returns a Member; pass Opts() to kgo.NewClient.
func New(opts *Options) (*Member, error) {
	o := *opts
	var errs []error
	if o.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: Dir is empty", ErrOptions))
	}
	if o.Group == "" || o.Group == "." || o.Group == ".." {
		errs = append(errs, fmt.Errorf("%w: Group %q: want a consumer group's name", ErrOptions, o.Group))
	}
	if o.Engine.Tiers != engine.Default || o.Engine.Backend != nil {
		errs = append(errs, fmt.Errorf("%w: Engine is %s, want the embedded default (the offset is written with the marks)", ErrOptions, o.Engine.Name()))
	}
	if o.OpenWait < 0 || o.OpenWait > maxOpenWait {
		errs = append(errs, fmt.Errorf("%w: OpenWait %v outside [0, %v]", ErrOptions, o.OpenWait, maxOpenWait))
	}
	tmpl := o.Engine
	tmpl.Dir = filepath.Join(o.Dir, "template")
	if err := tmpl.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.OpenWait == 0 {
		o.OpenWait = 30 * time.Second
	}
	if o.Key == nil {
		o.Key = func(r *kgo.Record) []byte { return r.Key }
	}
	m := &Member{o: o, log: o.Logger, parts: map[tp]*partition{}}
	if m.log == nil {
		m.log = log.Default()
	}
	return m, nil
}

// Opts returns the group options the Member needs: the group, rebalances
// only between polls, partitions resumed at their stored offsets, flushed
// (and exported) on revocation, and offsets committed to the group only as
// Options.CommitToGroup says. Add them to the client's own options. With
// rebalances only between polls, every poll must be followed by
// cl.AllowRebalance() (Run does it), even one abandoned: a rebalance, and
// closing the client, wait for it.
func (m *Member) Opts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ConsumerGroup(m.o.Group),
		kgo.BlockRebalanceOnPoll(),
		kgo.AdjustFetchOffsetsFn(m.assign),
		kgo.OnPartitionsRevoked(m.revoke(true)),
		kgo.OnPartitionsLost(m.revoke(false)),
	}
	if m.o.CommitToGroup {
		return append(opts, kgo.AutoCommitMarks())
	}
	return append(opts, kgo.DisableAutoCommit())
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
	info, err := engine.ReadExport(nil, m.exportDir(t))
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
	o := m.o.Engine
	o.Dir = m.dir(t)
	_, err = engine.Import(ctx, m.exportDir(t), &o, uint64(max(p.next.Load(), 0)))
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
	o := m.o.Engine
	o.Dir = m.dir(t)
	if err := os.MkdirAll(filepath.Dir(o.Dir), 0o755); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(m.o.OpenWait)
	for {
		e, err := engine.Open(&o)
		if err == nil {
			p := &partition{e: e, key: offsetKey(m.o.Group, t.topic, t.part)}
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

// Offset returns the offset partition (topic, part) resumes at, as stored
// with its marks, and whether the Member holds it with one stored.
func (m *Member) Offset(topic string, part int32) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.parts[tp{topic, part}]
	if p == nil || p.next.Load() < 0 {
		return 0, false
	}
	return p.next.Load(), true
}

// Engine returns the engine of an assigned partition, or nil: for reading
// the handler's records (ScanWrites) and Stats. It is closed when the
// partition is revoked.
func (m *Member) Engine(topic string, part int32) *engine.Engine {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.parts[tp{topic, part}]; p != nil {
		return p.e
	}
	return nil
}

// Stats returns the Member's counters.
func (m *Member) Stats() Stats {
	s := &m.stats
	return Stats{
		Records: s.records.Load(), New: s.news.Load(), Duplicates: s.dups.Load(), Rejected: s.rejected.Load(), Failed: s.failed.Load(),
		Assigned: s.assigned.Load(), Revoked: s.revoked.Load(), Imports: s.imports.Load(), Exports: s.exports.Load(),
	}
}

// Close closes the engines of the partitions still held, without export.
// Close the kgo.Client first: leaving the group revokes (and exports)
// every partition.
func (m *Member) Close() error {
	m.mu.Lock()
	parts := m.parts
	m.parts = map[tp]*partition{}
	m.mu.Unlock()
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.e.Close())
	}
	return errors.Join(errs...)
}
