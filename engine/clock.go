package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Clock readings the engine takes as time. UnixNano is defined only from
// 1678 to 2262, and engine time plus a lease, a window or a partition (each
// at most MaxWindow) must stay inside an int64.
var (
	minClock = time.Unix(0, 0)
	maxClock = time.Unix(0, math.MaxInt64-3*int64(MaxWindow))
)

// reading returns the clock in Unix nanoseconds, or 0 for a reading outside
// [1970, maxClock]: such a reading is no progress (the high-water clock
// stands), never a jump that would drop partitions or overflow a lease.
func (e *Engine) reading() int64 {
	t := e.clock.Now()
	if t.Before(minClock) || t.After(maxClock) {
		return 0
	}
	return t.UnixNano()
}

// now returns the engine's time: the highest clock reading seen, so it never
// runs backwards. It rotates partitions when a new one begins.
func (e *Engine) now() (int64, error) {
	t := e.reading()
	for {
		hw := e.highWater.Load()
		if t <= hw {
			t = hw
			break
		}
		if e.highWater.CompareAndSwap(hw, t) {
			break
		}
	}
	if p := e.parts.Of(t); p > e.current.Load() {
		if err := e.rotate(p, t); err != nil {
			return 0, err
		}
	}
	return t, nil
}

// rotate makes p the current partition. The embedded store decides what
// it drops (tier.Filters.Rotate); a shared tier is told the window moved
// (tier.Dropper: PostgreSQL sweeps its expired rows).
func (e *Engine) rotate(p, t int64) error {
	e.rotateMu.Lock()
	defer e.rotateMu.Unlock()
	if p <= e.current.Load() {
		return nil
	}
	// The clock as read under the lock, not t: the recorded clock must
	// never move back (a partition is sealed only before it).
	hw := max(t, e.highWater.Load())
	var err error
	if e.local != nil {
		var dropped int
		dropped, err = e.local.Rotate(p, hw)
		e.stats.partitionsDropped.Add(uint64(dropped))
	} else if e.dropper != nil {
		err = e.dropper.Drop(e.parts.Oldest(p), hw)
	}
	if err != nil {
		e.stats.errors.Add(1)
		if !errors.Is(err, ErrStorage) {
			err = fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return err
	}
	e.current.Store(p)
	if e.arch != nil {
		e.arch.Poke()
	}
	return nil
}
