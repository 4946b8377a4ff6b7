package engine

import (
	"context"
	"fmt"
)

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
