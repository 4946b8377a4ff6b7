package engine

import (
	"context"
	"errors"

	"github.com/tierdedup/tierdedup/shard"
)

// rebuild refills the Bloom filters from Pebble after an unclean shutdown,
// scanning the partitions of each span [from, to) (those without a sealed
// filter). Commits made meanwhile add to the filters themselves, and
// records written before the scan began are all visible to it, so when it
// ends the filters cover the store and become warm.
func (e *Engine) rebuild(ctx context.Context, spans [][2]int64) {
	defer e.workers.Done()
	defer e.rebuilding.Store(false)
	if gate := rebuildGate.Load(); gate != nil {
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
			e.bloom.Add(fps, part)
			e.stats.rebuilt.Add(uint64(len(fps)))
			fps = fps[:0]
		}
	}
	var err error
	for _, s := range spans {
		err = e.scanner.Scan(ctx, s[0], s[1], func(p int64, ns, key []byte) error {
			if p != part || len(fps) == chunk {
				flush()
				part = p
			}
			fps = append(fps, shard.Sum(e.hasher, ns, key))
			return nil
		})
		flush()
		if err != nil {
			break
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			e.logger.Printf("tierdedup: bloom rebuild failed, staying on Pebble reads: %v", err)
		}
		return
	}
	e.warm.Store(true)
	e.cold.Store(nil)
	e.sealWakeup()
}

func isNotExist(err error) bool { return errors.Is(err, errNoSnapshot) }
