package embedded

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Compact flushes and compacts the Pebble store now, so that dropped
// partitions leave the disk and its size reflects compacted data; for
// maintenance windows and capacity measurements. It can take minutes on a
// large store; writes proceed meanwhile. When ctx ends first, Compact
// returns ctx's error at once and the compaction runs on; Close waits for
// it. Other errors match tier.ErrStorage; BloomOnly has nothing to compact
// (tier.ErrOptions).
func (s *Store) Compact(ctx context.Context) error {
	if s.store == nil {
		return fmt.Errorf("%w: bloom-only state has no store to compact", tier.ErrOptions)
	}
	if err := s.store.Compact(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return err
		}
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}
