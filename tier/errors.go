package tier

import (
	"errors"
	"fmt"
)

// Errors the tiers and the engine share; the engine's sentinels of the
// same names are these values, so errors.Is matches either. Every other
// error of a tier is its own.
var (
	// ErrOptions reports settings a tier (or the engine) refuses.
	ErrOptions = errors.New("tierdedup: invalid options")
	// ErrLayout reports state that other settings created: a directory,
	// a Redis prefix or a table recorded with another partition length,
	// window, secret, MaxAttempts, namespace windows or caching. Processes
	// (and restarts) that share it must agree.
	ErrLayout = errors.New("tierdedup: store layout differs from options")
	// ErrStorage reports a failure of a durable tier's storage: a write,
	// sync or read that failed.
	ErrStorage = errors.New("tierdedup: storage failure")
	// ErrLocked reports a directory that another engine holds.
	ErrLocked = errors.New("tierdedup: directory in use")
	// ErrUnavailable reports a shared tier or an archive unreachable, or
	// slower than the caller's deadline, or (the embedded store) a write
	// into a partition the clock left behind while the call ran:
	// transient, nothing is known (or, for the last, nothing written).
	ErrUnavailable = errors.New("tierdedup: tier or archive unavailable")
)

// Classify wraps a backend's error so the engine can tell a caller's
// mistake from an outage: with ErrOptions when it matches one of options,
// with ErrLayout when it matches layout; any other error is returned as it
// is (nil stays nil).
func Classify(err error, layout error, options ...error) error {
	if err == nil {
		return nil
	}
	for _, o := range options {
		if errors.Is(err, o) {
			return fmt.Errorf("%w: %w", ErrOptions, err)
		}
	}
	if errors.Is(err, layout) {
		return fmt.Errorf("%w: %w", ErrLayout, err)
	}
	return err
}
