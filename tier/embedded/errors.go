package embedded

import (
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Errors of the handoff (package tier's, which the engine's sentinels of
// the same names are). Every other error of this package matches one of
// package tier's (tier.ErrOptions, tier.ErrLayout, tier.ErrLocked,
// tier.ErrStorage, tier.ErrNoClock).
var (
	// ErrNoExport reports a directory that holds no export.
	ErrNoExport = tier.ErrNoExport
	// ErrExport reports an export that must not be imported: a damaged
	// manifest, a file missing or of another size or content than the
	// manifest says.
	ErrExport = tier.ErrExport
	// ErrStaleExport reports an export not newer than the state it would
	// replace.
	ErrStaleExport = tier.ErrStaleExport
	// ErrNoClock reports an Options.Now that is not a clock reading, with
	// no clock recorded in the directory to stand on; it matches
	// tier.ErrOptions.
	ErrNoClock = tier.ErrNoClock
)

// storageErr wraps err in tier.ErrStorage unless it matches it already.
func storageErr(err error) error {
	if errors.Is(err, tier.ErrStorage) {
		return err
	}
	return fmt.Errorf("%w: %w", tier.ErrStorage, err)
}
