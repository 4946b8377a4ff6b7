package tier

import (
	"context"
	"io"
	"log"
	"time"
)

// An archive keeps the committed keys of partitions that left the hot
// window, for the archive window after them: the exact tier answers for
// the window, the archive for the history behind it.
//
// The engine copies each closed partition of the exact tier into the
// archive once (Put, all or nothing), keeps a filter of the archived keys
// in memory (saved in the archive as blobs, so no process scans the
// history to start), and deletes a partition from the exact tier only
// after the archive holds it durably. A key the exact tier does not hold
// is looked up in the archive only where that filter says it may be.

// ArchiveBackend is an archive the engine has not opened yet, built by the
// caller in the store's own package (a directory, a PostgreSQL pool), as a
// Backend is.
type ArchiveBackend interface {
	// Name names the archive in the configuration's name and in Stats:
	// "files", "postgres".
	Name() string
	// Validate reports every setting the archive refuses, each matching
	// ErrOptions; it never reaches a server.
	Validate(env ArchiveEnv) error
	// Open connects, checks or records the layout env implies (ErrLayout
	// for an archive of another owner, secret, partition length or
	// format, or a shorter window), and returns the archive. A window
	// longer than the recorded one is recorded only by the archive's
	// GrowWindow (ArchiveWindowGrower), which the engine calls once its
	// own Open can no longer fail. ctx bounds the opening only.
	Open(ctx context.Context, env ArchiveEnv) (Archive, error)
}

// ArchiveEnv is what the engine tells an archive when it opens it.
type ArchiveEnv struct {
	// Partitions are the exact tier's: the archive keeps whole partitions
	// of that length, numbered alike.
	Partitions Partitions
	// Window is the archive window: a partition is kept until partition
	// p+Window/Length+1 begins, as the exact tier keeps it for its own.
	Window time.Duration
	// Owner identifies the exact tier whose partitions the archive holds
	// (a store ID, a Redis prefix); Check is a digest of the secret that
	// keys the fingerprints of its filter blobs. An archive recorded with
	// another of either is refused (ErrLayout): its filters would not
	// match, or its history is another store's.
	Owner string
	Check [16]byte
	// Existing says the exact tier moved partitions to an archive before:
	// an archive that records no layout yet (a new, empty one) is refused
	// (ErrLayout), and records none, rather than take the owner: it is not
	// the archive that holds them.
	Existing bool
	// Dir is the exact tier's directory, empty when it has none: an
	// archive of files refuses one that overlaps it (ErrOptions).
	Dir string
	// Logger receives the archive's warnings; never nil.
	Logger *log.Logger
	// Log says the archive is fed from a shared tier's ArchiveLog, key by
	// key (ArchiveAppender), by whichever process holds the drain lease:
	// an archive that cannot take keys so refuses it (ErrOptions).
	Log bool
}

// Record is one committed key of a partition, as it is archived.
type Record struct {
	NS, Key []byte
	Digest  Digest
	// At is the commit's time (Unix ns), zero when the tier did not store
	// it; Result the commit's stored result, nil for none.
	At     int64
	Result []byte
}

// ArchiveQuery asks for one key in the archived partitions [From, To).
type ArchiveQuery struct {
	NS       string
	Key      []byte
	From, To int64
}

// ArchiveWindowGrower is an Archive that Open found recording a shorter
// window than the one asked, and left it so: GrowWindow records the one
// asked (a window may grow, never shrink). Until then, a process asking
// for the recorded window still opens it.
type ArchiveWindowGrower interface {
	GrowWindow(ctx context.Context) error
}

// Archive is an opened archive. Its methods are safe for concurrent use;
// errors mean nothing is known (a read) or the call may not have taken
// effect (a write, which is safe to retry).
type Archive interface {
	// Archived returns the partitions the archive holds whole, in
	// ascending order.
	Archived(ctx context.Context) ([]int64, error)
	// Put stores partition p's records, which scan produces (calling its
	// argument once per record, whose slices are valid only during the
	// call), all or nothing and durably: after it returns nil, Archived
	// lists p; after a failure or a crash, p is absent or whole. Putting a
	// partition already held replaces nothing and returns nil.
	Put(ctx context.Context, p int64, scan func(func(*Record) error) error) error
	// Lookup answers each query: Committed, with Partition, Digest, At and
	// Result (a copy), from the newest partition in [From, To) holding
	// the key, or Absent.
	Lookup(ctx context.Context, qs []ArchiveQuery, out []Answer) error
	// Forget removes the key from every partition in [From, To), durably,
	// and answers what it found as Lookup does.
	Forget(ctx context.Context, qs []ArchiveQuery, out []Answer) error
	// Scan calls fn for every key of archived partition p (rebuilding a
	// filter whose blob is missing); ns and key are valid only during the
	// call.
	Scan(ctx context.Context, p int64, fn func(ns, key []byte) error) error
	// Drop deletes every partition before `before`, and the blobs
	// (DropBlobs) named with a partition number before it.
	Drop(ctx context.Context, before int64) error
	// PutBlob stores the bytes write produces under name, replacing any
	// blob of that name, atomically and durably.
	PutBlob(ctx context.Context, name string, write func(io.Writer) error) error
	// Blob returns the named blob; ok is false when there is none. The
	// caller closes it.
	Blob(ctx context.Context, name string) (b ReadBlob, ok bool, err error)
	// Blobs lists the names of the stored blobs, in ascending order.
	Blobs(ctx context.Context) ([]string, error)
	// DeleteBlob removes a blob; a missing one is no error.
	DeleteBlob(ctx context.Context, name string) error
	// Close releases the archive's resources.
	Close() error
}

