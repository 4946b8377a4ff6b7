package embedded

import (
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Compact flushes and compacts the Pebble store now, so that dropped
// partitions leave the disk and its size reflects compacted data; for
// maintenance windows and capacity measurements. It can take minutes on a
// large store; writes proceed meanwhile. Errors match tier.ErrStorage;
// BloomOnly has nothing to compact (tier.ErrOptions).
func (s *Store) Compact(ctx context.Context) error {
	if s.store == nil {
		return fmt.Errorf("%w: bloom-only state has no store to compact", tier.ErrOptions)
	}
	if err := s.store.Compact(ctx); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}
