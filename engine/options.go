package engine

import (
	"fmt"
	"log"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Tiers selects which tiers an Engine stacks.
type Tiers uint8

// Configurations. Their guarantees are in the README's table. The exact
// tier is not a Tiers value: it is a Backend (Options.Backend), built in
// its own package (the embedded store, Redis, PostgreSQL), behind memory.
const (
	// Default is memory + the Backend's exact tier: with the embedded
	// store (embedded.Dir(dir)), memory + bloom + Pebble, exact, durable,
	// one process per directory; with a shared tier, memory + that tier.
	// It needs a Backend.
	Default Tiers = iota
	// MemoryOnly keeps claims and recent commits in memory: never drops a
	// new message, lets duplicates through after eviction or restart.
	MemoryOnly
	// BloomOnly answers from Bloom filters: never lets a duplicate through
	// inside the window, drops new messages at the false-positive rate.
	// Its Backend is the embedded store's, for its filters alone
	// (&embedded.Backend{}); with a Dir there, the filters survive a clean
	// restart through a snapshot.
	BloomOnly
)

// String returns the configuration's name.
func (t Tiers) String() string {
	switch t {
	case Default:
		return "memory+bloom+pebble"
	case MemoryOnly:
		return "memory"
	case BloomOnly:
		return "bloom"
	}
	return fmt.Sprintf("Tiers(%d)", uint8(t))
}

// Clock tells the time. Tests inject one; nil means the system clock. A
// reading before 1970, or within three MaxWindow of the end of int64
// nanoseconds (2262), is taken as no progress: the engine keeps the
// highest reading it has seen.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

// Now returns the system time.
func (systemClock) Now() time.Time { return time.Now() }

// Defaults for Options fields left zero.
const (
	DefaultWindow    = 7 * 24 * time.Hour
	DefaultPartition = 24 * time.Hour
	// DefaultLease is how long a claim excludes other workers: long enough
	// for a handler with a few retries, short enough that a crashed
	// worker's messages are redelivered within a minute.
	DefaultLease = 30 * time.Second
	// DefaultMaxKeySize covers UUIDs, numeric IDs and business keys with
	// room to spare; longer keys are usually a bug upstream.
	DefaultMaxKeySize = 1024
	// MaxKeySize is the largest MaxKeySize accepted.
	MaxKeySize = 64 << 10
	// MinPartition is the shortest partition: the on-disk layout numbers
	// partitions in 32 bits from the Unix epoch.
	MinPartition = time.Second
	// DefaultCommitQueue is the default Options.CommitQueue.
	DefaultCommitQueue = 4096
	// MaxCommitQueue is the largest Options.CommitQueue.
	MaxCommitQueue = 1 << 20
	// MaxNamespace is the longest namespace name, in bytes.
	MaxNamespace = 255
	// MaxWindow bounds Window and Partition: ten years. Engine time is Unix
	// nanoseconds in an int64, which ends in 2262; with this bound every
	// lease end, expiry and partition boundary the engine computes stays
	// far inside that range.
	MaxWindow = 10 * 365 * 24 * time.Hour
	// MaxMemoryCapacity bounds MemoryCapacity: entries are indexed in 32
	// bits per stripe, and at ≈ 66 B an entry it is already 140 GiB.
	MaxMemoryCapacity = 1 << 31
	// MaxExpectedKeys bounds ExpectedKeys: 4.3×10⁹ keys a partition, a
	// filter of ≈ 7.5 GiB at the default false-positive rate.
	MaxExpectedKeys = 1 << 32
	// DefaultMaxResultSize is the default Options.MaxResultSize: room for a
	// typical API response or a reference to a larger one.
	DefaultMaxResultSize = 4 << 10
	// MaxResultSize is the largest MaxResultSize accepted: room for a
	// stored HTTP response with its body. Only memory-only keeps results
	// in memory; with an exact tier, a key committed with a result is not
	// cached in memory and each of its duplicates reads the result from
	// that tier.
	MaxResultSize = 4 << 20
)

// Options configure an Engine. The zero value of every field is a
// documented default; Validate reports every invalid field at once.
type Options struct {
	// Tiers is the configuration; the zero value is Default.
	Tiers Tiers
	// Window is how long a committed key stays a duplicate, at least; keys
	// are kept for up to Window + Partition. Zero means DefaultWindow; at
	// most MaxWindow. A store remembers it: a later Open may lengthen it,
	// never shorten it (ErrLayout).
	Window time.Duration
	// Partition is the retention granule: expiry drops one partition at a
	// time, and each partition has its own Bloom filter. Zero means
	// DefaultPartition; in [MinPartition, MaxWindow]; Window/Partition must
	// not exceed 63. A store remembers it: a later Open with another one is
	// refused (ErrLayout).
	Partition time.Duration
	// Lease is how long a claim excludes other workers. It must be shorter
	// than Window. Zero means DefaultLease.
	Lease time.Duration
	// MemoryCapacity is the number of committed keys cached in memory, at
	// most MaxMemoryCapacity. Zero means 1<<20 (≈ 66 MiB). Memory grows
	// with use up to it; claims in flight are not counted.
	MemoryCapacity int
	// Stripes is the number of lock stripes, a power of two. Zero means 256.
	Stripes int
	// ExpectedKeys is the number of keys one partition is sized for in the
	// Bloom filters, at most MaxExpectedKeys. Zero means 10M. The filters
	// of every live partition are one interleaved ring whose full size is
	// Live × ExpectedKeys × bits a key (15.5 at the default 1 % over 8
	// partitions, 155 MB for the default 10M; bloom.Sizing, and dedupbench
	// plan, compute it). In Default the ring starts at about a MiB and
	// doubles as partitions receive keys (a partition of n keys has grown
	// it to about 16·n keys a partition), so ExpectedKeys is its ceiling;
	// a snapshot keeps its size across restarts. Bloom-only's ring is
	// allocated whole at the first key, and its state remembers the size
	// (ErrLayout if changed).
	ExpectedKeys int
	// FalsePositive is the Bloom false-positive target over the whole
	// window, in (0, 1). Zero means 0.01. In Default it costs a disk read;
	// in BloomOnly it is the rate of wrongly dropped messages.
	FalsePositive float64
	// MaxAttempts, when positive, turns a key whose claims were released or
	// left to expire that many times into Poison, so the consumer can
	// dead-letter it. Zero counts nothing. The count is stored with the key
	// in the durable tier (a released record in Pebble, the key's value in
	// Redis, shared by every process on the prefix), so restarts and
	// evictions forget nothing; it lives as a commit does, for the window
	// after the last attempt, and a commit clears it. In the embedded
	// configuration a claim abandoned by a crash is void at the next Open
	// and not counted (claims are not written to disk) unless DurableClaims
	// says otherwise; memory-only keeps counts in memory, and bloom-only
	// keeps none. At most 65535.
	MaxAttempts int
	// DurableClaims, in the embedded store, makes every New answer of
	// Claim, ClaimBatch, Do and DoResult durable as an attempt before it is
	// given: the key's attempt count, one more than before, is written
	// (one synced write per call that claims New keys) and stays unless
	// the claim commits or is given back uncounted (UnclaimBatch). A claim
	// a crash (or a Close) abandoned is then counted at the next Open, as a
	// shared tier counts a lease that ended, so with MaxAttempts 1 a key
	// whose handler may have run is Poison, never New again: for effects
	// that must not run twice even when their outcome is unknown (an HTTP
	// request's, under an Idempotency-Key). It needs MaxAttempts. A shared
	// tier (Redis, PostgreSQL) holds claims in its store already: there it
	// changes nothing. Not memory-only nor bloom-only (ErrOptions).
	DurableClaims bool
	// MaxKeySize is the longest key accepted, in bytes, at most MaxKeySize.
	// Zero means DefaultMaxKeySize.
	MaxKeySize int
	// MaxResultSize is the longest result a commit may store with its key
	// (Claim.Result), in bytes, at most MaxResultSize; a longer one is
	// refused with ErrResultTooLarge. Zero means DefaultMaxResultSize.
	MaxResultSize int
	// CommitQueue bounds the commit calls waiting in the commit queue
	// (with an exact tier: every commit goes through it, and pending calls
	// are written together); when it is full, CommitAsync and Commit wait
	// for room. Zero means DefaultCommitQueue; at most MaxCommitQueue.
	CommitQueue int
	// Clock tells the time; nil means the system clock.
	Clock Clock
	// Logger receives the engine's and its tiers' warnings (storage errors,
	// overfilled filters, an archive that lags), at level Warn; nil means
	// slog.Default().
	Logger *slog.Logger
	// Tracer, when set, is told when each Do and DoResult starts and ends
	// (integrations/oteldedup makes one from an OpenTelemetry
	// TracerProvider). Nil costs one pointer comparison a call.
	Tracer Tracer

	// Backend is the exact tier behind memory, built in its own package:
	// the embedded store, embedded.Dir("/var/lib/orders-dedup") (Pebble
	// behind the engine's Bloom filters, in a directory of one process),
	// or a shared tier, such as redis.NewBackend(client,
	// redis.Config{Prefix: "orders:"}) or postgres.NewBackend(pool,
	// postgres.Config{}): exact and shared by every process that opens the
	// same backend settings, durable as its server is. Default needs one;
	// BloomOnly takes the embedded store's, for its filters alone;
	// MemoryOnly none.
	Backend tier.Backend

	// FailOpen makes claims and marks answer New, and commits succeed
	// locally, while the shared tier (Redis or PostgreSQL) is unavailable,
	// instead of failing with ErrUnavailable (the default: fail closed).
	// Every such answer is counted in Stats.Calls.FailOpen. Only for consumers
	// that prefer a duplicate effect to a stalled queue.
	//
	// It trades a duplicate effect and nothing else. Calls whose promise
	// is not "at least once" fail closed with ErrUnavailable whatever it
	// says: IssueToken and ConsumeToken (a token stored nowhere, or used
	// twice), Advance and the Commit of its claim (a version that moves
	// back), Lookup, Forget and Extend (they answer nothing a handler could
	// proceed on). A commit batch holding such a claim beside the caller's
	// fails closed whole (the tier reports one error for the batch).
	FailOpen bool
	// Namespaces are the namespaces whose settings differ from the
	// engine's, by name ("" is the default one): a window of their own,
	// an archive window of their own, a sliding window (NamespaceOptions).
	// Namespaces not named here take the engine's.
	Namespaces map[string]NamespaceOptions
	// NoSharedCache keeps no committed keys of the shared tier in memory
	// (a Backend whose claims live in it): every claim of a key not in flight in
	// this process asks the shared tier. Forget needs it: otherwise the
	// process that committed a key keeps answering Duplicate from memory,
	// for up to Window/2, after another process forgot it. The prefix (or
	// table) records it, so every process sharing it must agree
	// (ErrLayout otherwise).
	NoSharedCache bool
	// Needs lists the calls the program will make that not every
	// configuration serves (Need): Open refuses, with ErrOptions naming
	// the call, a configuration that cannot serve one, instead of the
	// call failing when first made. Zero checks nothing at Open.
	Needs Need

	// Archive keeps the committed keys of partitions that left the
	// Window, for ArchiveWindow: a claim, mark or Lookup of a key
	// committed before the window but inside ArchiveWindow answers
	// Duplicate (with its stored result), read from the archive where the
	// archive's own filter says the key may be; Forget reaches it too. Nil
	// means none: a key is New once its partition leaves the Window. The
	// embedded store only (Tiers Default, embedded.Dir), with pebble.ArchiveDir
	// (files in a directory) or postgres.Archive (a table partition per
	// partition); namespaces with their own window and the
	// engine's tokens are not archived (their window is their promise).
	// See docs/archive.md.
	Archive tier.ArchiveBackend
	// ArchiveWindow is how long the archive keeps a key, counted like
	// Window (from its partition; at most one partition more). Zero means
	// DefaultArchiveWindow; it must be longer than Window, at most
	// MaxWindow. The archive records it: a later Open may lengthen it,
	// never shorten it (ErrLayout).
	ArchiveWindow time.Duration
	// ArchiveFalsePositive is the archive filter's false-positive target,
	// the share of new keys that cost an archive read. Zero means 0.01.
	ArchiveFalsePositive float64
	// DetachArchive lets an embedded store that moved partitions to an
	// archive open without it (Archive nil): keys of those partitions
	// that left the Window are New from then on, and that archive can
	// never be attached again (ErrLayout: it would bring back keys
	// forgotten meanwhile); a new, empty archive can. Without it such a
	// store is refused without its archive (ErrLayout). Refused with an
	// Archive (ErrOptions).
	DetachArchive bool
}

// DefaultArchiveWindow is the archive window when Options.Archive is set
// and ArchiveWindow is zero.
const DefaultArchiveWindow = 90 * 24 * time.Hour

// archiveBinding is what every process feeding one archive from a shared
// tier's log must agree on, as the tier records it (tier.ArchiveLog.Bind):
// the archive (check, the digest of its own secret), its window, the
// namespaces' archive windows (an engine with a shorter one would expire
// what another promises) and the filter's parameters (a blob of other
// parameters is not loaded, and every engine would rescan the partitions).
func (o Options) archiveBinding(check [16]byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "tierdedup archive 1 check=%x window=%dns partition=%dns expected-keys=%d false-positive=%g",
		check, int64(o.ArchiveWindow), int64(o.Partition), o.ExpectedKeys, o.ArchiveFalsePositive)
	nsa := o.nsArchiveWindows()
	for _, n := range slices.Sorted(maps.Keys(nsa)) {
		fmt.Fprintf(&b, " %q=%dns", n, int64(nsa[n]))
	}
	return b.String()
}

