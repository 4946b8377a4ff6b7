package embedded

import (
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Masks sets probes[j].Maybe to the live partitions the store may hold the
// key of fps[j] in, and returns the partition the masks count from and
// whether a zero mask proves the key absent (the package's invariant 1:
// the filters answer "no" only while warm).
//
// Warm filters answer alone. While a rebuild refills some partitions'
// filters (cold), the complete filters answer for the other partitions and
// every cold one is named, so every key is read there; nothing is proved
// absent. With no filter known complete, every live partition is named.
func (s *Store) Masks(fps []shard.Fingerprint, probes []bloom.Probe) (oldest int64, proves bool) {
	probes = probes[:len(fps)]
	warm := s.warm.Load()
	cold := s.cold.Load()
	switch {
	case warm:
		return s.bloom.Test(fps, probes), true
	case cold != nil:
		oldest = s.bloom.Test(fps, probes)
		var force uint64
		for _, p := range *cold {
			if d := p - oldest; d >= 0 && d < int64(s.parts.Live) {
				force |= 1 << d
			}
		}
		for j := range probes {
			probes[j].Maybe |= force
		}
		return oldest, false
	}
	return AllLive(s.parts, s.current.Load(), probes), false
}

// AllLive sets every probe to name every live partition when current is
// the newest, and returns the oldest (tier.AllLive).
func AllLive(parts tier.Partitions, current int64, probes []bloom.Probe) (oldest int64) {
	return tier.AllLive(parts, current, probes)
}

// Add records keys about to be written in partition p, before the write:
// the filters must have seen every key the store holds.
func (s *Store) Add(fps []shard.Fingerprint, p int64) {
	s.bloom.Add(fps, p)
	s.noteAdded(len(fps))
}

// Enter marks a write about to read the engine's time; Exit, with Enter's
// result, marks it written (see writeGate).
func (s *Store) Enter() int { return s.gate.enter() }

// Exit ends a write begun by Enter.
func (s *Store) Exit(slot int) { s.gate.exit(slot) }

// Sealed reports whether partition p's filter is saved with a seal the
// store holds. A closed partition not
// sealed yet wakes the sealer, so one that missed its wake (the filters
// were rebuilding when it closed) is sealed without waiting for the next
// rotation.
func (s *Store) Sealed(p int64) bool {
	sealed := s.isSealed(p)
	if !sealed && p < s.current.Load() && s.sealWake != nil {
		s.sealWakeup()
	}
	return sealed
}

// Observe counts the probes of keys the store found absent, while the
// filters are warm (their masks are their own answers then); see
// bloom.Filters.Observe.
func (s *Store) Observe(oldest int64, absent int, maybes []uint64) []bloom.PartitionStats {
	if !s.warm.Load() {
		return nil
	}
	return s.bloom.Observe(oldest, absent, maybes)
}

// Overfilled reports partition p's filter once its keys put the formula's
// rate over twice its target; see bloom.Filters.Overfilled.
func (s *Store) Overfilled(p int64) (bloom.PartitionStats, bool) { return s.bloom.Overfilled(p) }

// Partitions returns the live filters' figures, oldest first.
func (s *Store) Partitions() []bloom.PartitionStats { return s.bloom.Partitions() }
