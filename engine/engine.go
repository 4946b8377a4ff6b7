package engine

import (
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// Engine answers claims for keys in one or more namespaces. It is safe for
// concurrent use.
type Engine struct {
	tiers  Tiers
	name   string // the configuration's name (Options.Name)
	window int64  // nanoseconds
	// cacheFor is how long memory keeps the engine's own commits: the window,
	// or, when a shared tier's server clock expires them, half of it, so a
	// process clock behind the server's by less than that cannot make memory
	// outlive the tier's record.
	cacheFor  int64
	lease     int64
	maxKey    int
	maxResult int
	// results: the tiers store a commit's result (memory-only, or an exact
	// tier that keeps them); a commit with one is refused otherwise.
	results     bool
	maxAttempts int
	// opts are the options Open was given, defaults filled in (Options).
	opts Options
	// durableClaims: every New claim's attempt is written before it is
	// answered (Options.DurableClaims, with claims in the engine).
	durableClaims bool
	parts         tier.Partitions
	clock         Clock
	logger        *log.Logger
	secret        shard.Secret // keys the fingerprints; persisted by Default and BloomOnly
	hasher        shard.Hasher // of secret
	mem           *memory.Table
	// local is the store the engine opened in its process (a
	// tier.LocalBackend: the embedded default, Pebble behind the Bloom
	// filters, or bloom-only's filters); nil otherwise. It owns the
	// filters' lifecycle (warm, rebuilding, sealed). archSrc and handoff
	// are its optional interfaces (nil when it has none).
	local   tier.Local
	archSrc tier.ArchiveSource
	handoff tier.Handoff
	// exact is the exact tier, nil when there is none (MemoryOnly,
	// BloomOnly); where says where its claims live, and the optional
	// interfaces it implements are kept beside it (nil when it does not).
	exact   tier.Exact
	where   tier.Where
	writer  tier.CommitWriter
	dropper tier.Dropper
	latch   tier.Latching
	marker  tier.Marker
	// logMarks: behind the archive, the exact tier marks keys of archived
	// namespaces in one step, logged and bound by Request.LogBy
	// (tier.LogMarker); the engine reads the archive first (archiveBeforeMark).
	logMarks bool
	// extender extends leases in the shared tier (nil: none, or claims
	// live in memory).
	extender tier.Extender
	// looker reads a shared tier without claiming; forgetter removes keys
	// from the exact tier (nil when it cannot).
	looker    tier.Looker
	forgetter tier.Forgetter
	advancer  tier.Advancer // compares versions in the shared tier
	// arch keeps the history behind the window (Options.Archive); nil
	// without one.
	arch             tier.Archiver
	archiveWindow    time.Duration
	nsArchiveWindows map[string]time.Duration
	// nsWindows are the namespaces' own windows (NamespaceOptions.Window).
	nsWindows map[string]int64
	// noSharedCache: memory keeps no commits of a shared tier
	// (Options.NoSharedCache), so a Forget reaches every process.
	noSharedCache bool
	process       [8]byte      // random; with a claim's counter, its owner token in a shared tier
	retries       retries      // claims in a shared tier whose reply was lost, for their retries
	queue         *commitQueue // the group commit; nil without an exact tier

	highWater atomic.Int64 // highest clock reading seen, Unix ns
	current   atomic.Int64 // current partition
	openedAt  int64        // first clock reading, for Stats.Coverage
	rotateMu  sync.Mutex   // serialises rotation
	// counts orders attempt counts against commits and Forgets where the
	// engine keeps them in its exact tier (ClaimsInEngine with
	// MaxAttempts). A release frees its claim in memory before its count
	// is durable, so another claim may take the key meanwhile: the release
	// write-holds counts across that gap, and commits (their durable
	// write), Forgets (fence to delete) and claims (their read of the
	// exact tier) read-hold it. So no count lands after a later commit of
	// its key (and erases it), nor after a Forget read the key (and brings
	// back what it reported removing), and no claim reads the count the
	// released claim left instead of the one its release writes.
	counts sync.RWMutex
	tokens atomic.Uint64

	life struct {
		sync.RWMutex // read-held by every call; write-held by Close
		closed       bool
	}
	scratch sync.Pool // *batch
	stats   counters
	// forgotten are the keys Forget removed lately, which the filters
	// still hold: not false positives when read again.
	forgotten forgottenKeys
	def       Namespace
}
