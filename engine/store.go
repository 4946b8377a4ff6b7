package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier/pebble"
)

// need reports ErrOptions for an operation the configuration's tiers do not
// offer (have is false).
func (e *Engine) need(have bool, op, what string) error {
	if !have {
		return fmt.Errorf("%w: %s needs %s (Tiers: Default), have %v", ErrOptions, op, what, e.tiers)
	}
	return nil
}

// unlessClosed runs fn unless the engine is closed.
func (e *Engine) unlessClosed(fn func() error) error {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.life.closed {
		return ErrClosed
	}
	return fn()
}

// Compact flushes and compacts the embedded store now (Default only), so
// that dropped partitions leave the disk and its size reflects compacted
// data; for maintenance windows and capacity measurements. It can take
// minutes on a large store; calls proceed meanwhile.
func (e *Engine) Compact(ctx context.Context) error {
	if err := e.need(e.store != nil, "Compact", "the embedded store"); err != nil {
		return err
	}
	return e.unlessClosed(func() error {
		if err := e.store.Compact(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return nil
	})
}

// ScanWrites calls fn for each record written by CommitBatchWith whose key
// starts with prefix, in key order; key and value are valid only during the
// call. A read failure is ErrStorage and latches, as for claims.
func (e *Engine) ScanWrites(prefix []byte, fn func(key, value []byte) error) error {
	if err := e.need(e.writer != nil, "ScanWrites", "a tier that writes with commits"); err != nil {
		return err
	}
	return e.unlessClosed(func() error {
		err := e.writer.ScanWrites(prefix, fn)
		if errors.Is(err, pebble.ErrStorage) {
			e.stats.errors.Add(1)
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return err
	})
}