// ReadBlob is a stored blob: its bytes, random access, and its size.
type ReadBlob interface {
	io.ReaderAt
	io.Closer
	Size() int64
}

// RecordScanner is a partitioned Exact tier that can list a partition's
// committed records whole, for the archive.
type RecordScanner interface {
	// ScanRecords calls fn for every committed record of partition p, in
	// key order; the record's slices are valid only during the call.
	// Attempt counts and an entity's versions (Advance) are not records.
	ScanRecords(ctx context.Context, p int64, fn func(*Record) error) error
}

// A shared exact tier that expires keys itself (Redis) has no partitions
// to copy: it appends every archived commit, in the step that makes it,
// to a durable log (ArchiveLog), and the engine holding the drain lease
// applies the log, in order, to an archive that takes keys one by one
// (ArchiveAppender), then seals each partition once the log holds none
// of its entries and none can come.

// LogPos is a position in an ArchiveLog: entries are ordered by (MS, Seq),
// MS being the server's clock (Unix ms) when the entry was appended.
type LogPos struct{ MS, Seq uint64 }

// Less reports whether p is before q.
func (p LogPos) Less(q LogPos) bool { return p.MS < q.MS || p.MS == q.MS && p.Seq < q.Seq }

// LogEntry is one entry of an ArchiveLog: a commit of Record (its At the
// commit's time, Unix ns, as the committing engine dated it, or else the
// log's clock at Pos), or, with Forget, the
// removal of Record's NS and Key from the archive (a Forget, or a commit
// undone). Partition is the archive partition the engine files it in.
type LogEntry struct {
	Pos       LogPos
	Forget    bool
	Record    Record
	Partition int64
}

// ArchiveLog is an exact tier that appends, atomically with the write that
// makes it, every commit of a Request with Archive set, and every removal
// of one (Forget, a commit undone by a give-back), to a durable log.
type ArchiveLog interface {
	// ReadLog returns the entries of up to n positions after position
	// after, in order, and the log's clock (Unix ns) read before them:
	// every entry appended later is at or after it. Several entries may
	// share a position (commits the tier appended together); a read
	// returns every entry of each position it returns, so fewer than n
	// positions means the log held no more.
	ReadLog(ctx context.Context, after LogPos, n int) (entries []LogEntry, now int64, err error)
	// TrimLog deletes the entries up to and including upTo, which the
	// archive applied, and forgets the removals among them (Removing).
	TrimLog(ctx context.Context, upTo LogPos) error
	// Removing returns, for each key of namespace ns, the position of its
	// newest removal still in the log (appended, not trimmed: the archive
	// may not have applied it), or the zero position, and the newest
	// position trimmed as of that read or later. What the archive holds
	// for such a key, read when it had applied the log only up to a
	// position before that removal, is a commit the removal undid.
	Removing(ctx context.Context, ns string, keys [][]byte) (removed []LogPos, trimmed LogPos, err error)
	// LogTail returns the position of the newest entry ever appended, the
	// newest ever trimmed (zero for none), and the number of entries the
	// log holds.
	LogTail(ctx context.Context) (tail, trimmed LogPos, entries int64, err error)
	// Bind records, on first use, what the log feeds (the archive and the
	// settings every process must share, as one string), and refuses
	// (ErrLayout) a process that brings another: two archives would each
	// miss what the other drained.
	Bind(ctx context.Context, archive string) error
	// DrainLease takes or renews the drain lease for owner for ttl, and
	// reports whether owner holds it.
	DrainLease(ctx context.Context, owner string, ttl time.Duration) (bool, error)
	// LogOwner names the log for the archive's layout ("redis:" ‖ prefix).
	LogOwner() string
}

// AppliedLookup is an ArchiveAppender whose lookup can also return the
// log position it had applied as of the read, of one snapshot with the
// answers: every entry at or before that position shows in them.
type AppliedLookup interface {
	LookupApplied(ctx context.Context, qs []ArchiveQuery, out []Answer) (LogPos, error)
}

// ArchiveAppender is an archive that takes an ArchiveLog's entries as they
// come, instead of whole partitions.
type ArchiveAppender interface {
	// Applied returns the position of the last entry applied (zero for
	// none) and the first partition not sealed (-1 when none was ever).
	Applied(ctx context.Context) (pos LogPos, sealedNext int64, err error)
	// Apply applies entries, in order, in one transaction with the new
	// position (entries sharing a position come in one call): an entry
	// at or before the recorded position is skipped,
	// so a batch applied twice (a drainer that died before trimming the
	// log, two drainers a lease apart) changes nothing the second time. A
	// commit adds its record to its partition (or to the first partition
	// not sealed, if its own is sealed) unless that partition holds the
	// key already; a forget removes the key from every partition.
	Apply(ctx context.Context, entries []LogEntry) error
	// Start makes p the first partition not sealed if none was ever set
	// (an archive new to the log), and returns the first partition not
	// sealed.
	Start(ctx context.Context, p int64) (sealedNext int64, err error)
	// Seal records partition p, and every unsealed one before it, as
	// whole: Archived lists p, and Applied's sealedNext is p+1.
	Seal(ctx context.Context, p int64) error
	// Secret returns the archive's own fingerprint secret, drawn when it
	// was created: the filters of an archive several processes share are
	// keyed by it.
	Secret() [16]byte
}
