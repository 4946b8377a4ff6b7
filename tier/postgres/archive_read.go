package postgres

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// queryArrays returns the statement's arrays for qs: each query's key in
// its archived form, and a long key also as it is (a row an archive of an
// earlier version stored whole), both answering query i.
func queryArrays(qs []tier.ArchiveQuery) (idx []int32, ns, keys [][]byte, lo, hi []int64) {
	for i, q := range qs {
		stored, full := archivedKey(q.Key)
		forms := [][]byte{stored}
		if full != nil {
			forms = append(forms, full)
		}
		for _, k := range forms {
			idx = append(idx, int32(i))
			ns = append(ns, []byte(q.NS))
			keys = append(keys, k)
			lo = append(lo, q.From)
			hi = append(hi, q.To)
		}
	}
	return
}

// MaxArchivedKey is the longest key the archive stores as it is. A longer
// one is stored in the key column as its first 993 bytes and its SHA-256
// (1,025 bytes: longer than any key stored as it is, so the two forms
// never meet; a B-tree index entry holds at most about 2.7 kB, and the
// engine accepts keys of up to 64 KiB), and whole in full_key, which no
// index holds and Scan returns.
const MaxArchivedKey = 1024

// archivedKey returns key's form in the key column, and key itself as
// full when that form is not the key (nil otherwise).
func archivedKey(key []byte) (stored, full []byte) {
	if len(key) <= MaxArchivedKey {
		return key, nil
	}
	sum := sha256.Sum256(key)
	stored = make([]byte, 0, MaxArchivedKey+1)
	stored = append(append(stored, key[:MaxArchivedKey+1-len(sum)]...), sum[:]...)
	return stored, key
}

// found reads rows (i, part, digest, at, result) into out, the newest
// partition of each query winning, and, with pos, the row of query -1
// into pos (LookupApplied).
func found(rows pgx.Rows, out []tier.Answer, pos *tier.LogPos) error {
	defer rows.Close()
	for rows.Next() {
		var i int32
		var part int64
		var digest, result []byte
		var at *int64
		if err := rows.Scan(&i, &part, &digest, &at, &result); err != nil {
			return err
		}
		if i == -1 && pos != nil && at != nil && part >= 0 && *at >= 0 {
			*pos = tier.LogPos{MS: uint64(part), Seq: uint64(*at)}
			continue
		}
		if int(i) >= len(out) || i < 0 {
			return fmt.Errorf("row of query %d", i)
		}
		a := &out[i]
		if a.Status == tier.Committed && a.Partition >= part {
			continue
		}
		*a = tier.Answer{Status: tier.Committed, Partition: part, Result: result}
		if len(digest) == len(a.Digest) {
			copy(a.Digest[:], digest)
		}
		if at != nil {
			a.At = *at
		}
	}
	return rows.Err()
}

