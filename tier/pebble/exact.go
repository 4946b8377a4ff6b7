package pebble

import (
	"bytes"
	"context"
	"math/bits"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

// The Store is the engine's embedded exact tier.
var (
	_ tier.Exact        = (*Store)(nil)
	_ tier.CommitWriter = (*Store)(nil)
	_ tier.Dropper      = (*Store)(nil)
	_ tier.Scanner      = (*Store)(nil)
	_ tier.Latching     = (*Store)(nil)
	_ tier.ResultKeeper = (*Store)(nil)
	_ tier.Forgetter    = (*Store)(nil)
)

// KeepsResults reports that a commit's result is stored with it.
func (s *Store) KeepsResults() bool { return true }

// Commit writes a committed record of each key in partition, with its
// digest and result, in one batch, and returns once it is durable as configured; out
// (if not nil) is OK for every key. On failure nothing is written and the
// Store refuses further calls (ErrStorage).
func (s *Store) Commit(ctx context.Context, partition int64, reqs []tier.Request, out []tier.Status) error {
	return s.CommitWith(ctx, partition, reqs, nil, out)
}

// CommitWith is Commit with the caller's records in the same atomic batch,
// in a keyspace retention never touches. With no reqs it writes writes
// alone.
func (s *Store) CommitWith(_ context.Context, partition int64, reqs []tier.Request, writes []tier.Write, out []tier.Status) error {
	return s.writeRequests(partition, reqs, writes, out, func(r *tier.Request) (Value, bool) {
		return Value{State: StateCommitted, Digest: r.Digest, At: r.At, Result: r.Result}, true
	})
}

// Release writes, in partition, a released record of each key with its
// attempt count reqs[i].Attempts (zero too: it shadows a count an older
// record holds), so that every restart sees the count; with giveBack there
// is nothing to write. out (if not nil) is OK for every key.
func (s *Store) Release(_ context.Context, partition int64, reqs []tier.Request, giveBack bool, out []tier.Status) error {
	if giveBack {
		for i := range out {
			out[i] = tier.OK
		}
		return nil
	}
	return s.writeRequests(partition, reqs, nil, out, func(r *tier.Request) (Value, bool) {
		// Every count the engine sends, zero too: a claim given back
		// uncounted restores the count its durable claim raised.
		return Value{State: StateReleased, Attempts: r.Attempts}, true
	})
}

// writeRequests writes the record value(r) says for each request that has
// one, and writes, in one batch.
func (s *Store) writeRequests(partition int64, reqs []tier.Request, writes []tier.Write, out []tier.Status, value func(*tier.Request) (Value, bool)) error {
	rp := s.records.Get().(*[]Record)
	recs := (*rp)[:0]
	for i := range reqs {
		r := &reqs[i]
		if v, ok := value(r); ok {
			recs = append(recs, Record{Partition: partition, NS: r.NS, Key: r.Key, Value: v})
		}
	}
	var err error
	if len(recs) > 0 || len(writes) > 0 {
		err = s.writeWith(recs, writes)
	}
	clear(recs) // drop references to the caller's keys
	*rp = recs[:0]
	s.records.Put(rp)
	if err != nil {
		return err
	}
	for i := range out {
		out[i] = tier.OK
	}
	return nil
}

// Forget deletes every record of each key in the partitions reqs[i].Oldest
// and Mask name, in one batch, durable as configured, and answers, as Claim
// does, the newest record it found (Absent if none). The engine holds each
// key's claim meanwhile, so no commit of it can interleave. Deleting in a
// sealed partition is allowed: a filter that still says "maybe" for a
// deleted key costs a read, never a wrong answer. Failures latch as
// Claim's and writes' do.
func (s *Store) Forget(ctx context.Context, reqs []tier.Request, out []tier.Answer) (err error) {
	// No move between the reads and the deletions: a key read in the hot
	// database is deleted there, before a move could copy it.
	s.moveMu.Lock()
	defer s.moveMu.Unlock()
	if err := s.Claim(ctx, reqs, 0, out); err != nil {
		return err
	}
	defer s.guard(&err)
	its, err := s.newIters(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return err
	}
	defer its.close()
	hot, cold := s.db.NewBatch(), s.cold.NewBatch()
	defer hot.Close()
	defer cold.Close()
	var k []byte
	for i := range reqs {
		q := &reqs[i]
		for m := q.Mask; m != 0; m &^= 1 << (63 - bits.LeadingZeros64(m)) {
			part := q.Oldest + int64(63-bits.LeadingZeros64(m))
			k = appendRecordKey(k[:0], part, q.NS, q.Key)
			it, err := its.of(part)
			if err != nil {
				return err
			}
			found := it.SeekPrefixGE(k)
			if err := it.Error(); err != nil {
				return s.fail(err)
			}
			if found && bytes.Equal(it.Key(), k) {
				b := hot
				if it == its.cold {
					b = cold
				}
				if err := b.Delete(k, nil); err != nil {
					return s.fail(err)
				}
			}
		}
	}
	// The cold deletions first: a crash between leaves a key in the hot
	// database (still a duplicate), never a half that answers for it.
	if !cold.Empty() {
		if err := s.applyTo(s.cold, cold, s.writeOpts); err != nil {
			return err
		}
	}
	if hot.Empty() {
		return nil
	}
	return s.commit(hot)
}
