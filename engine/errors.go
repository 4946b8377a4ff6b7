package engine

import (
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Errors returned by the engine; match them with errors.Is. ErrOptions,
// ErrStorage, ErrLocked, ErrUnavailable and ErrLayout are package tier's, so a tier's
// errors match them too.
var (
	// ErrOptions reports invalid Options.
	ErrOptions = tier.ErrOptions
	// ErrEmptyKey reports a zero-length key.
	ErrEmptyKey = errors.New("tierdedup: empty key")
	// ErrKeyTooLong reports a key longer than Options.MaxKeySize.
	ErrKeyTooLong = errors.New("tierdedup: key too long")
	// ErrNamespace reports a namespace name longer than MaxNamespace bytes.
	ErrNamespace = errors.New("tierdedup: invalid namespace")
	// ErrLeaseLost reports a Commit or Release by a claim that no longer
	// owns its key: its lease expired, another worker took it over, or it
	// was already committed or released. Nothing was changed.
	ErrLeaseLost = errors.New("tierdedup: claim lease lost")
	// ErrNotClaimed reports a Commit or Release of a Claim whose Outcome is
	// not New: there is nothing to commit.
	ErrNotClaimed = errors.New("tierdedup: not a claim")
	// ErrStorage reports a failure of the durable tier: a write, sync or
	// read error, or a corrupt record. Read and write failures alike latch:
	// the engine answers ErrStorage for every later claim and commit (fail
	// closed), because a store that cannot be read cannot say New. The
	// consumer must not ack. A failed embedded store cannot be closed and
	// reopened in the same process (Pebble's commit pipeline may be stuck;
	// its directory stays held until the process exits): restart the
	// process once the cause is fixed; nothing acknowledged is lost.
	ErrStorage = tier.ErrStorage
	// ErrUnavailable reports the shared tier (Redis or PostgreSQL) or the
	// archive unreachable, or slower than the caller's deadline; or, in
	// the embedded store with an archive, a write into a partition that
	// the clock moved out of the window while the call ran, refused
	// because the archive is taking it. It is transient: do not ack, retry
	// later. With Options.FailOpen the engine answers
	// instead for the calls FailOpen covers, and counts it.
	ErrUnavailable = tier.ErrUnavailable
	// ErrLocked reports a Dir that another engine holds.
	ErrLocked = tier.ErrLocked
	// ErrClosed reports a call on a closed Engine.
	ErrClosed = errors.New("tierdedup: engine closed")
	// ErrLayout reports a Dir whose recorded layout (partition length,
	// window, configuration, format version, Bloom parameters of
	// bloom-only state) differs from the Options: opening it would
	// misjudge or lose acknowledged keys. The message names the field and
	// both values. Nothing was changed.
	ErrLayout = tier.ErrLayout
	// ErrTokenUnknown reports a token that was never issued here (or not
	// within the window).
	ErrTokenUnknown = errors.New("tierdedup: unknown token")
	// ErrTokenExpired reports a token whose ttl has passed.
	ErrTokenExpired = errors.New("tierdedup: token expired")
	// ErrTokenUsed reports a token already consumed.
	ErrTokenUsed = errors.New("tierdedup: token already used")
	// ErrVersion reports a version of 0 given to Advance: versions start
	// at 1.
	ErrVersion = errors.New("tierdedup: invalid version")
	// ErrInFlight reports a Forget of a key that a claim holds (it was
	// left as it is), or a ConsumeToken whose use another call holds now:
	// nothing was decided, retry.
	ErrInFlight = errors.New("tierdedup: key is claimed")
	// ErrResultTooLarge reports a claim whose Result is longer than
	// Options.MaxResultSize. Nothing of the call was written.
	ErrResultTooLarge = errors.New("tierdedup: result too large")
	// ErrBatch reports batch arguments of mismatched lengths.
	ErrBatch = errors.New("tierdedup: mismatched batch arguments")
	// ErrNoExport reports a directory that holds no export.
	ErrNoExport = tier.ErrNoExport
	// ErrExport reports an export that must not be imported: a damaged
	// manifest, or a file missing or differing from it. Nothing was
	// imported.
	ErrExport = tier.ErrExport
	// ErrStaleExport reports an export not newer than the state it would
	// replace. Nothing was imported.
	ErrStaleExport = tier.ErrStaleExport
)

// KeyError names the key of a batch that was rejected; it wraps ErrEmptyKey
// or ErrKeyTooLong.
type KeyError struct {
	Index int
	Len   int
	Err   error
}

// Error names the rejected key.
func (e *KeyError) Error() string {
	return fmt.Sprintf("%v: key %d (%d bytes)", e.Err, e.Index, e.Len)
}

// Unwrap returns ErrEmptyKey or ErrKeyTooLong.
func (e *KeyError) Unwrap() error { return e.Err }
