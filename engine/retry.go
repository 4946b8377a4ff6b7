package engine

import (
	"sync"
	"sync/atomic"

	"github.com/tierdedup/tierdedup/shard"
)

// maxRetries bounds the claims remembered after an unavailable reply: at
// 40 B each, 64 Ki of them cost 2.5 MiB. Past it a retried claim may see
// its own earlier claim as InFlight until that lease ends (the outcome of
// an engine without this memory), never as New twice.
const maxRetries = 1 << 16

// retries remembers, for each key whose claim in a shared tier (Redis,
// PostgreSQL) failed as unavailable, the owner token that claim sent and
// when its lease ends; and for each key whose MarkBatch commit failed so,
// its token for the window. The server may
// have applied the claim although the reply was lost; a retry of the key
// sends the same token, so the tier recognises the caller's own claim
// (the package's invariant 8) instead of answering it InFlight for a
// whole lease. Safe for concurrent use.
type retries struct {
	n  atomic.Int32 // len(mu.m), read without the lock on the hot path
	mu struct {
		sync.Mutex
		m map[shard.Fingerprint]retry
	}
}

type retry struct {
	token      uint64 // the owner token's counter in the shared tier
	leaseUntil int64  // until when to remember it, engine time: the failed claim's lease end, or a mark's window
	mark       bool   // a MarkBatch commit whose reply was lost
	// attempts is the count the lost mark's claim carried (its commit
	// replaced it in the tier): a give-back of the retry restores it.
	attempts uint16
}

// remember records the tokens of claims whose outcome is unknown, and
// (attempts, nil for none) the counts they carried.
func (r *retries) remember(fps []shard.Fingerprint, tokens []uint64, leases []int64, attempts []uint16, now int64, mark bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.m == nil {
		r.mu.m = make(map[shard.Fingerprint]retry)
	}
	for i, fp := range fps {
		if len(r.mu.m) >= maxRetries {
			r.expireLocked(now)
			if len(r.mu.m) >= maxRetries {
				break
			}
		}
		rt := retry{token: tokens[i], leaseUntil: leases[i], mark: mark}
		if attempts != nil {
			rt.attempts = attempts[i]
		}
		r.mu.m[fp] = rt
	}
	r.n.Store(int32(len(r.mu.m)))
}

func (r *retries) expireLocked(now int64) {
	for fp, rt := range r.mu.m {
		if rt.leaseUntil <= now {
			delete(r.mu.m, fp)
		}
	}
}

// take returns and forgets the remembered claim of fp, if its lease has
// not ended.
func (r *retries) take(fp shard.Fingerprint, now int64) (retry, bool) {
	if r.n.Load() == 0 {
		return retry{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.mu.m[fp]
	if ok {
		delete(r.mu.m, fp)
		r.n.Store(int32(len(r.mu.m)))
	}
	return rt, ok && rt.leaseUntil > now
}
