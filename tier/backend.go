package tier

import (
	"context"
	"log"
	"reflect"
	"time"
)

// Backend is an exact tier the engine has not opened yet: the caller builds
// it in the tier's own package from what only the caller knows (a client, a
// prefix, a table), and the engine opens it with what only the engine
// knows (Env). So the engine names no backend, and a program links only
// the clients of the backends it builds.
//
// A Backend is a description, not a connection: Open may be called once per
// engine that uses it, and Name, Claims and Validate never reach a server.
//
// Adding a backend means implementing Exact (and the optional interfaces
// it can offer) and Backend in the tier's own package, and passing the
// tiertest contract suite; the engine needs no change.
type Backend interface {
	// Name names the tier in the engine's configuration name
	// ("memory+" + Name), in Stats and in reports: "redis", "postgres".
	Name() string
	// Claims says where the opened tier's claims live. A backend whose
	// claims live in it (ClaimsInStore) is shared by every process that
	// opens it with the same settings.
	Claims() Where
	// Validate reports every setting the backend refuses at once, its own
	// and those of env it cannot keep (a backend without namespace windows
	// refuses env.NamespaceWindows); each error matches ErrOptions. Open
	// validates too.
	Validate(env Env) error
	// Open connects, checks or records the layout the Env implies, and
	// returns the tier. Its errors wrap ErrOptions, ErrLayout or, for an
	// unreachable or failing server, the backend's own unavailability
	// error. ctx bounds the opening only.
	Open(ctx context.Context, env Env) (Exact, error)
}

// Env is what the engine tells a Backend when it opens it: the settings
// every tier of one engine must share.
type Env struct {
	// Window is how long a committed key stays a duplicate; Partitions
	// cuts it into retention partitions (a tier that expires keys itself
	// may ignore them).
	Window     time.Duration
	Partitions Partitions
	// MaxAttempts, when positive, makes the tier count each key's released
	// and expired claims and answer Poisoned at that count (zero: none).
	MaxAttempts int
	// NamespaceWindows are the namespaces' own windows, shorter than
	// Window: a tier that expires keys itself sets a commit's life from
	// them. A backend that cannot keep them refuses them (ErrOptions).
	NamespaceWindows map[string]time.Duration
	// NoSharedCache says no process caches the tier's commits in memory
	// (Forget needs it); a shared tier records it in its layout, so every
	// process sharing the tier agrees.
	NoSharedCache bool
	// ArchiveLog asks the tier to keep an ArchiveLog: the engine archives
	// its commits through it. A shared tier records it in its layout, so
	// no process sharing the tier commits without appending; a backend
	// that cannot keep one refuses it (ErrOptions).
	ArchiveLog bool
	// Logger receives the tier's warnings; never nil.
	Logger *log.Logger

	// The rest is for a LocalBackend only; a shared tier ignores it.

	// Now is the engine's clock reading (Unix ns), 0 when its clock reads
	// outside the range it takes as time: the store then starts from the
	// reading it recorded, or refuses (ErrNoClock).
	Now int64
	// ExpectedKeys and FalsePositive size the Bloom filters: keys a
	// partition, and the false-positive target over the whole window.
	ExpectedKeys  int
	FalsePositive float64
	// FiltersOnly opens the filters alone, as the only tier (bloom-only).
	FiltersOnly bool
	// Archived says the engine moves closed partitions to an archive: the
	// store drops none that the archive does not hold yet.
	Archived bool
}

// Nil reports whether v is nil or an interface value holding a nil
// pointer, map, slice, function or channel: a client variable left nil
// (a *redis.Client, a *pgxpool.Pool) is not a nil interface, and a
// Backend's Validate refuses it rather than letting Open panic on it.
func Nil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
