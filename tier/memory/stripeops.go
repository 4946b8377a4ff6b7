package memory

import (
	"bytes"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

func (s *stripe) acquireLocked(f shard.Fingerprint, token uint64, now, leaseUntil, keepUntil int64) Result {
	r, _ := s.acquireIdxLocked(f, token, now, leaseUntil, keepUntil, true)
	return r
}

// acquireIdxLocked is acquireLocked, also returning the entry index of a
// claim it installed. Without evict, a claim whose expired lease poisons
// the key keeps its attempt count without evicting anything: the caller
// evicts (Mark, once its stripe's keys are all answered).
func (s *stripe) acquireIdxLocked(f shard.Fingerprint, token uint64, now, leaseUntil, keepUntil int64, evict bool) (Result, uint32) {
	slot, idx := s.findLocked(f)
	if idx == 0 {
		idx = s.insertLocked(slot, f)
		s.claimLocked(idx, token, leaseUntil)
		return Result{Status: tier.Acquired}, idx
	}
	e := &s.entries[idx]
	switch e.state {
	case committing:
		return Result{Status: tier.Held}, 0
	case claimed:
		if e.until > now {
			return Result{Status: tier.Held}, 0
		}
		// The holder let its lease run out (it crashed, or its handler
		// hangs on this message): that is an attempt too, remembered as
		// long as a release's.
		if s.maxAttempts > 0 {
			e.attempts++
			if int(e.attempts) >= s.maxAttempts {
				a := e.attempts
				s.releaseKeepLocked(idx, keepUntil)
				if evict {
					s.evictLocked()
				}
				return Result{Status: tier.Poisoned, Attempts: a, Expired: true}, 0
			}
		}
		s.claimLocked(idx, token, leaseUntil)
		return Result{Status: tier.TakenOver, Attempts: e.attempts, Expired: s.maxAttempts > 0}, idx
	case released:
		if e.until <= now {
			e.attempts = 0
		} else if int(e.attempts) >= s.maxAttempts {
			s.unlinkLocked(idx)
			s.pushFrontLocked(idx)
			return Result{Status: tier.Poisoned, Attempts: e.attempts}, 0
		}
		s.claimLocked(idx, token, leaseUntil)
		return Result{Status: tier.Acquired, Attempts: e.attempts}, idx
	default: // committed
		if e.until > now {
			s.unlinkLocked(idx)
			s.pushFrontLocked(idx)
			r := Result{Status: tier.Committed, Digest: wordsDigest(e.word)}
			r.Result, r.At = s.resultLocked(idx)
			return r, 0
		}
		s.claimLocked(idx, token, leaseUntil)
		return Result{Status: tier.Acquired}, idx
	}
}

// ownLocked returns the slot and index of f if token holds it as a claim.
func (s *stripe) ownLocked(f shard.Fingerprint, token uint64, state uint8) (uint32, uint32, bool) {
	slot, idx := s.findLocked(f)
	if idx == 0 {
		return 0, 0, false
	}
	e := &s.entries[idx]
	return slot, idx, e.state == state && e.word[0] == token
}

func (s *stripe) extendLocked(f shard.Fingerprint, token uint64, now, leaseUntil int64) Status {
	_, idx, ok := s.ownLocked(f, token, claimed)
	if !ok || s.entries[idx].until <= now {
		return tier.Lost
	}
	s.entries[idx].until = max(s.entries[idx].until, leaseUntil)
	return tier.OK
}

func (s *stripe) beginLocked(f shard.Fingerprint, token uint64, now int64) Status {
	_, idx, ok := s.ownLocked(f, token, claimed)
	if !ok || s.entries[idx].until <= now {
		return tier.Lost
	}
	s.entries[idx].state = committing
	return tier.OK
}

func (s *stripe) finishLocked(f shard.Fingerprint, token uint64, ok bool, expires int64, digest Digest, result []byte, at int64) {
	slot, idx, own := s.ownLocked(f, token, committing)
	if !own {
		return
	}
	if !ok {
		s.entries[idx].state = claimed
		return
	}
	if len(result) == 0 {
		s.commitLocked(idx, expires, digest)
		return
	}
	if !s.keepResults || s.limit == 0 {
		s.removeLocked(slot) // the tier that stores the result answers for the key
		return
	}
	s.commitLocked(idx, expires, digest) // idx is the most recent entry: not evicted
	if s.results == nil {
		s.results = make(map[uint32]stored)
	}
	s.results[idx] = stored{data: bytes.Clone(result), at: at}
}

func (s *stripe) releaseLocked(f shard.Fingerprint, token uint64, now, keepUntil int64, count bool) Result {
	slot, idx, ok := s.ownLocked(f, token, claimed)
	if !ok || s.entries[idx].until <= now {
		return Result{Status: tier.Lost}
	}
	if s.maxAttempts == 0 {
		s.removeLocked(slot)
		return Result{Status: tier.OK}
	}
	a := s.entries[idx].attempts
	if count {
		a++
	}
	if s.limit == 0 || a == 0 {
		s.removeLocked(slot)
		return Result{Status: tier.OK, Attempts: a}
	}
	s.entries[idx].attempts = a
	s.releaseToLRULocked(idx, keepUntil)
	return Result{Status: tier.OK, Attempts: a}
}

func (s *stripe) settleLocked(f shard.Fingerprint, token uint64, action Action, expires int64, digest Digest, attempts uint16) {
	slot, idx, ok := s.ownLocked(f, token, claimed)
	switch {
	case !ok:
	case action == Commit:
		s.commitLocked(idx, expires, digest)
	case action == Drop:
		s.removeLocked(slot)
	case action == Poison:
		if s.limit == 0 {
			s.removeLocked(slot)
			return
		}
		s.entries[idx].attempts = attempts
		s.releaseToLRULocked(idx, expires)
	default: // Keep
		s.entries[idx].attempts = max(s.entries[idx].attempts, attempts)
	}
}

func (s *stripe) putLocked(f shard.Fingerprint, expires int64, digest Digest) {
	if s.limit == 0 {
		return
	}
	slot, idx := s.findLocked(f)
	if idx == 0 {
		if s.committed >= s.limit { // make room first, so the slab need not grow
			s.removeLocked(s.slotOfLocked(s.entries[0].prev))
			slot, _ = s.findLocked(f)
		}
		idx = s.insertLocked(slot, f)
	} else if st := s.entries[idx].state; st == claimed || st == committing {
		return
	}
	s.commitLocked(idx, expires, digest)
}

// peekLocked answers f without changing anything (not even LRU order).
func (s *stripe) peekLocked(f shard.Fingerprint, now int64) Result {
	_, idx := s.findLocked(f)
	if idx == 0 {
		return Result{Status: tier.Absent}
	}
	e := &s.entries[idx]
	switch e.state {
	case committing:
		return Result{Status: tier.Held}
	case claimed:
		if e.until > now {
			return Result{Status: tier.Held}
		}
		if s.maxAttempts == 0 {
			return Result{Status: tier.Absent}
		}
		return s.countedLocked(e.attempts + 1)
	case released:
		if e.until <= now {
			return Result{Status: tier.Absent}
		}
		return s.countedLocked(e.attempts)
	default: // committed
		if e.until <= now {
			return Result{Status: tier.Absent}
		}
		r := Result{Status: tier.Committed, Digest: wordsDigest(e.word)}
		r.Result, r.At = s.resultLocked(idx)
		return r
	}
}

// countedLocked is the answer for a key with attempts counted: Released,
// or Poisoned at MaxAttempts.
func (s *stripe) countedLocked(attempts uint16) Result {
	if s.maxAttempts > 0 && int(attempts) >= s.maxAttempts {
		return Result{Status: tier.Poisoned, Attempts: attempts}
	}
	return Result{Status: tier.Released, Attempts: attempts}
}

// seizeLocked makes f the caller's claim unless a live claim holds it,
// whatever it held before (a commit, an attempt count), and answers that
// as peekLocked does.
func (s *stripe) seizeLocked(f shard.Fingerprint, token uint64, now, leaseUntil int64) Result {
	r := s.peekLocked(f, now)
	if r.Status == tier.Held {
		return r
	}
	slot, idx := s.findLocked(f)
	if idx == 0 {
		idx = s.insertLocked(slot, f)
	}
	s.claimLocked(idx, token, leaseUntil)
	s.entries[idx].attempts = 0
	return r
}

// touchLocked moves the expiry of f's unexpired committed entry to expires
// if that is later, and reports whether it did.
func (s *stripe) touchLocked(f shard.Fingerprint, now, expires int64) bool {
	_, idx := s.findLocked(f)
	if idx == 0 {
		return false
	}
	if e := &s.entries[idx]; e.state == committed && e.until > now && e.until < expires {
		e.until = expires
		return true
	}
	return false
}
