package engine

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// versionsPrefix starts the name of the engine's own namespace that keeps
// the versions of a caller's namespace's entities (Advance).
const versionsPrefix = "\x00v/"

// versionDigest is version v as stored: 16 lowercase hex digits in a
// Digest, so versions compare as their bytes in every tier.
func versionDigest(v uint64) Digest {
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], v)
	var d Digest
	hex.Encode(d[:], raw[:])
	return d
}

// versionOf reads a stored version; the zero Digest is no version.
func versionOf(d Digest) (uint64, error) {
	if d == (Digest{}) {
		return 0, nil
	}
	var raw [8]byte
	if _, err := hex.Decode(raw[:], d[:]); err != nil {
		return 0, fmt.Errorf("%w: a version key holds %x", ErrStorage, d[:])
	}
	return binary.BigEndian.Uint64(raw[:]), nil
}

// Advance offers version of entity in the default namespace; see
// Namespace.AdvanceBatch.
func (e *Engine) Advance(ctx context.Context, entity []byte, version uint64) (Claim, error) {
	return e.def.Advance(ctx, entity, version)
}

// AdvanceBatch offers versions of entities in the default namespace; see
// Namespace.AdvanceBatch.
func (e *Engine) AdvanceBatch(ctx context.Context, entities [][]byte, versions []uint64, out []Claim) error {
	return e.def.AdvanceBatch(ctx, entities, versions, out)
}

// Advance is AdvanceBatch for one entity.
func (n *Namespace) Advance(ctx context.Context, entity []byte, version uint64) (Claim, error) {
	entities := [1][]byte{entity}
	versions := [1]uint64{version}
	var out [1]Claim
	err := n.AdvanceBatch(ctx, entities[:], versions[:], out[:])
	return out[0], err
}

// AdvanceBatch is the claim of an entity updated by versioned events (an
// order's status machine fed by redelivered and reordered events): it
// answers New only when versions[i] is higher than the entity's stored
// version, atomically, and then the caller owns the entity as a claim
// (Commit stores the version; Release, or a lease that runs out, keeps the
// one it replaced). Duplicate: the stored version is this one (a
// redelivery); Stale: it is higher (an older event arriving late): skip
// and ack both. InFlight: another Advance of the entity holds it now.
// out[i].Version is the stored version: the one a New claim replaces (0
// for none), or the one that made the answer Duplicate or Stale. An
// entity repeated in the batch is answered from its first occurrence: a
// repeat is Duplicate or Stale by the version the first one read, and
// InFlight after a New first occurrence, or when it offers a higher
// version than that one found stored and not taken (offer it again).
//
// An entity keeps one record, its highest version, for the Window after
// its last commit (O(entities) storage), in a namespace of the engine's
// own beside the caller's (the entity's key does not meet the caller's
// claims of the same bytes). Versions start at 1 (0 is ErrVersion).
// Fencing, leases, durability and sharing are a claim's: the default
// configuration and Redis; memory-only, bloom-only and PostgreSQL refuse
// (ErrOptions). Attempts are not counted
// (MaxAttempts does not apply).
func (n *Namespace) AdvanceBatch(ctx context.Context, entities [][]byte, versions []uint64, out []Claim) error {
	return n.e.advance(ctx, n, entities, versions, out)
}

func (e *Engine) advance(ctx context.Context, ns *Namespace, entities [][]byte, versions []uint64, out []Claim) error {
	if err := e.serve(NeedAdvance, "Advance"); err != nil {
		return err
	}
	switch {
	case len(out) != len(entities) || len(versions) != len(entities):
		return fmt.Errorf("%w: %d entities, %d versions, %d claims", ErrBatch, len(entities), len(versions), len(out))
	case len(versionsPrefix)+len(ns.name) > MaxNamespace:
		return fmt.Errorf("%w: Advance in a namespace of %d bytes (max %d)", ErrNamespace, len(ns.name), MaxNamespace-len(versionsPrefix))
	}
	for i, v := range versions {
		if v == 0 {
			return fmt.Errorf("%w: entity %d", ErrVersion, i)
		}
	}
	if err := e.checkKeys(entities); err != nil {
		return err
	}
	vns := e.newNamespace(versionsPrefix + ns.name)
	now, slot, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.finish(slot)
	n := len(entities)
	b := e.getBatch(n)
	defer e.putBatch(b)
	e.fingerprints(b, vns.name, entities, true)
	leaseUntil := now + e.lease
	// Seize, not Acquire: a committed version is what a higher one
	// replaces. Memory holds the entity's claim from here, so no other
	// call in this process can decide it meanwhile.
	e.mem.Seize(b.fps, b.tokens, now, leaseUntil, b.res)
	cand := b.cand[:0]
	for i := range entities {
		out[i] = Claim{Key: entities[i], ns: vns, fp: b.fps[i], digest: versionDigest(versions[i]), advance: true}
		if b.res[i].Status == tier.Held {
			out[i].Outcome = InFlight
			continue
		}
		out[i].token, out[i].rtoken, out[i].LeaseUntil = b.tokens[i], b.tokens[i], leaseUntil
		cand = append(cand, i)
	}
	b.cand = cand
	var c tally
	if len(cand) > 0 {
		if e.where == tier.ClaimsInStore {
			err = e.advanceShared(ctx, b, out, versions, &c, now)
		} else {
			err = e.advanceLocal(ctx, b, out, versions, &c)
		}
		// Give back the claims of every entity that is not New.
		m := 0
		for _, i := range cand {
			if err != nil || out[i].Outcome != New {
				b.cfps[m], b.ctokens[m], b.actions[m] = b.fps[i], b.tokens[i], memory.Drop
				m++
			}
		}
		e.mem.Settle(b.cfps[:m], b.ctokens[:m], b.actions[:m], b.expires[:m], b.digests[:m], nil)
	}
	if err != nil {
		c.errors++
		e.stats.add(&c)
		if e.where == tier.ClaimsInStore {
			return e.tierError(err)
		}
		return err
	}
	// A repeated entity is answered from its first occurrence's stored
	// version, as a claim's repeat is from its first: Duplicate or Stale
	// where that version decides it; InFlight where the first occurrence
	// holds the entity (New) or the repeat offers a higher version than
	// the stored one (it waits for the entity to be free).
	for i, first := range b.repeatsOf(b.fps[:n]) {
		if f := &out[first]; f.Outcome == Duplicate || f.Outcome == Stale {
			if decideVersion(&out[i], f.Version, versions[i]); out[i].Outcome == New {
				out[i].Outcome = InFlight
			}
		}
	}
	for i := range out {
		c.count(out[i].Outcome)
	}
	c.claims = uint64(n)
	e.stats.add(&c)
	return nil
}

