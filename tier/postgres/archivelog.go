package postgres

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// Secret returns the archive's fingerprint secret.
func (ar *pgArchive) Secret() [16]byte { return ar.secret }

// Applied reads the last position applied and the first partition not
// sealed.
func (ar *pgArchive) Applied(ctx context.Context) (tier.LogPos, int64, error) {
	var ms, seq, next int64
	if err := queryRow(ctx, ar.db, `SELECT ms, seq, sealed_next FROM `+ar.t+`_log WHERE id = 1`, []any{&ms, &seq, &next}); err != nil {
		return tier.LogPos{}, 0, unavailable("archive log position", err)
	}
	return tier.LogPos{MS: uint64(ms), Seq: uint64(seq)}, next, nil
}

// Start sets the first partition not sealed, once.
func (ar *pgArchive) Start(ctx context.Context, p int64) (int64, error) {
	if _, err := ar.db.Exec(ctx, `UPDATE `+ar.t+`_log SET sealed_next = $1 WHERE id = 1 AND sealed_next < 0`, p); err != nil {
		return 0, unavailable("archive start", err)
	}
	_, next, err := ar.Applied(ctx)
	return next, err
}

// lockLog locks the log row for the transaction and reads it: Apply and
// Seal are serialised across every process.
func (ar *pgArchive) lockLog(ctx context.Context, tx pgx.Tx) (tier.LogPos, int64, error) {
	var ms, seq, next int64
	row := tx.QueryRow(ctx, `SELECT ms, seq, sealed_next FROM `+ar.t+`_log WHERE id = 1 FOR UPDATE`)
	if err := row.Scan(&ms, &seq, &next); err != nil {
		return tier.LogPos{}, 0, err
	}
	return tier.LogPos{MS: uint64(ms), Seq: uint64(seq)}, next, nil
}

// ensurePart creates partition p's table, attached, if it does not exist.
func (ar *pgArchive) ensurePart(ctx context.Context, tx pgx.Tx, p int64) error {
	ps := strconv.FormatInt(p, 10)
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ar.part(p)+` PARTITION OF `+ar.t+` FOR VALUES IN (`+ps+`)`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+ar.t+`_open VALUES (`+ps+`) ON CONFLICT DO NOTHING`)
	return err
}

