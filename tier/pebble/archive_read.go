package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

// span returns the held partitions in [from, to), newest first.
func (ar *archive) span(from, to int64) []int64 {
	held := *ar.held.Load()
	i, _ := slices.BinarySearch(held, from)
	j, _ := slices.BinarySearch(held, to)
	out := slices.Clone(held[i:j])
	slices.Reverse(out)
	return out
}

// Lookup reads each query's newest record in its span.
func (ar *archive) Lookup(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	return ar.lookup(ctx, qs, out, nil)
}

func (ar *archive) lookup(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer, del *pebble.Batch) error {
	if err := ar.usable(); err != nil {
		return err
	}
	if len(out) != len(qs) {
		return fmt.Errorf("%w: %d answers for %d queries", tier.ErrOptions, len(out), len(qs))
	}
	var k []byte
	for i := range qs {
		q := &qs[i]
		out[i] = tier.Answer{Status: tier.Absent, Partition: -1}
		for _, p := range ar.span(q.From, q.To) {
			k = appendRecordKey(k[:0], p, q.NS, q.Key)
			raw, closer, err := ar.db.Get(k)
			if errors.Is(err, pebble.ErrNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%w: %w", tier.ErrStorage, err)
			}
			v, derr := decodeValue(raw)
			if derr == nil && v.State != StateCommitted {
				derr = fmt.Errorf("%w: archived state %d", ErrCorrupt, v.State)
			}
			if derr != nil {
				closer.Close()
				return fmt.Errorf("%w: %w", tier.ErrStorage, derr)
			}
			if out[i].Status == tier.Absent {
				out[i] = tier.Answer{Status: tier.Committed, Partition: p, Digest: v.Digest, At: v.At}
				if v.Result != nil {
					out[i].Result = bytes.Clone(v.Result)
				}
			}
			closer.Close()
			if del == nil {
				break
			}
			if err := del.Delete(k, nil); err != nil {
				return fmt.Errorf("%w: %w", tier.ErrStorage, err)
			}
		}
	}
	return ctx.Err()
}

// Forget deletes each query's records in its span, synced.
func (ar *archive) Forget(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	b := ar.db.NewBatch()
	defer b.Close()
	if err := ar.lookup(ctx, qs, out, b); err != nil {
		return err
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// Scan reads partition p's keys.
func (ar *archive) Scan(ctx context.Context, p int64, fn func(ns, key []byte) error) error {
	if err := ar.usable(); err != nil {
		return err
	}
	if !ar.has(p) {
		return nil
	}
	it, err := ar.db.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(p), UpperBound: recordPrefix(p + 1)})
	if err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		_, ns, key, err := parseRecordKey(it.Key())
		if err != nil {
			return fmt.Errorf("%w: %w", tier.ErrStorage, err)
		}
		if err := fn(ns, key); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}
