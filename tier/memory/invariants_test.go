package memory

import (
	"math/rand/v2"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
)

// check verifies a stripe's structure: every indexed entry is reachable by
// its fingerprint, free entries are not indexed, the LRU holds exactly the
// committed entries, and the counters agree.
func (s *stripe) check(t *testing.T) {
	t.Helper()
	indexed := map[uint32]bool{}
	nClaims, nCommitted := 0, 0
	for slot, v := range s.slots {
		if v == 0 {
			continue
		}
		idx := uint32(v)
		if h := uint32(v >> 32); h != s.hash(s.entries[idx].fp) {
			t.Fatalf("slot %d holds hash %#x for entry %d, whose fingerprint hashes to %#x", slot, h, idx, s.hash(s.entries[idx].fp))
		}
		if indexed[idx] {
			t.Fatalf("entry %d indexed twice", idx)
		}
		indexed[idx] = true
		e := s.entries[idx]
		if _, got := s.findLocked(e.fp); got != idx {
			t.Fatalf("entry %d unreachable: find returns %d", idx, got)
		}
		switch e.state {
		case claimed, committing:
			nClaims++
		case committed, released:
			nCommitted++
		default:
			t.Fatalf("indexed entry %d is free", idx)
		}
	}
	for idx := s.freeList; idx != 0; idx = s.entries[idx].next {
		if indexed[idx] {
			t.Fatalf("entry %d is both free and indexed", idx)
		}
	}
	n := 0
	for idx := s.entries[0].next; idx != 0; idx = s.entries[idx].next {
		if st := s.entries[idx].state; st != committed && st != released {
			t.Fatalf("LRU holds entry %d in state %d", idx, s.entries[idx].state)
		}
		n++
	}
	if nClaims != s.claims || nCommitted != s.committed || n != nCommitted {
		t.Fatalf("counts: claims %d/%d committed %d/%d lru %d", nClaims, s.claims, nCommitted, s.committed, n)
	}
}

// TestStructureUnderEveryOperation runs every operation, Settle and Put
// included, on one small stripe, so that probing, backward-shift deletion,
// growth, eviction and free-list reuse interleave, and checks the structure
// after each step.
func TestStructureUnderEveryOperation(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tb := newTable(t, &Options{Capacity: 24, Stripes: 1, MaxAttempts: 3})
	s := &tb.stripes[0]
	var now int64
	tokens := map[int]uint64{}
	one1 := func(i int) ([]shard.Fingerprint, []uint64) {
		return []shard.Fingerprint{fp(i)}, []uint64{tokens[i]}
	}
	for op := range 100_000 {
		k := rng.IntN(60)
		now += int64(rng.IntN(3))
		f, tok := one1(k)
		switch rng.IntN(7) {
		case 0:
			tokens[k] = uint64(op + 1)
			f, tok = one1(k)
			tb.Acquire(f, tok, now, now+20, now+60, make([]Result, 1))
		case 1:
			tb.Begin(f, tok, now, make([]Status, 1))
		case 2:
			tb.Finish(f, tok, []bool{rng.IntN(2) == 0}, now+100, []Digest{d(1)})
		case 3:
			tb.Release(f, tok, now, now+40, rng.IntN(2) == 0, make([]Result, 1))
		case 4:
			tb.Settle(f, tok, []Action{Action(rng.IntN(4))}, []int64{now + 50}, []Digest{d(2)}, []uint16{uint16(rng.IntN(3))})
		case 5:
			tb.put(f, []int64{now + 80}, []Digest{d(3)})
		case 6:
			tokens[k] = uint64(op + 1)
			f, tok = one1(k)
			tb.Acquire(f, tok, now, now+20, now+60, make([]Result, 1))
			tb.Begin(f, tok, now, make([]Status, 1))
			tb.Finish(f, tok, []bool{true}, now+100, []Digest{d(4)})
		}
		s.mu.Lock()
		s.check(t)
		s.mu.Unlock()
	}
}
