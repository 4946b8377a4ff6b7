package pebble

import (
	"errors"
	"fmt"
	"log"

	"github.com/cockroachdb/pebble/v2"
)

// fatal is what the Logger's Fatalf panics with, so that a Pebble fatal
// error inside a foreground call can be recovered into ErrStorage instead of
// exiting the process.
type fatal struct{ msg string }

// Error is the message, so that a fatal error outside any call (Pebble's
// own background work), which ends the process, says what it was.
func (f fatal) Error() string { return "pebble fatal error: " + f.msg }

type logger struct {
	l *log.Logger
}

func (logger) Infof(string, ...any) {}
func (l logger) Errorf(format string, args ...any) {
	l.l.Printf("tierdedup/pebble: "+format, args...)
}

// events reports Pebble's background errors to the Logger, except a
// compaction or flush that a concurrent operation cancelled and Pebble
// retries (an Excise of a moved partition cancels those that overlap it):
// that is routine, and a line saying "background error" once a day would
// send operators looking for a fault that is not there.
func (l logger) events() *pebble.EventListener {
	return &pebble.EventListener{BackgroundError: func(err error) {
		if errors.Is(err, pebble.ErrCancelledCompaction) {
			return
		}
		l.Errorf("background error: %s", err)
	}}
}

func (l logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.l.Printf("tierdedup/pebble: fatal: %s", msg)
	panic(fatal{msg})
}

// guard converts a panic inside a Pebble call (its Fatalf, or a panic such
// as a failed WAL rotation's) into ErrStorage and marks the store broken:
// the process keeps running and fails closed instead of exiting.
func (s *Store) guard(err *error) {
	if r := recover(); r != nil {
		*err = s.fail(panicError(r))
	}
}

func panicError(r any) error {
	switch v := r.(type) {
	case fatal:
		return errors.New(v.msg)
	case error:
		return fmt.Errorf("pebble panicked: %w", v)
	default:
		return fmt.Errorf("pebble panicked: %v", v)
	}
}

func (s *Store) fail(err error) error {
	wrapped := fmt.Errorf("%w: %w", ErrStorage, err)
	s.broken.CompareAndSwap(nil, &wrapped)
	return wrapped
}

func (s *Store) usable() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// Broken returns the first storage failure (read or write), or nil.
func (s *Store) Broken() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}
