package memory

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// Result is the per-key answer of a batch call.
type Result struct {
	Status Status
	// Digest is the committed entry's payload digest (Committed only).
	Digest Digest
	// Attempts is the key's attempt count after the call (releases and
	// lease expiries of its claims; with Options.MaxAttempts only):
	// carried by a new claim, reached by a Poisoned key, or counted by a
	// Release.
	Attempts uint16
	// Expired reports that this call counted a lease expiry (a TakenOver
	// claim, or a Poisoned one that the expiry made poison).
	Expired bool
	// Result and At are the result and time committed with the entry
	// (Committed, with Options.Results): a copy, nil for none.
	Result []byte
	At     int64
}

// ErrOptions reports invalid Options.
var ErrOptions = errors.New("memory: invalid options")

// DefaultCapacity is the number of committed entries kept when Options leave
// it zero: at ≈ 66 B each (measured, 56 B entry + index), 1M entries cost
// ≈ 66 MiB.
const DefaultCapacity = 1 << 20

// MaxCapacity bounds Options.Capacity: entries are indexed in 32 bits
// within a stripe.
const MaxCapacity = 1 << 31

// DefaultStripes is the stripe count when Options leave it zero. With 256
// stripes two cores rarely contend (measured: a 256-stripe LRU ran 1.3× faster
// on two cores than on one, a single mutex ran slower).
const DefaultStripes = 256

// Options configure a Table. The zero value is valid.
type Options struct {
	// Capacity bounds the committed entries kept, in entries. Zero means
	// DefaultCapacity; NoCommitted keeps claims only. Claims are not
	// counted: they cannot be evicted.
	Capacity int
	// NoCommitted keeps no committed entries at all (the table then only
	// holds claims). It conflicts with a non-zero Capacity.
	NoCommitted bool
	// Stripes is the number of lock stripes, a power of two up to
	// shard.MaxStripes. Zero means DefaultStripes.
	Stripes int
	// Secret keys stripe and slot placement. The zero value is replaced by a
	// random secret.
	Secret shard.Secret
	// MaxAttempts, when positive, makes Release remember how often a key's
	// claims were released (or taken over after their lease), and Acquire
	// answer Poisoned once that reaches MaxAttempts. The counts live in
	// the LRU beside committed entries, so eviction may forget them: the
	// engine keeps them durable in its store and hands them back through
	// Settle. Zero counts nothing.
	MaxAttempts int
	// Results keeps the result a commit stores (FinishResults) with its
	// committed entry and returns it with Committed answers: for a table
	// that is the only tier. Without it, a commit with a result leaves no
	// entry, so that the key's answer comes from the tier that stores the
	// result. Results cost their bytes for as long as their entries live.
	Results bool
}

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Capacity < 0 || o.Capacity > MaxCapacity {
		errs = append(errs, fmt.Errorf("%w: Capacity %d is outside [0, %d]", ErrOptions, o.Capacity, MaxCapacity))
	}
	if o.NoCommitted && o.Capacity != 0 {
		errs = append(errs, fmt.Errorf("%w: NoCommitted conflicts with Capacity %d", ErrOptions, o.Capacity))
	}
	if err := tier.CheckAttempts(o.MaxAttempts); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrOptions, err))
	}
	if o.Stripes != 0 {
		if err := shard.CheckStripes(o.Stripes); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrOptions, err))
		}
	}
	return errors.Join(errs...)
}

// Table is a lock-striped exact set of claims and recently committed keys.
// It is safe for concurrent use.
type Table struct {
	router  shard.Router
	seed    uint64
	stripes []stripe
	groups  sync.Pool // *grouping, reused by batch calls
}

// New returns a Table configured by opts (nil means defaults).
func New(opts *Options) (*Table, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Stripes == 0 {
		o.Stripes = DefaultStripes
	}
	capacity := o.Capacity
	if capacity == 0 && !o.NoCommitted {
		capacity = DefaultCapacity
	}
	if o.Secret == (shard.Secret{}) {
		o.Secret = shard.NewSecret()
	}
	r, err := shard.NewRouter(o.Secret, o.Stripes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	t := &Table{router: r, seed: shard.Mix(uint64(o.Secret[3])<<32 | uint64(o.Secret[11])), stripes: make([]stripe, o.Stripes)}
	per := (capacity + o.Stripes - 1) / o.Stripes
	initial := max(eagerEntries/o.Stripes, 64)
	for i := range t.stripes {
		t.stripes[i].init(per, initial, t.seed)
		t.stripes[i].maxAttempts = o.MaxAttempts
		t.stripes[i].keepResults = o.Results
	}
	return t, nil
}

// Len returns the number of claims and committed entries held.
func (t *Table) Len() (claims, committed int) {
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		claims += s.claims
		committed += s.committed
		s.mu.Unlock()
	}
	return claims, committed
}

