package memory

import (
	"bytes"
	"encoding/binary"
	"sync"

	"github.com/tierdedup/tierdedup/shard"
)

// entry states.
const (
	free uint8 = iota
	claimed
	committing // a claim being made durable: pinned, cannot expire
	committed
	released // released claims' attempt count, kept (in the LRU) until until
)

func digestWords(d Digest) [2]uint64 {
	return [2]uint64{binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:])}
}

func wordsDigest(w [2]uint64) Digest {
	var d Digest
	binary.LittleEndian.PutUint64(d[:8], w[0])
	binary.LittleEndian.PutUint64(d[8:], w[1])
	return d
}

// entry is one key. Its size (56 B) is pinned by a test: it is most of the
// tier's memory. References between entries are indices into stripe.entries;
// index 0 is the LRU sentinel, so 0 also means "none".
type entry struct {
	fp shard.Fingerprint
	// word is the owner token of a claim (word[0]), or the full 128-bit
	// payload digest of a committed entry: digests are compared at full
	// width in every tier, so the same two digests get the same answer
	// from memory as from disk.
	word [2]uint64
	// until is the lease end of a claim, or the expiry of a committed entry,
	// in nanoseconds of the caller's clock.
	until int64
	// prev and next link committed entries in LRU order (sentinel.next is the
	// most recent) and free entries in a free list.
	prev, next uint32
	state      uint8
	// attempts counts the releases and lease expiries of the key's claims
	// since it was last free or committed.
	attempts uint16
}

// stripe is one lock domain: an open-addressing index over a slab of entries.
type stripe struct {
	mu sync.Mutex // protects every field below
	// slots is an open-addressing index over entries, with linear probing
	// and backward-shift deletion: each slot holds an entry index (low 32
	// bits, 0 empty) and the 32-bit hash of its fingerprint (high 32
	// bits), from which its home slot follows. A probe compares hashes in
	// the slots, which lie side by side, and reads an entry only where
	// the hash matches; moving and deleting read no entry at all.
	slots       []uint64
	entries     []entry // entries[0] is the LRU sentinel
	freeList    uint32
	limit       int // committed and released entries kept before evicting
	maxAttempts int // 0: releases free the entry and nothing is counted
	claims      int
	committed   int // entries in the LRU: committed and released
	seed        uint64
	// results holds the result committed with entry i (Options.Results),
	// deleted whenever entry i stops being that commit.
	results     map[uint32]stored
	keepResults bool
	_           [15]byte // pad to two cache lines: stripes sit side by side
}

// stored is a result kept with a committed entry.
type stored struct {
	data []byte
	at   int64
}

// eagerEntries is how many entries a whole table allocates before it is
// used: a small table, so an engine holding a few keys costs a few hundred
// KiB here, not what its capacity would cost full. Past it, memory follows
// use: the slab and the index grow by growFactor up to the capacity (a
// third of the rehashing that doubling costs), and a table that reaches
// its capacity holds no slack beyond it.
const eagerEntries = 1 << 12

// growFactor is how much the slab and the index grow at a time.
const growFactor = 4

func (s *stripe) init(limit, initial int, seed uint64) {
	s.limit, s.seed = limit, seed
	s.claims, s.committed, s.freeList = 0, 0, 0
	s.results = nil
	n := min(limit, initial)
	s.slots = make([]uint64, slotsFor(n))
	s.entries = make([]entry, 1, 1+n)
	if n == limit {
		// Room for the full slab (the limit and a few claims) without
		// growing the index.
		s.entries = make([]entry, 1, s.fullSlab())
		s.slots = make([]uint64, slotsFor(s.fullSlab()))
	}
}

// fullSlab is the slab size for the committed limit plus a few outstanding
// claims; more claims than that grow it further.
func (s *stripe) fullSlab() int { return 1 + s.limit + s.limit/32 + 8 }