// Apply applies the entries after the recorded position in one
// transaction. Within the batch a key's final state is what applying its
// entries one by one leaves: removed if it has a forget, then added by
// each commit after its last forget.
func (ar *pgArchive) Apply(ctx context.Context, entries []tier.LogEntry) error {
	tx, err := ar.db.Begin(ctx)
	if err != nil {
		return unavailable("archive apply", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	pos, next, err := ar.lockLog(ctx, tx)
	if err != nil {
		return unavailable("archive apply", err)
	}
	k := 0
	for k < len(entries) && !pos.Less(entries[k].Pos) {
		k++ // applied already
	}
	entries = entries[k:]
	if len(entries) == 0 {
		return nil
	}
	lastForget := map[string]int{}
	for i := range entries {
		if e := &entries[i]; e.Forget {
			lastForget[string(e.Record.NS)+"\x00"+string(e.Record.Key)] = i
		}
	}
	var fns, fkeys [][]byte
	for _, i := range lastForget {
		stored, full := archivedKey(entries[i].Record.Key)
		fns, fkeys = append(fns, entries[i].Record.NS), append(fkeys, stored)
		if full != nil {
			fns, fkeys = append(fns, entries[i].Record.NS), append(fkeys, full) // a row of an earlier version
		}
	}
	var parts []int64
	var ns, keys, digests, results, fulls [][]byte
	var ats []*int64
	made := map[int64]bool{}
	for i := range entries {
		e := &entries[i]
		if e.Forget {
			continue
		}
		if j, ok := lastForget[string(e.Record.NS)+"\x00"+string(e.Record.Key)]; ok && j > i {
			continue
		}
		p := max(e.Partition, next) // a sealed partition takes no key: its filter is written
		if !made[p] {
			if err := ar.ensurePart(ctx, tx, p); err != nil {
				return unavailable("archive apply", err)
			}
			made[p] = true
		}
		stored, full := archivedKey(e.Record.Key)
		parts, ns, keys, fulls = append(parts, p), append(ns, e.Record.NS), append(keys, stored), append(fulls, full)
		var d []byte
		if e.Record.Digest != (tier.Digest{}) {
			d = e.Record.Digest[:]
		}
		digests, results = append(digests, d), append(results, e.Record.Result)
		at := e.Record.At
		ats = append(ats, &at)
	}
	if len(fns) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM `+ar.t+` a USING unnest($1::bytea[], $2::bytea[]) AS q(ns, key) WHERE a.ns = q.ns AND a.key = q.key`, fns, fkeys); err != nil {
			return unavailable("archive apply", err)
		}
	}
	// One statement per at most statementBytes of rows: PostgreSQL
	// refuses a message over 1 GiB, and a backlog of large results would
	// otherwise fail every drain.
	for lo := 0; lo < len(parts); {
		hi, size := lo, 0
		for hi < len(parts) && (hi == lo || size+rowBytes(ns[hi], keys[hi], results[hi], fulls[hi]) <= statementBytes) {
			size += rowBytes(ns[hi], keys[hi], results[hi], fulls[hi])
			hi++
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ar.t+` (part, ns, key, digest, at, result, full_key)
SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], $6::bytea[], $7::bytea[]) ON CONFLICT DO NOTHING`,
			parts[lo:hi], ns[lo:hi], keys[lo:hi], digests[lo:hi], ats[lo:hi], results[lo:hi], fulls[lo:hi]); err != nil {
			return unavailable("archive apply", err)
		}
		lo = hi
	}
	last := entries[len(entries)-1].Pos
	if _, err := tx.Exec(ctx, `UPDATE `+ar.t+`_log SET ms = $1, seq = $2 WHERE id = 1`, int64(last.MS), int64(last.Seq)); err != nil {
		return unavailable("archive apply", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable("archive apply", err)
	}
	return nil
}

// Seal records p, and every open partition before it, as whole.
func (ar *pgArchive) Seal(ctx context.Context, p int64) error {
	tx, err := ar.db.Begin(ctx)
	if err != nil {
		return unavailable("archive seal", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, next, err := ar.lockLog(ctx, tx)
	if err != nil {
		return unavailable("archive seal", err)
	}
	if p < next {
		return nil
	}
	if err := ar.ensurePart(ctx, tx, p); err != nil {
		return unavailable("archive seal", err)
	}
	ps := strconv.FormatInt(p, 10)
	for _, stmt := range []string{
		`INSERT INTO ` + ar.t + `_parts SELECT o.part, (SELECT count(*) FROM ` + ar.t + ` a WHERE a.part = o.part) FROM ` + ar.t + `_open o WHERE o.part <= ` + ps + ` ON CONFLICT DO NOTHING`,
		`DELETE FROM ` + ar.t + `_open WHERE part <= ` + ps,
		`UPDATE ` + ar.t + `_log SET sealed_next = ` + strconv.FormatInt(p+1, 10) + ` WHERE id = 1`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return unavailable("archive seal", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable("archive seal", err)
	}
	return nil
}

// openParts lists the partitions created by Apply and not sealed yet.
func (ar *pgArchive) openParts(ctx context.Context) ([]int64, error) {
	rows, err := ar.db.Query(ctx, `SELECT part FROM `+ar.t+`_open ORDER BY part`)
	if err == nil {
		var out []int64
		if out, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err == nil {
			return out, nil
		}
	}
	return nil, unavailable("archive open partitions", fmt.Errorf("%w", err))
}

var _ tier.ArchiveAppender = (*pgArchive)(nil)

// statementBytes bounds the rows one statement carries (a statement holds
// at least one row, which MaxResultSize and the key limit keep to a few
// MiB): far below PostgreSQL's 1 GiB limit on a message, and large enough
// that a batch of small rows is one statement.
const statementBytes = 16 << 20

// rowBytes is about what a row's byte columns weigh in a statement.
func rowBytes(cols ...[]byte) int {
	n := 64 // the fixed columns and the arrays' framing
	for _, c := range cols {
		n += len(c) + 4
	}
	return n
}
