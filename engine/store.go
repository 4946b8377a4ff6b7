package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier/pebble"
)

// needStore reports ErrOptions for an operation of the embedded store in a
// configuration without one.
func (e *Engine) needStore(op string) error {
	if e.store == nil {
		return fmt.Errorf("%w: %s needs the embedded store (Tiers: Default), have %v", ErrOptions, op, e.tiers)
	}
	return nil
}

// withStore runs fn on the embedded store unless the engine is closed.
func (e *Engine) withStore(op string, fn func(*pebble.Store) error) error {
	if err := e.needStore(op); err != nil {
		return err
	}
	e.life.RLock()
	defer e.life.RUnlock()
	if e.life.closed {
		return ErrClosed
	}
	return fn(e.store)
}

// Compact flushes and compacts the embedded store now (Default only), so
// that dropped partitions leave the disk and its size reflects compacted
// data; for maintenance windows and capacity measurements. It can take
// minutes on a large store; calls proceed meanwhile.
func (e *Engine) Compact(ctx context.Context) error {
	return e.withStore("Compact", func(s *pebble.Store) error {
		if err := s.Compact(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return nil
	})
}

// ScanWrites calls fn for each record written by CommitBatchWith whose key
// starts with prefix, in key order; key and value are valid only during the
// call. A read failure is ErrStorage and latches, as for claims.
func (e *Engine) ScanWrites(prefix []byte, fn func(key, value []byte) error) error {
	return e.withStore("ScanWrites", func(s *pebble.Store) error {
		err := s.ScanUser(prefix, fn)
		if errors.Is(err, pebble.ErrStorage) {
			e.stats.errors.Add(1)
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return err
	})
}