// Acquire looks up each key and, where no unexpired claim or committed entry
// holds it, installs a claim with tokens[i] leased until leaseUntil. out must
// have len(fps) and receives one Result per key. A claim whose lease ended
// at or before now is replaced (TakenOver); with MaxAttempts the expiry is
// counted, and a key it makes poison keeps its count until keepUntil.
func (t *Table) Acquire(fps []shard.Fingerprint, tokens []uint64, now, leaseUntil, keepUntil int64, out []Result) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.acquireLocked(fps[i], tokens[i], now, leaseUntil, keepUntil)
	})
}

// Mark is Acquire with every claim it installs (Acquired or TakenOver)
// committed in the same visit of its stripe, expiring at expires with
// digests[i] (digests may be nil: none), for a table that is the only
// exact tier and has nothing slower to wait for. A stripe evicts beyond
// its capacity only once all its keys of the batch are answered, so a
// commit cannot make a later key of the batch forget what it held (a
// commit, an attempt count): the answers are those of Acquire for the
// whole batch and then Finish, except that a key repeated in the batch
// answers Committed, with the digest of its first occurrence.
func (t *Table) Mark(fps []shard.Fingerprint, tokens []uint64, digests []Digest, now, leaseUntil, keepUntil, expires int64, out []Result) {
	t.eachStripe(fps, func(s *stripe, order []int32) {
		for _, i := range order {
			var d Digest
			if digests != nil {
				d = digests[i]
			}
			var idx uint32
			out[i], idx = s.acquireIdxLocked(fps[i], tokens[i], now, leaseUntil, keepUntil, false)
			if idx != 0 {
				s.commitKeepLocked(idx, expires, d)
			}
		}
		s.evictLocked()
	})
}

// Peek answers each key without changing anything: Absent, Held (a live
// claim, or one being committed), Committed (with its digest and, with
// Options.Results, its result), Released (an attempt count; a claim whose
// lease ended counts one more) or Poisoned.
func (t *Table) Peek(fps []shard.Fingerprint, now int64, out []Result) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.peekLocked(fps[i], now)
	})
}

// Seize installs a claim with tokens[i], leased until leaseUntil, on each
// key that no live claim holds, replacing a committed entry or an attempt
// count, and answers what the key held before, as Peek does (Held keys are
// left alone). The claim starts with no attempts: the engine seizes keys
// to forget them, then drops the claims (Settle with Drop).
func (t *Table) Seize(fps []shard.Fingerprint, tokens []uint64, now, leaseUntil int64, out []Result) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.seizeLocked(fps[i], tokens[i], now, leaseUntil)
	})
}

// Extend moves the lease end of each claim that tokens[i] holds with an
// unexpired lease (not being committed) to leaseUntil, if that is later
// (out[i] OK); otherwise out[i] is Lost and nothing changes. A lease is
// never shortened.
func (t *Table) Extend(fps []shard.Fingerprint, tokens []uint64, now, leaseUntil int64, out []Status) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.extendLocked(fps[i], tokens[i], now, leaseUntil)
	})
}

// Attempts returns the attempt count of the claim token holds on f, as
// acquired and settled (releases and lease expiries of earlier claims);
// 0 when token does not hold f.
func (t *Table) Attempts(f shard.Fingerprint, token uint64) uint16 {
	s := &t.stripes[t.router.Stripe(f)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, idx, ok := s.ownLocked(f, token, claimed); ok {
		return s.entries[idx].attempts
	}
	return 0
}

// Touch moves the expiry of each key's unexpired committed entry to
// expires, if that is later: a sliding window's duplicate, in a table that
// is the only exact tier. Claims, attempt counts and expired entries are
// left alone. It returns how many entries it moved.
func (t *Table) Touch(fps []shard.Fingerprint, now, expires int64) (moved int) {
	t.each(fps, func(s *stripe, i int) {
		if s.touchLocked(fps[i], now, expires) {
			moved++
		}
	})
	return moved
}

// Begin starts committing each claim: where tokens[i] holds the key with an
// unexpired lease the claim is pinned (it can no longer expire or be
// released) and out[i] is OK; otherwise out[i] is Lost and nothing changes.
func (t *Table) Begin(fps []shard.Fingerprint, tokens []uint64, now int64, out []Status) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.beginLocked(fps[i], tokens[i], now)
	})
}

// Finish ends commits started by Begin. Where ok[i] the claim becomes a
// committed entry expiring at expires with digests[i]; otherwise the claim
// returns to its leased state, so the owner may retry or release it. Keys
// whose Begin was not OK must not be passed.
func (t *Table) Finish(fps []shard.Fingerprint, tokens []uint64, ok []bool, expires int64, digests []Digest) {
	t.each(fps, func(s *stripe, i int) {
		s.finishLocked(fps[i], tokens[i], ok[i], expires, digests[i], nil, 0)
	})
}