// decideVersion sets a candidate's outcome from the stored version.
func decideVersion(c *Claim, stored, offered uint64) {
	c.Version = stored
	switch {
	case offered > stored:
		c.Outcome = New
	case offered == stored:
		c.Outcome = Duplicate
	default:
		c.Outcome = Stale
	}
}

// advanceLocal decides b.cand in a tier whose claims live in the engine:
// the version memory knows, or the store's (read in the partitions the
// filter names).
func (e *Engine) advanceLocal(ctx context.Context, b *batch, out []Claim, versions []uint64, c *tally) error {
	cand := b.cand
	oldest, warm := e.filterMasks(b.candidates(), b.probes)
	reqs, qidx := b.reqs[:0], b.qidx[:0]
	defer func() { clear(reqs) }()
	for j, i := range cand {
		r := &b.res[i]
		if r.Status == tier.Committed {
			// Memory caches only what the store holds.
			c.memHits++
			stored, err := versionOf(r.Digest)
			if err != nil {
				return err
			}
			decideVersion(&out[i], stored, versions[i])
			continue
		}
		mask := b.probes[j].Maybe
		if warm && mask == 0 {
			c.bloomNegatives++
			decideVersion(&out[i], 0, versions[i])
			continue
		}
		reqs = append(reqs, tier.Request{NS: out[i].ns.name, Key: out[i].Key, Oldest: oldest, Mask: mask})
		qidx = append(qidx, i)
	}
	b.reqs, b.qidx = reqs, qidx
	if len(reqs) == 0 {
		return nil
	}
	ans := b.ans[:len(reqs)]
	c.storeReads += uint64(len(reqs))
	if err := e.exact.Claim(ctx, reqs, 0, ans); err != nil {
		return e.tierError(err)
	}
	for q, i := range qidx {
		var stored uint64
		switch a := &ans[q]; a.Status {
		case tier.Committed:
			c.storeHits++
			v, err := versionOf(a.Digest)
			if err != nil {
				return err
			}
			stored = v
		case tier.Absent:
		default:
			// Advance never writes attempt counts: a version key holds a
			// version or nothing.
			return fmt.Errorf("%w: a version key answered %v", ErrStorage, a.Status)
		}
		decideVersion(&out[i], stored, versions[i])
	}
	return nil
}

// advanceShared decides b.cand in the shared tier: one atomic
// compare-and-claim per entity.
func (e *Engine) advanceShared(ctx context.Context, b *batch, out []Claim, versions []uint64, c *tally, now int64) error {
	reqs := b.reqs[:0]
	defer func() { clear(reqs) }()
	for _, i := range b.cand {
		if rt, ok := e.retries.take(out[i].fp, now); ok {
			// A retry of an advance whose reply was lost: the same token,
			// which the tier recognises as its own claim, and no more
			// lease than that claim has there.
			out[i].rtoken = rt.token
			out[i].LeaseUntil = min(out[i].LeaseUntil, rt.leaseUntil)
		}
		reqs = append(reqs, tier.Request{NS: out[i].ns.name, Key: out[i].Key, Token: e.ownerToken(out[i].rtoken), Digest: out[i].digest, Versioned: true})
	}
	b.reqs = reqs
	ans := b.ans[:len(reqs)]
	c.storeReads += uint64(len(reqs))
	if err := e.advancer.Advance(ctx, reqs, time.Duration(e.lease), ans); err != nil {
		// The tier may hold the entities for these tokens now: remember
		// them, so the retries find their own claims.
		m := len(b.cand)
		fps, tokens, leases := make([]shard.Fingerprint, m), make([]uint64, m), make([]int64, m)
		for j, i := range b.cand {
			fps[j], tokens[j], leases[j] = out[i].fp, out[i].rtoken, out[i].LeaseUntil
		}
		e.retries.remember(fps, tokens, leases, nil, nil, now)
		return err
	}
	for q, i := range b.cand {
		a := &ans[q]
		stored, err := versionOf(a.Digest)
		if err != nil {
			return err
		}
		switch a.Status {
		case tier.Acquired:
			out[i].Outcome, out[i].Version = New, stored
		case tier.Committed:
			c.storeHits++
			decideVersion(&out[i], stored, versions[i])
		case tier.Held:
			out[i].Outcome = InFlight
		default:
			return fmt.Errorf("%w: the shared tier answered %v to an advance", ErrStorage, a.Status)
		}
	}
	return nil
}