func (o Options) archiveEnv(parts tier.Partitions) tier.ArchiveEnv {
	var dir string
	if lb, ok := o.Backend.(tier.LocalBackend); ok && o.local() {
		dir = lb.Path()
	}
	return tier.ArchiveEnv{Partitions: parts, Window: o.ArchiveWindow, Dir: dir, Logger: o.logLogger(), Log: o.Backend != nil && !o.local()}
}

// WithDefaults returns a copy of o with every field left zero that has a
// default set to it: the options Open runs with. It does not validate.
func (o Options) WithDefaults() Options {
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.Partition == 0 {
		o.Partition = DefaultPartition
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.MaxKeySize == 0 {
		o.MaxKeySize = DefaultMaxKeySize
	}
	if o.MaxResultSize == 0 {
		o.MaxResultSize = DefaultMaxResultSize
	}
	if o.CommitQueue == 0 {
		o.CommitQueue = DefaultCommitQueue
	}
	if o.ExpectedKeys == 0 {
		o.ExpectedKeys = bloom.DefaultExpectedKeys
	}
	if o.FalsePositive == 0 {
		o.FalsePositive = bloom.DefaultFalsePositive
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
	if o.Archive != nil && o.ArchiveWindow == 0 {
		o.ArchiveWindow = DefaultArchiveWindow
	}
	if o.Archive != nil && o.ArchiveFalsePositive == 0 {
		o.ArchiveFalsePositive = bloom.DefaultFalsePositive
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// env is what a Backend is told: o with its defaults set.
func (o Options) env() tier.Env {
	parts, _ := tier.NewPartitions(o.Window, o.Partition)
	return tier.Env{Window: o.Window, Partitions: parts, MaxAttempts: o.MaxAttempts,
		NamespaceWindows: o.nsWindows(), NoSharedCache: o.NoSharedCache, Logger: o.logLogger(),
		ArchiveLog:   o.Archive != nil && !o.local(),
		ExpectedKeys: o.ExpectedKeys, FalsePositive: o.FalsePositive,
		FiltersOnly: o.Tiers == BloomOnly, Archived: o.Archive != nil}
}

// local reports whether the Backend is a store in this process
// (tier.LocalBackend: the embedded one) rather than a shared tier.
func (o *Options) local() bool {
	_, ok := o.Backend.(tier.LocalBackend)
	return ok && !tier.Nil(o.Backend)
}

// Name is the configuration's name: the Tiers', or memory+ the Backend's.
func (o *Options) Name() string {
	if o.Backend != nil && o.Tiers == Default {
		return "memory+" + o.Backend.Name()
	}
	return o.Tiers.String()
}

// Options returns the options the engine was opened with, every default
// filled in (WithDefaults), for integrations that must check what they
// rely on: an HTTP middleware refuses FailOpen, which would run a request
// twice. Namespaces is a copy; Backend, Archive, Clock and Logger are
// the engine's own.
func (e *Engine) Options() Options {
	o := e.opts
	o.Namespaces = maps.Clone(o.Namespaces)
	return o
}

// logLogger is Logger as the tiers take it: a *log.Logger whose lines go
// to Logger's handler at level Warn.
func (o Options) logLogger() *log.Logger {
	l := o.Logger
	if l == nil {
		l = slog.Default()
	}
	return slog.NewLogLogger(l.Handler(), slog.LevelWarn)
}
