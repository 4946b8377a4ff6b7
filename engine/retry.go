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

// retries remembers, for each key whose call to a shared tier (Redis,
// PostgreSQL) failed as unavailable, the oldest owner token of the calls
// whose replies were lost since the key's last answer, and until when: a
// claim's lease end, or for a mark (whose commit the tier may hold) the
// window. The server may have applied those calls although their replies
// were lost; the key's next call sends a token of its own with this one
// as Request.Earlier, so the tier adopts what the lost calls hold (the
// caller's own claim, or a commit nobody was told of) instead of
// answering InFlight for a lease or Duplicate for good. A token is never
// sent again: a late give-back of a failed call names that call's token
// only. Safe for concurrent use.
type retries struct {
	n  atomic.Int32 // len(mu.m), read without the lock on the hot path
	mu struct {
		sync.Mutex
		m map[shard.Fingerprint]retry
	}
}

type retry struct {
	token      uint64 // the oldest lost call's owner token counter in the shared tier
	leaseUntil int64  // until when to remember it, engine time: the failed claim's lease end, or a mark's window
	mark       bool   // a lost call may have committed the key (a mark, or a retry that adopted one)
	// attempts is the count the lost mark's claim carried (its commit
	// replaced it in the tier): a give-back of the retry restores it.
	attempts uint16
}

// remember records the tokens of calls whose outcome is unknown, and
// (attempts, marks: nil for none) the counts they carried and which may
// have committed.
func (r *retries) remember(fps []shard.Fingerprint, tokens []uint64, leases []int64, attempts []uint16, marks []bool, now int64) {
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
		rt := retry{token: tokens[i], leaseUntil: leases[i]}
		if attempts != nil {
			rt.attempts = attempts[i]
		}
		if marks != nil {
			rt.mark = marks[i]
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
