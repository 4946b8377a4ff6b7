package kafkadedup

import (
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
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
	// StallReport bounds how long a partition the Member holds may receive
	// records without committing any before it says why: it is logged, with
	// the offset the partition is stopped at and the stop's cause (a
	// handler error, a key in flight elsewhere, a failed claim or commit),
	// and counted (Stats.Stalls); again each StallReport while it lasts.
	// Default 1 minute, at most an hour.
	StallReport time.Duration
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
	// Rewinds counts fetches from beyond the offset a partition stopped
	// at (a handler error, a key in flight, a failed commit) whose records
	// were ignored and the client set back to the stop again.
	Rewinds uint64
	// Stalls counts the reports of partitions that received records but
	// committed none for Options.StallReport.
	Stalls uint64
}

// Member is one consumer-group member's dedup state: an engine per
// assigned partition. Its callbacks run inside the kgo.Client's group
// management; Process and Run are called from one goroutine.
type Member struct {
	o     Options
	log   *log.Logger
	mu    sync.Mutex // protects parts; Process reads it without the lock only between the client's rebalances
	parts map[tp]*partition
	stats struct{ records, news, dups, rejected, failed, assigned, revoked, imports, exports, rewinds, stalls atomic.Uint64 }
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
	if _, ok := o.Engine.Backend.(*embedded.Backend); o.Engine.Tiers != engine.Default || (o.Engine.Backend != nil && !ok) {
		errs = append(errs, fmt.Errorf("%w: Engine is %s, want the embedded default (the offset is written with the marks)", ErrOptions, o.Engine.Name()))
	}
	if o.OpenWait < 0 || o.OpenWait > maxOpenWait {
		errs = append(errs, fmt.Errorf("%w: OpenWait %v outside [0, %v]", ErrOptions, o.OpenWait, maxOpenWait))
	}
	if o.StallReport < 0 || o.StallReport > time.Hour {
		errs = append(errs, fmt.Errorf("%w: StallReport %v outside [0, 1h]", ErrOptions, o.StallReport))
	}
	tmpl := inDir(o.Engine, filepath.Join(o.Dir, "template"))
	if err := tmpl.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.OpenWait == 0 {
		o.OpenWait = 30 * time.Second
	}
	if o.StallReport == 0 {
		o.StallReport = time.Minute
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
		Assigned: s.assigned.Load(), Revoked: s.revoked.Load(), Imports: s.imports.Load(), Exports: s.exports.Load(), Rewinds: s.rewinds.Load(), Stalls: s.stalls.Load(),
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
