package embedded

import (
	"context"
	"errors"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/shard"
)

// rebuild refills the Bloom filters from Pebble after an unclean shutdown,
// scanning the partitions of each span [from, to) (those without a sealed
// filter). Commits made meanwhile add to the filters themselves, and
// records written before the scan began are all visible to it, so when it
// ends the filters cover the store and become warm.
func (s *Store) rebuild(ctx context.Context, spans [][2]int64) {
	defer s.workers.Done()
	defer s.rebuilding.Store(false)
	if gate := hooks.RebuildGate.Load(); gate != nil {
		select {
		case <-*gate:
		case <-ctx.Done():
			return
		}
	}
	const chunk = 256
	fps := make([]shard.Fingerprint, 0, chunk)
	var part int64 = -1 << 63
	flush := func() {
		if len(fps) > 0 {
			s.bloom.Add(fps, part)
			s.rebuilt.Add(uint64(len(fps)))
			fps = fps[:0]
		}
	}
	var err error
	for _, span := range spans {
		err = s.store.Scan(ctx, span[0], span[1], func(p int64, ns, key []byte) error {
			if p != part || len(fps) == chunk {
				flush()
				part = p
			}
			fps = append(fps, shard.Sum(s.hasher, ns, key))
			return nil
		})
		flush()
		if err != nil {
			break
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Printf("tierdedup: bloom rebuild failed, staying on Pebble reads: %v", err)
		}
		return
	}
	s.warm.Store(true)
	s.cold.Store(nil)
	s.sealWakeup()
	s.checkpointWakeup() // so the next crash does not scan again
}

func isNotExist(err error) bool { return errors.Is(err, errNoSnapshot) }
