package embedded

import "errors"

// Errors of the handoff; the engine's sentinels of the same names are
// these values. Every other error of this package matches one of package
// tier's (tier.ErrOptions, tier.ErrLayout, tier.ErrLocked, tier.ErrStorage).
var (
	// ErrNoExport reports a directory that holds no export.
	ErrNoExport = errors.New("tierdedup: no export")
	// ErrExport reports an export that must not be imported: a damaged
	// manifest, a file missing or of another size or content than the
	// manifest says.
	ErrExport = errors.New("tierdedup: invalid export")
	// ErrStaleExport reports an export not newer than the state it would
	// replace.
	ErrStaleExport = errors.New("tierdedup: export not newer than the state it would replace")
)