// growSlabLocked makes room for one more entry: growFactor times larger up
// to the full slab, so a stripe that reaches its limit holds no slack
// beyond it (more claims than the slab holds grow it growFactor times
// past that).
func (s *stripe) growSlabLocked() {
	if len(s.entries) < cap(s.entries) {
		return
	}
	n := max(growFactor*cap(s.entries), 16)
	if full := s.fullSlab(); cap(s.entries) < full {
		n = min(n, full)
	}
	grown := make([]entry, len(s.entries), n)
	copy(grown, s.entries)
	s.entries = grown
}

// slotsFor returns how many slots hold n entries at a load of at most
// 0.75 (minimum 8). Any count works: a hash maps to its home slot by
// multiplication, not by a mask, so the index is sized to its entries,
// not to the next power of two (which would cost up to twice the slots).
func slotsFor(n int) int {
	return max(8, n+n/3+1)
}

// hash is the 32 bits of f that the index keeps in f's slot.
func (s *stripe) hash(f shard.Fingerprint) uint32 {
	return uint32(shard.Mix(f.Lo^f.Hi^s.seed) >> 32)
}

// homeOf is the home slot of a fingerprint whose hash is h.
func (s *stripe) homeOf(h uint32) uint32 {
	return uint32(uint64(h) * uint64(len(s.slots)) >> 32)
}

// nextSlot is the slot after slot, wrapping around.
func (s *stripe) nextSlot(slot uint32) uint32 {
	if slot++; int(slot) == len(s.slots) {
		return 0
	}
	return slot
}

// findLocked returns the slot and entry index of f, or the empty slot where f
// would go and entry 0.
func (s *stripe) findLocked(f shard.Fingerprint) (slot, idx uint32) {
	h := s.hash(f)
	for slot = s.homeOf(h); ; slot = s.nextSlot(slot) {
		v := s.slots[slot]
		if v == 0 {
			return slot, 0
		}
		if uint32(v>>32) == h && s.entries[uint32(v)].fp == f {
			return slot, uint32(v)
		}
	}
}

// insertLocked adds f at the empty slot found by findLocked and returns its
// entry index. It may grow the index, so slot is only valid until then.
func (s *stripe) insertLocked(slot uint32, f shard.Fingerprint) uint32 {
	var idx uint32
	if s.freeList != 0 {
		idx = s.freeList
		s.freeList = s.entries[idx].next
	} else {
		s.growSlabLocked()
		s.entries = append(s.entries, entry{})
		idx = uint32(len(s.entries) - 1)
	}
	s.entries[idx] = entry{fp: f}
	s.slots[slot] = uint64(s.hash(f))<<32 | uint64(idx)
	if used := s.claims + s.committed + 1; used*4 > len(s.slots)*3 {
		s.growLocked()
	}
	return idx
}

// growLocked grows the index growFactor times (doubling once it holds the
// full slab's entries: only outstanding claims grow it past that) and
// rehashes it.
func (s *stripe) growLocked() {
	old := s.slots
	n := len(old) * growFactor
	if full := slotsFor(s.fullSlab()); len(old) >= full {
		n = len(old) * 2
	} else {
		n = min(n, full) // above len(old): full is
	}
	s.slots = make([]uint64, n)
	for _, v := range old {
		if v == 0 {
			continue
		}
		slot := s.homeOf(uint32(v >> 32))
		for s.slots[slot] != 0 {
			slot = s.nextSlot(slot)
		}
		s.slots[slot] = v
	}
}

// removeLocked deletes the entry at slot, keeping every probe chain intact.
func (s *stripe) removeLocked(slot uint32) {
	idx := uint32(s.slots[slot])
	e := &s.entries[idx]
	switch e.state {
	case committed, released:
		s.unlinkLocked(idx)
		s.committed--
	case claimed, committing:
		s.claims--
	}
	s.dropResultLocked(idx)
	*e = entry{next: s.freeList}
	s.freeList = idx

	i := slot
	s.slots[i] = 0
	for j := s.nextSlot(i); s.slots[j] != 0; j = s.nextSlot(j) {
		k := s.homeOf(uint32(s.slots[j] >> 32))
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		s.slots[i], s.slots[j] = s.slots[j], 0
		i = j
	}
}

