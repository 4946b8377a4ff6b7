package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// Extend makes a New claim's lease end d from now (unless it already ends
// later), for a handler that runs longer than Options.Lease: a heartbeat.
// Only the claim's current owner may: a claim whose lease already ended,
// that another worker took over, or that is being committed gets
// ErrLeaseLost and changes nothing. On success c.LeaseUntil is the new
// end. d must be positive and shorter than the window (ErrOptions).
//
// With a shared tier (Redis, PostgreSQL) the lease is extended there too,
// in one round trip, fenced by the claim's owner token; a failure to reach
// it is ErrUnavailable, and the claim keeps at least its earlier lease. The
// lease in this process's memory is extended first: when the shared tier
// answers that the claim was lost there (ErrLeaseLost), the key stays
// InFlight for this process until that extended lease ends, and the
// claim's Commit fails there, fenced.
// A lease is not durable: claims do not survive a restart of an embedded
// store, whatever their lease. A durable claim's attempt
// (Options.DurableClaims) is: an Extend in a later partition than the one
// holding it writes it again, durably, in the current partition before it
// returns, so the attempt outlives every lease the claim can reach (an
// extension is shorter than the window) and a claim abandoned after
// heartbeats past Window + Partition still counts at the next Open.
func (e *Engine) Extend(ctx context.Context, c *Claim, d time.Duration) error {
	if c == nil || c.Outcome != New {
		return fmt.Errorf("%w: Extend of a claim that is not New", ErrNotClaimed)
	}
	if d <= 0 || int64(d) >= e.window {
		return fmt.Errorf("%w: Extend by %v: must be positive and shorter than the window %v", ErrOptions, d, time.Duration(e.window))
	}
	shared := e.where == tier.ClaimsInStore
	if err := e.serve(NeedExtend, "Extend"); err != nil {
		return err
	}
	locked, err := e.admit(ctx)
	if err != nil {
		return err
	}
	defer e.leave(locked)
	if c.ns == nil || c.ns.e != e || shard.Sum(e.hasher, c.ns.name, c.Key) != c.fp {
		return fmt.Errorf("%w: the claim is another engine's, or its key bytes changed", ErrLeaseLost)
	}
	now, _ := e.nowNoRotate()
	until := now + int64(d)
	fps, tokens := [1]shard.Fingerprint{c.fp}, [1]uint64{c.token}
	var st [1]tier.Status
	e.mem.Extend(fps[:], tokens[:], now, until, st[:])
	if st[0] != tier.OK {
		e.stats.leaseLost.Add(1)
		return ErrLeaseLost
	}
	if shared {
		reqs := [1]tier.Request{{NS: c.ns.name, Key: c.Key, Token: e.ownerToken(c.rtoken)}}
		if err := e.extender.Extend(ctx, reqs[:], d, st[:]); err != nil {
			e.stats.errors.Add(1)
			return e.tierError(err)
		}
		if st[0] != tier.OK {
			e.stats.leaseLost.Add(1)
			return ErrLeaseLost
		}
	}
	if c.durable && !shared {
		if err := e.renewDurable(ctx, c, until); err != nil {
			return err
		}
	}
	c.LeaseUntil = max(c.LeaseUntil, until)
	return nil
}

// renewDurable writes durable claim c's attempt again in the current
// partition when an older one holds it: the older partition is dropped a
// window after it ends, which a claim kept alive by heartbeats outlives.
// It holds counts for writing, so no commit of the key is in its durable
// write meanwhile (a commit's record in the same partition must land
// after the attempt, not be erased by it), and writes only while memory
// still holds the claim: one committed or released meanwhile gets
// ErrLeaseLost and nothing is written.
func (e *Engine) renewDurable(ctx context.Context, c *Claim, until int64) error {
	now, err := e.now() // rotated: the attempt goes in the current partition
	if err != nil {
		return err
	}
	part := e.parts.Of(now)
	if part <= c.durablePart {
		return nil
	}
	e.counts.Lock()
	defer e.counts.Unlock()
	fps, tokens := [1]shard.Fingerprint{c.fp}, [1]uint64{c.token}
	var st [1]tier.Status
	e.mem.Extend(fps[:], tokens[:], now, until, st[:])
	if st[0] != tier.OK {
		e.stats.leaseLost.Add(1)
		return ErrLeaseLost
	}
	reqs := [1]tier.Request{{NS: c.ns.name, Key: c.Key, Attempts: c.attempts + 1}}
	if err := e.writeAttempts(ctx, fps[:], part, reqs[:], st[:]); err != nil {
		return err
	}
	c.durablePart = part
	return nil
}
