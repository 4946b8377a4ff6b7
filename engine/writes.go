package engine

import (
	"context"

	"github.com/tierdedup/tierdedup/tier"
)

// Write is a caller's own key and value for CommitBatchWith.
type Write = tier.Write

// CommitBatchWith is CommitBatch that also writes the caller's records in
// the same atomic, durable batch of the embedded store (Default only): the
// effect of processing a message (a ledger entry, an outbox row, a new
// balance) and the mark that it was processed become durable together, so a
// crash can leave neither half without the other. The caller's keyspace is
// separate from the dedup keys and never expired; read it with ScanWrites.
// A batch with no New claim (every message a duplicate) still writes the
// records, durably, so a consumed offset stored with them advances. If
// there were New claims and every one lost its lease, nothing is written
// and the error matches ErrLeaseLost: the records describe work whose
// claims are void.
func (e *Engine) CommitBatchWith(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	if err := e.serve(NeedWrites, "CommitBatchWith"); err != nil {
		return err
	}
	if err := e.checkResults(claims); err != nil {
		return err
	}
	return e.queued(ctx, claims, errs, writes)
}

// ScanWrites calls fn for each record written by CommitBatchWith whose key
// starts with prefix, in key order; key and value are valid only during the
// call. A read failure is ErrStorage and latches, as for claims.
func (e *Engine) ScanWrites(prefix []byte, fn func(key, value []byte) error) error {
	if err := e.serve(NeedWrites, "ScanWrites"); err != nil {
		return err
	}
	return e.unlessClosed(func() error {
		var fnErr error // the caller's own error, returned as it is
		err := e.writer.ScanWrites(prefix, func(key, value []byte) error {
			fnErr = fn(key, value)
			return fnErr
		})
		if err != nil && fnErr == nil {
			e.stats.errors.Add(1)
			return e.tierError(err)
		}
		return err
	})
}