func (s *stripe) unlinkLocked(idx uint32) {
	e := &s.entries[idx]
	s.entries[e.prev].next = e.next
	s.entries[e.next].prev = e.prev
}

func (s *stripe) pushFrontLocked(idx uint32) {
	head := &s.entries[0]
	e := &s.entries[idx]
	e.prev, e.next = 0, head.next
	s.entries[head.next].prev = idx
	head.next = idx
}

// claimLocked turns entry idx (fresh, stale, released or an expired claim)
// into a claim; a released entry's attempts carry over.
func (s *stripe) claimLocked(idx uint32, token uint64, leaseUntil int64) {
	e := &s.entries[idx]
	switch e.state {
	case committed:
		e.attempts = 0
		s.dropResultLocked(idx)
		fallthrough
	case released:
		s.unlinkLocked(idx)
		s.committed--
	}
	if e.state != claimed && e.state != committing {
		s.claims++
	}
	e.state, e.word, e.until = claimed, [2]uint64{token}, leaseUntil
}

// commitLocked turns entry idx into a committed entry, evicting the least
// recently used committed entries beyond the limit.
func (s *stripe) commitLocked(idx uint32, expires int64, digest Digest) {
	s.commitKeepLocked(idx, expires, digest)
	s.evictLocked()
}

// evictLocked removes the least recently used committed entries beyond
// the limit.
func (s *stripe) evictLocked() {
	for s.committed > s.limit {
		tail := s.entries[0].prev
		s.removeLocked(s.slotOfLocked(tail))
	}
}

// commitKeepLocked is commitLocked without the eviction: the committed
// entries may exceed the limit until the caller evicts (evictLocked).
// With no committed entries kept at all (limit 0) the entry is removed.
func (s *stripe) commitKeepLocked(idx uint32, expires int64, digest Digest) {
	if s.limit == 0 {
		s.removeLocked(s.slotOfLocked(idx))
		return
	}
	s.dropResultLocked(idx)
	e := &s.entries[idx]
	switch e.state {
	case committed, released:
		s.unlinkLocked(idx)
	case claimed, committing:
		s.claims--
		s.committed++
	default:
		s.committed++
	}
	e.state, e.word, e.until, e.attempts = committed, digestWords(digest), expires, 0
	s.pushFrontLocked(idx)
}

// dropResultLocked forgets the result entry idx kept, if any.
func (s *stripe) dropResultLocked(idx uint32) {
	if s.results != nil {
		delete(s.results, idx)
	}
}

// resultLocked returns a copy of the result entry idx keeps.
func (s *stripe) resultLocked(idx uint32) ([]byte, int64) {
	if s.results == nil {
		return nil, 0
	}
	r, ok := s.results[idx]
	if !ok {
		return nil, 0
	}
	return bytes.Clone(r.data), r.at
}

func (s *stripe) slotOfLocked(idx uint32) uint32 {
	slot, _ := s.findLocked(s.entries[idx].fp)
	return slot
}

// releaseToLRULocked turns claim idx into a released entry that remembers
// its attempts until keepUntil, evicting beyond the limit.
func (s *stripe) releaseToLRULocked(idx uint32, keepUntil int64) {
	s.releaseKeepLocked(idx, keepUntil)
	s.evictLocked()
}

// releaseKeepLocked is releaseToLRULocked without the eviction (Mark
// evicts once its stripe's keys are all answered).
func (s *stripe) releaseKeepLocked(idx uint32, keepUntil int64) {
	e := &s.entries[idx]
	s.claims--
	s.committed++
	e.state, e.word, e.until = released, [2]uint64{}, keepUntil
	s.pushFrontLocked(idx)
}
