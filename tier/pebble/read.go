package pebble

import (
	"bytes"
	"context"
	"math/bits"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

// Claim reads each key with full key comparisons, newest partition first,
// in the partitions reqs[i].Oldest and Mask name: Committed or Released
// (with the record's Partition and value) for the newest such record,
// Absent otherwise. Claimed records count as absent (claims left by a
// previous process are void). It writes nothing and ignores lease.
//
// Pebble clears an iterator's error at the start of every seek, so the error
// is checked after each one: a seek that found nothing because a block could
// not be read is a failure, never an absence. Read failures (I/O errors,
// corrupt blocks or values) latch like write failures: the Store refuses
// every later call, because a store that cannot be read cannot say Absent.
func (s *Store) Claim(_ context.Context, reqs []tier.Request, _ time.Duration, out []tier.Answer) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	// UseL6Filters: most keys live in L6, whose filters db.Get skips
	// (measured: 815k vs 197k absent lookups/s).
	its, err := s.newIters(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return err
	}
	defer its.close()
	bp := s.buffer()
	defer s.buffers.Put(bp)
	for i := range reqs {
		q := &reqs[i]
		out[i] = tier.Answer{Status: tier.Absent, Partition: -1}
		for m := q.Mask; m != 0; m &^= 1 << (63 - bits.LeadingZeros64(m)) {
			part := q.Oldest + int64(63-bits.LeadingZeros64(m))
			k := appendRecordKey((*bp)[:0], part, q.NS, q.Key)
			*bp = k
			it, err := its.of(part)
			if err != nil {
				return err
			}
			found := it.SeekPrefixGE(k)
			if err := it.Error(); err != nil {
				return s.fail(err)
			}
			if !found || !bytes.Equal(it.Key(), k) {
				continue
			}
			raw, err := it.ValueAndErr()
			if err != nil {
				return s.fail(err)
			}
			v, err := decodeValue(raw)
			if err != nil {
				return s.fail(err)
			}
			switch v.State {
			case StateCommitted:
				out[i] = tier.Answer{Status: tier.Committed, Partition: part, Digest: v.Digest, At: v.At}
				if v.Result != nil {
					out[i].Result = bytes.Clone(v.Result) // v aliases the iterator's buffer
				}
			case StateReleased:
				out[i] = tier.Answer{Status: tier.Released, Partition: part, Attempts: v.Attempts}
			default:
				continue
			}
			break
		}
	}
	return nil
}

// ScanWrites calls fn for each of the caller's records (written by
// CommitWith) whose key starts with prefix, in key order; key and value are
// valid only during the call. A read failure latches, as in Claim.
func (s *Store) ScanWrites(prefix []byte, fn func(key, value []byte) error) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	lo := append([]byte{spaceUser}, prefix...)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
	if err != nil {
		return s.fail(err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return s.fail(err)
		}
		if err := fn(it.Key()[1:], v); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return s.fail(err)
	}
	return nil
}

// prefixEnd returns the smallest key above every key starting with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// Scan calls fn for every committed record in partitions [from, to),
// in key order. ns and key alias Pebble's buffers and are valid only during
// the call. It stops at the first error fn returns, or when ctx ends. A
// read failure or a corrupt key latches, as in Claim.
func (s *Store) Scan(ctx context.Context, from, to int64, fn func(partition int64, ns, key []byte) error) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	if to <= from {
		return nil
	}
	defer s.guard(&err)
	// The hot iterator before coldUpTo is read, the cold one after (see
	// iters).
	hot, err := s.db.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(from), UpperBound: recordPrefix(to)})
	if err != nil {
		return s.fail(err)
	}
	defer hot.Close()
	if split := s.coldUpTo.Load() + 1; split > from {
		cold, err := s.cold.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(from), UpperBound: recordPrefix(min(split, to))})
		if err != nil {
			return s.fail(err)
		}
		defer cold.Close()
		if err := s.scan(ctx, cold, cold.First(), fn); err != nil {
			return err
		}
		if split >= to {
			return nil
		}
		return s.scan(ctx, hot, hot.SeekGE(recordPrefix(split)), fn)
	}
	return s.scan(ctx, hot, hot.First(), fn)
}

// scan is Scan over one database's iterator, positioned at its first
// record (ok false when there is none) and read to its upper bound.
func (s *Store) scan(ctx context.Context, it *pebble.Iterator, ok bool, fn func(partition int64, ns, key []byte) error) error {
	n := 0
	for ; ok; ok = it.Next() {
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		part, ns, key, err := parseRecordKey(it.Key())
		if err != nil {
			return s.fail(err)
		}
		if err := fn(part, ns, key); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return s.fail(err)
	}
	return nil
}

// ScanRecords calls fn for every committed record of partition p, in key
// order, from whichever database holds it (tier.RecordScanner). Attempt
// counts are left out. The record's slices alias Pebble's buffers.
func (s *Store) ScanRecords(ctx context.Context, p int64, fn func(*tier.Record) error) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	its, err := s.newIters(&pebble.IterOptions{LowerBound: recordPrefix(p), UpperBound: recordPrefix(p + 1)})
	if err != nil {
		return err
	}
	defer its.close()
	it, err := its.of(p)
	if err != nil {
		return err
	}
	var r tier.Record
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		_, ns, key, err := parseRecordKey(it.Key())
		if err != nil {
			return s.fail(err)
		}
		raw, err := it.ValueAndErr()
		if err != nil {
			return s.fail(err)
		}
		v, err := decodeValue(raw)
		if err != nil {
			return s.fail(err)
		}
		if v.State != StateCommitted {
			continue
		}
		r = tier.Record{NS: ns, Key: key, Digest: v.Digest, At: v.At, Result: v.Result}
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return s.fail(err)
	}
	return nil
}