// FinishResults is Finish with an expiry per key, where a commit may store
// a result: results is nil or one per key (nil or empty for none), at the
// commit's time. A committed entry keeps its result with Options.Results;
// without it a commit with a result leaves no entry at all.
func (t *Table) FinishResults(fps []shard.Fingerprint, tokens []uint64, ok []bool, expires []int64, digests []Digest, results [][]byte, at int64) {
	t.each(fps, func(s *stripe, i int) {
		var r []byte
		if results != nil {
			r = results[i]
		}
		s.finishLocked(fps[i], tokens[i], ok[i], expires[i], digests[i], r, at)
	})
}

// Release frees each claim that tokens[i] holds with an unexpired lease
// (out[i].Status OK, out[i].Attempts its count after this release);
// otherwise out[i].Status is Lost and nothing changes. With MaxAttempts,
// the key's attempt count, one higher when count is set (a failed
// handler; not a claim given back because the engine failed), is kept
// until keepUntil.
func (t *Table) Release(fps []shard.Fingerprint, tokens []uint64, now, keepUntil int64, count bool, out []Result) {
	t.each(fps, func(s *stripe, i int) {
		out[i] = s.releaseLocked(fps[i], tokens[i], now, keepUntil, count)
	})
}

// Action says what Settle does with a claim acquired to consult a slower
// tier.
type Action uint8

// Actions.
const (
	// Keep leaves the claim in place: the key was new.
	Keep Action = iota
	// Commit turns the claim into a committed entry: the slower tier knew
	// the key as committed.
	Commit
	// Drop removes the claim: the key turned out held or committed
	// elsewhere, or the call failed.
	Drop
	// Poison turns the claim into a released entry: a slower tier knew
	// the key's attempts had reached MaxAttempts.
	Poison
)

// Settle resolves claims the engine acquired only to consult a slower tier,
// applying actions[i] to the claim tokens[i] holds (Commit with expires[i]
// and digests[i]; Poison with attempts[i], kept until expires[i]). With
// Keep, a slower tier's count attempts[i] raises the claim's own. attempts
// may be nil. A key that tokens[i] no longer holds is left alone.
func (t *Table) Settle(fps []shard.Fingerprint, tokens []uint64, actions []Action, expires []int64, digests []Digest, attempts []uint16) {
	t.each(fps, func(s *stripe, i int) {
		var a uint16
		if attempts != nil {
			a = attempts[i]
		}
		s.settleLocked(fps[i], tokens[i], actions[i], expires[i], digests[i], a)
	})
}

// put records committed entries, expiring at expires[i], without a claim
// (for tests that fill the table). It never replaces a claim.
func (t *Table) put(fps []shard.Fingerprint, expires []int64, digests []Digest) {
	t.each(fps, func(s *stripe, i int) {
		s.putLocked(fps[i], expires[i], digests[i])
	})
}

// firstKey is the order of a batch of one key.
var firstKey = [1]int32{0}

// grouping is the per-batch scratch that orders keys by stripe.
type grouping struct {
	order  []int32
	stripe []int32
	count  []int32
}

// each calls fn for every key, grouped by stripe with each stripe locked
// once, keys of one stripe in batch order.
func (t *Table) each(fps []shard.Fingerprint, fn func(s *stripe, i int)) {
	t.eachStripe(fps, func(s *stripe, order []int32) {
		for _, i := range order {
			fn(s, int(i))
		}
	})
}

// eachStripe calls fn once per stripe the keys fall in, with the stripe
// locked and the indices of its keys in batch order.
func (t *Table) eachStripe(fps []shard.Fingerprint, fn func(s *stripe, order []int32)) {
	if len(fps) == 1 {
		s := &t.stripes[t.router.Stripe(fps[0])]
		s.mu.Lock()
		fn(s, firstKey[:])
		s.mu.Unlock()
		return
	}
	g, _ := t.groups.Get().(*grouping)
	if g == nil {
		g = &grouping{count: make([]int32, len(t.stripes)+1)}
	}
	n := len(fps)
	if cap(g.order) < n {
		g.order = make([]int32, n)
		g.stripe = make([]int32, n)
	}
	order, stripes, count := g.order[:n], g.stripe[:n], g.count
	clear(count)
	for i := range fps {
		s := int32(t.router.Stripe(fps[i]))
		stripes[i] = s
		count[s+1]++
	}
	for i := 1; i < len(count); i++ {
		count[i] += count[i-1]
	}
	for i := range fps { // stable counting sort: batch order within a stripe
		s := stripes[i]
		order[count[s]] = int32(i)
		count[s]++
	}
	for j := 0; j < n; {
		si := stripes[order[j]]
		s := &t.stripes[si]
		lo := j
		for j < n && stripes[order[j]] == si {
			j++
		}
		s.mu.Lock()
		fn(s, order[lo:j])
		s.mu.Unlock()
	}
	t.groups.Put(g)
}