// spanned is every partition some query's span covers, ascending and
// once each: the statements' $6, a list the planner prunes the table's
// partitions with before it opens any. (A span compared with the row's
// partition inside the join prunes only as each row is read, after the
// executor has opened every partition of the table and its index: 0.9 ms
// a statement at 40 partitions, whatever the keys, against 0.35 ms with
// the list, measured on PostgreSQL 15.) Spans covering more than
// maxSpanned partitions give nil (SQL NULL): no list, every partition.
func spanned(qs []tier.ArchiveQuery) []int64 {
	spans := make([][2]int64, 0, len(qs))
	for _, q := range qs {
		if q.From < q.To {
			spans = append(spans, [2]int64{q.From, q.To})
		}
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	parts := []int64{}
	end := int64(math.MinInt64)
	for _, sp := range spans {
		lo := max(sp[0], end)
		if n := sp[1] - lo; sp[1] > lo && (n < 0 || n > int64(maxSpanned-len(parts))) {
			return nil // n < 0: the difference overflowed
		}
		for p := lo; p < sp[1]; p++ {
			parts = append(parts, p)
		}
		end = max(end, sp[1])
	}
	return parts
}

// maxSpanned bounds spanned's list: more than an archive window of
// hourly partitions over a year.
const maxSpanned = 1 << 14

// Lookup reads each query's rows in its span, one statement for the batch;
// found keeps each query's newest.
func (ar *pgArchive) Lookup(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	return ar.queries(ctx, "archive lookup", ar.lookupSQL(), qs, out, nil)
}

func (ar *pgArchive) lookupSQL() string {
	return `SELECT q.i, a.part, a.digest, a.at, a.result
FROM unnest($1::int[], $2::bytea[], $3::bytea[], $4::bigint[], $5::bigint[]) AS q(i, ns, key, lo, hi)
JOIN ` + ar.t + ` a ON a.ns = q.ns AND a.key = q.key AND a.part >= q.lo AND a.part < q.hi
WHERE ($6::bigint[] IS NULL OR a.part = ANY($6::bigint[]))`
}

// LookupApplied is Lookup, whose one statement also reads the log
// position applied (a row of query -1: the position's ms as its part, its
// seq as its at), so the answers and the position are of one snapshot:
// every entry at or before the position is in the answers.
func (ar *pgArchive) LookupApplied(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) (tier.LogPos, error) {
	var pos tier.LogPos
	err := ar.queries(ctx, "archive lookup", `SELECT -1, ms, NULL::bytea, seq, NULL::bytea FROM `+ar.t+`_log WHERE id = 1
UNION ALL
`+ar.lookupSQL(), qs, out, &pos)
	return pos, err
}

// Forget deletes each query's rows in its span, one statement for the
// batch.
func (ar *pgArchive) Forget(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	return ar.queries(ctx, "archive forget", `DELETE FROM `+ar.t+` a
USING unnest($1::int[], $2::bytea[], $3::bytea[], $4::bigint[], $5::bigint[]) AS q(i, ns, key, lo, hi)
WHERE a.ns = q.ns AND a.key = q.key AND a.part >= q.lo AND a.part < q.hi
  AND ($6::bigint[] IS NULL OR a.part = ANY($6::bigint[]))
RETURNING q.i, a.part, a.digest, a.at, a.result`, qs, out, nil)
}

// queries runs sql, a statement over the arrays of qs (queryArrays) and
// the partitions they span (spanned) that returns the rows found as found
// reads them, into out (Absent where none).
func (ar *pgArchive) queries(ctx context.Context, what, sql string, qs []tier.ArchiveQuery, out []tier.Answer, pos *tier.LogPos) error {
	if len(out) != len(qs) {
		return fmt.Errorf("%w: %d answers for %d queries", tier.ErrOptions, len(out), len(qs))
	}
	for i := range out {
		out[i] = tier.Answer{Status: tier.Absent, Partition: -1}
	}
	if len(qs) == 0 {
		return nil
	}
	idx, ns, keys, lo, hi := queryArrays(qs)
	rows, err := ar.db.Query(ctx, sql, idx, ns, keys, lo, hi, spanned(qs))
	if err != nil {
		return unavailable(what, err)
	}
	if err := found(rows, out, pos); err != nil {
		return unavailable(what, err)
	}
	return nil
}

// Scan reads partition p's keys.
func (ar *pgArchive) Scan(ctx context.Context, p int64, fn func(ns, key []byte) error) error {
	rows, err := ar.db.Query(ctx, `SELECT ns, COALESCE(full_key, key) FROM `+ar.t+` WHERE part = $1`, p)
	if err != nil {
		return unavailable("archive scan", err)
	}
	defer rows.Close()
	for rows.Next() {
		var ns, key []byte
		if err := rows.Scan(&ns, &key); err != nil {
			return unavailable("archive scan", err)
		}
		if err := fn(ns, key); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return unavailable("archive scan", err)
	}
	return nil
}
