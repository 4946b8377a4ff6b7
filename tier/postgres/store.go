package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tierdedup/tierdedup/tier"
)

// Errors returned by a Store; match them with errors.Is.
var (
	// ErrUnavailable wraps every failure to reach PostgreSQL or run a
	// statement: the outcome of the call is unknown for every key of it.
	ErrUnavailable = errors.New("postgres: unavailable")
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("postgres: invalid options")
	// ErrLayout reports a table whose recorded window or MaxAttempts differ
	// from the Options: processes sharing a table must agree on them.
	ErrLayout = errors.New("postgres: table layout mismatch")
)

// DB is what a Store needs of its database handle: a *pgxpool.Pool (safe
// for concurrent use, which the engine needs), or anything else that runs
// a query. The Store never closes it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Options configure a Store.
type Options struct {
	// Table is the table of dedup rows, created if missing; several
	// deployments sharing a database use several tables. Zero means
	// "tierdedup". Letters, digits and underscores only.
	Table string
	// Window is how long a committed key stays a duplicate; required.
	Window time.Duration
	// MaxAttempts, when positive, counts each key's releases and lease
	// takeovers, and answers Poisoned once the count reaches it.
	MaxAttempts int
	// Uncached records that every process sharing the table keeps no
	// commits cached in memory (the engine's Options.NoSharedCache, which
	// Forget needs): the layout records it, so a process that caches is
	// refused rather than answering Duplicate for a key another forgot.
	Uncached bool
	// SweepBlocks is how many of the table's 8 KiB blocks one statement of
	// a sweep deletes expired rows from (see Store.Drop): the rows it
	// deletes are locked only for that statement, so a claim of an expired
	// key waits at most that long. Zero means 4096 (32 MiB).
	SweepBlocks int
}

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Table != "" && !tableName.MatchString(o.Table) {
		errs = append(errs, fmt.Errorf("%w: Table %q: letters, digits and underscores, at most 63", ErrOptions, o.Table))
	}
	if o.Window < time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: Window %v is below a millisecond", ErrOptions, o.Window))
	}
	if err := tier.CheckAttempts(o.MaxAttempts); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrOptions, err))
	}
	if o.SweepBlocks < 0 || o.SweepBlocks > 1<<20 {
		errs = append(errs, fmt.Errorf("%w: SweepBlocks %d is outside [0, %d]", ErrOptions, o.SweepBlocks, 1<<20))
	}
	return errors.Join(errs...)
}

// Store is a shared exact tier in one PostgreSQL table: a row per key,
// holding a claim (its owner token and lease end), a commit (its token and
// digest, and its result if it stored one) or an attempt count, each with
// its expiry. Every time is the
// server's clock, so processes whose clocks differ agree on leases. A
// Store is safe for concurrent use if its DB is.
type Store struct {
	db                                                               DB
	table                                                            string
	window                                                           time.Duration
	max                                                              int
	claimQ, markQ, stateQ, commitQ, releaseQ, extendQ, sizeQ, sweepQ string
	forgetQ                                                          string
	sweeps                                                           sweeper
	uncached                                                         bool // Options.Uncached, recorded in the layout
}

// New returns a Store over db, creating its table if needed.
func New(ctx context.Context, db DB, opts *Options) (*Store, error) {
	if opts == nil {
		return nil, fmt.Errorf("%w: nil options", ErrOptions)
	}
	o := *opts
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Table == "" {
		o.Table = "tierdedup"
	}
	if o.SweepBlocks == 0 {
		o.SweepBlocks = 4096
	}
	// Quoted: a valid name may still be a reserved word ("user").
	s := &Store{db: db, table: pgx.Identifier{o.Table}.Sanitize(), window: o.Window, max: o.MaxAttempts, uncached: o.Uncached}
	s.sweeps.init(int64(o.SweepBlocks))
	s.prepare()
	// Processes starting together race to create the table; PostgreSQL's
	// IF NOT EXISTS does not settle that race (a unique violation in its
	// catalog), so a creation that lost it is tried again, and then finds
	// the table.
	create := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		ns bytea NOT NULL, key bytea NOT NULL,
		state "char" NOT NULL, -- 'C' claimed, 'D' committed, 'R' released (a count only)
		token bytea NOT NULL, lease_until bigint NOT NULL, attempts integer NOT NULL,
		digest bytea, expires bigint NOT NULL,
		taken_over boolean NOT NULL DEFAULT false, -- the last claim took over an ended lease
		PRIMARY KEY (ns, key))`, s.table)
	for try := 0; ; try++ {
		_, err := db.Exec(ctx, create)
		var pe *pgconn.PgError
		if err != nil && try < 3 && errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P07") {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: creating %s: %w", ErrUnavailable, s.table, err)
		}
		break
	}
	if err := s.checkLayout(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// layoutVersion is the format of the rows: 2 stores every key with a
// one-byte form (see appendStoredKey).
const layoutVersion = 2

// columnNames are the table's columns; a table of that name without them
// is not one this Store can use.
var columnNames = []string{"ns", "key", "state", "token", "lease_until", "attempts", "digest", "expires", "taken_over"}

// checkLayout records the table's format, window and MaxAttempts in its
// comment (dropped with the table, so it never outlives the rows it
// describes) on first use, and refuses a Store whose Options disagree. A
// table without a comment is recorded only while it is empty and has every
// column: rows of unknown format are never trusted. To change the options,
// stop every process on the table and drop it, or use a new table.
func (s *Store) checkLayout(ctx context.Context) error {
	want := fmt.Sprintf("tierdedup layout %d window=%dms max-attempts=%d", layoutVersion, s.window.Milliseconds(), s.max)
	if s.uncached {
		want += " uncached"
	}
	var got *string
	var columns int64
	var empty bool
	read := func() error {
		return s.run(ctx, func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&got, &columns, &empty); err != nil {
					return err
				}
			}
			return nil
		}, fmt.Sprintf(`SELECT obj_description($1::regclass, 'pg_class'),
	(SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = ANY($2) AND NOT attisdropped),
	NOT EXISTS (SELECT 1 FROM %s)`, s.table), s.table, columnNames)
	}
	err := read()
	if err == nil && got == nil {
		if columns != int64(len(columnNames)) {
			return fmt.Errorf("%w: table %s records no layout and has %d of the %d columns", ErrLayout, s.table, columns, len(columnNames))
		}
		if !empty {
			return fmt.Errorf("%w: table %s records no layout and holds rows of an unknown format", ErrLayout, s.table)
		}
		// First use: record it under a lock, so of two processes opening
		// with different options one records and the other is refused.
		_, err = s.db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
	LOCK TABLE %[1]s IN SHARE ROW EXCLUSIVE MODE;
	IF obj_description('%[1]s'::regclass, 'pg_class') IS NULL THEN
		COMMENT ON TABLE %[1]s IS '%[2]s';
	END IF;
END $$`, s.table, want))
		if err == nil {
			err = read()
		}
	}
	if err != nil {
		return fmt.Errorf("%w: the layout of %s: %w", ErrUnavailable, s.table, err)
	}
	if got == nil || *got != want {
		return fmt.Errorf("%w: table %s records %q, these options %q", ErrLayout, s.table, deref(got), want)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Claims reports where claims live: in the table, shared by every process.
func (s *Store) Claims() tier.Where { return tier.ClaimsInStore }

// Close stops a sweep in progress and waits for it; the DB stays the
// caller's.
func (s *Store) Close() error {
	s.sweeps.stop()
	return nil
}

// now is the server's clock in milliseconds, read once per statement.
const now = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

// taking is the end of a claim or mark statement: which rows it takes
// (expired, a count below the limit, this token's claim, or a claim whose
// lease ended, counted as an attempt) and what it returns. clock is the
// statement's reading of the server clock, in milliseconds.
func taking(clock string) string {
	return strings.NewReplacer("NOW", clock).Replace(`	attempts = CASE
		WHEN t.expires <= NOW THEN 0
		WHEN t.state = 'C' AND t.token <> EXCLUDED.token THEN t.attempts + 1
		ELSE t.attempts END,
	taken_over = t.expires > NOW AND t.state = 'C' AND t.token <> EXCLUDED.token
WHERE t.expires <= NOW
   OR (t.state = 'R' AND ($6 = 0 OR t.attempts < $6))
   OR (t.state = 'C' AND t.token = EXCLUDED.token)
   OR (t.state = 'C' AND t.lease_until <= NOW AND ($6 = 0 OR t.attempts + 1 < $6))
RETURNING t.ns, t.key, t.attempts, t.taken_over`)
}

func (s *Store) prepare() {
	// Claim: one INSERT … ON CONFLICT for the batch, in key order (two
	// batches locking rows in one order cannot deadlock). A row is taken
	// when it expired, when it is free (a count below the limit), or when
	// it is a claim of this token or one whose lease ended (a takeover,
	// counted). It returns the rows it took; the others (held, committed
	// or poisoned) are read by stateQ, only when there are any.
	s.claimQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms)
INSERT INTO %[1]s AS t (ns, key, state, token, lease_until, attempts, digest, expires, taken_over)
SELECT r.ns, r.key, 'C', r.token, c.ms + $4, 0, NULL, c.ms + GREATEST($4, $5), false
FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) AS r(ns, key, token), c ORDER BY r.ns, r.key
ON CONFLICT (ns, key) DO UPDATE SET
	state = 'C', token = EXCLUDED.token, lease_until = EXCLUDED.lease_until, digest = NULL,
	expires = GREATEST(t.expires, EXCLUDED.expires),
%[3]s`, s.table, now, taking("EXCLUDED.lease_until - $4"))
	// Mark: Claim, with every key it takes committed at once.
	s.markQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms)
INSERT INTO %[1]s AS t (ns, key, state, token, lease_until, attempts, digest, expires, taken_over)
SELECT r.ns, r.key, 'D', r.token, 0, 0, NULLIF(r.digest, '\x'::bytea), c.ms + $5, false
FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[]) AS r(ns, key, token, digest), c ORDER BY r.ns, r.key
ON CONFLICT (ns, key) DO UPDATE SET
	state = 'D', token = EXCLUDED.token, lease_until = 0, digest = EXCLUDED.digest,
	expires = EXCLUDED.expires,
%[3]s`, s.table, now, taking("EXCLUDED.expires - $5"))
	s.stateQ = fmt.Sprintf(`
SELECT t.ns, t.key, t.state::text, t.token, t.lease_until, t.attempts, t.digest, t.expires, %[2]s
FROM %[1]s t JOIN unnest($1::bytea[], $2::bytea[]) AS r(ns, key) ON t.ns = r.ns AND t.key = r.key`, s.table, now)
	// Commit: the claim of this token, unexpired, becomes a commit for the
	// window; a commit this token already made stays (a retry).
	s.commitQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[]) WITH ORDINALITY AS r(ns, key, token, digest, i)),
up AS (
	UPDATE %[1]s AS t SET state = 'D', digest = NULLIF(r.digest, '\x'::bytea), lease_until = 0,
		expires = CASE WHEN t.state = 'D' THEN t.expires ELSE c.ms + $5 END
	FROM r, c
	WHERE t.ns = r.ns AND t.key = r.key AND t.token = r.token AND t.expires > c.ms
	  AND ((t.state = 'C' AND t.lease_until > c.ms) OR t.state = 'D')
	RETURNING r.i)
SELECT i FROM up`, s.table, now)
	// Release: the claim of this token, unexpired, ends. Counted ($4 = 1),
	// the row goes, or with MaxAttempts ($6) keeps its count, one more, as
	// a released row. A give-back ($5 = 1) counts nothing, also undoes a
	// commit of this token, and keeps a count the row had.
	s.releaseQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(ns, key, token, i)),
del AS (
	DELETE FROM %[1]s AS t USING r, c
	WHERE t.ns = r.ns AND t.key = r.key AND t.token = r.token AND t.expires > c.ms
	  AND (($4 = 1 AND $6 = 0) OR ($5 = 1 AND t.attempts = 0))
	  AND ((t.state = 'C' AND t.lease_until > c.ms) OR ($5 = 1 AND t.state = 'D'))
	RETURNING r.i),
up AS (
	UPDATE %[1]s AS t SET state = 'R', token = '\x'::bytea, lease_until = 0, digest = NULL, attempts = t.attempts + $4
	FROM r, c
	WHERE t.ns = r.ns AND t.key = r.key AND t.token = r.token AND t.expires > c.ms
	  AND NOT (($4 = 1 AND $6 = 0) OR ($5 = 1 AND t.attempts = 0))
	  AND ((t.state = 'C' AND t.lease_until > c.ms) OR ($5 = 1 AND t.state = 'D'))
	RETURNING r.i)
SELECT i FROM del UNION ALL SELECT i FROM up`, s.table, now)
	// Extend: the caller's live claims last $4 ms from now, unless longer.
	s.extendQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(ns, key, token, i))
UPDATE %[1]s AS t SET lease_until = GREATEST(t.lease_until, c.ms + $4), expires = GREATEST(t.expires, c.ms + $4)
FROM r, c
WHERE t.ns = r.ns AND t.key = r.key AND t.token = r.token AND t.state = 'C'
  AND t.lease_until > c.ms AND t.expires > c.ms
RETURNING r.i`, s.table, now)
	// Forget: every row of the batch goes unless a live claim holds it;
	// every row is returned as it stood when locked, read as stateQ's.
	// The rows are locked first (in key order), so the row judged is the
	// row deleted or kept: under READ COMMITTED a plain DELETE re-checks
	// a row a concurrent claim changed while a SELECT beside it reads the
	// statement's snapshot, and a key claimed meanwhile was then neither
	// deleted nor returned (read as absent, its attempts lost).
	s.forgetQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[]) AS r(ns, key)),
cur AS (
	SELECT t.ns, t.key, t.state, t.token, t.lease_until, t.attempts, t.digest, t.expires
	FROM %[1]s t JOIN r ON t.ns = r.ns AND t.key = r.key
	ORDER BY t.ns, t.key FOR UPDATE OF t),
del AS (
	DELETE FROM %[1]s AS t USING cur, c
	WHERE t.ns = cur.ns AND t.key = cur.key AND NOT (cur.state = 'C' AND cur.lease_until > c.ms AND cur.expires > c.ms))
SELECT cur.ns, cur.key, cur.state::text, cur.token, cur.lease_until, cur.attempts, cur.digest, cur.expires, c.ms
FROM cur, c`, s.table, now) // del runs to completion whether read or not
	s.sizeQ = fmt.Sprintf(`SELECT pg_relation_size('%s') / current_setting('block_size')::bigint`, s.table)
	// Sweep: the expired rows of blocks [$1, $2), found by a TID range
	// scan (no index on the write path).
	s.sweepQ = fmt.Sprintf(`DELETE FROM %s WHERE ctid >= format('(%%s,0)', $1::bigint)::tid AND ctid < format('(%%s,0)', $2::bigint)::tid AND expires <= %s`, s.table, now)
}

// committedColumn is the batch's digest column for Commit: a request's
// digest (empty for none), or with a result digest (zero for none) ‖ At
// (8 bytes, big endian) ‖ result, so a commit's result lives and expires
// with its row and every statement that clears the digest clears it too.
func committedColumn(reqs []tier.Request) [][]byte {
	col := digestColumn(reqs)
	for i := range reqs {
		if r := &reqs[i]; len(r.Result) > 0 {
			v := make([]byte, 0, len(r.Digest)+8+len(r.Result))
			v = append(v, r.Digest[:]...)
			v = binary.BigEndian.AppendUint64(v, uint64(r.At))
			col[i] = append(v, r.Result...)
		}
	}
	return col
}

// decodeCommitted reads a committed row's digest column into a.
func decodeCommitted(a *tier.Answer, col []byte) error {
	switch n := len(col); {
	case n == 0:
	case n == len(a.Digest):
		copy(a.Digest[:], col)
	case n > len(a.Digest)+8:
		copy(a.Digest[:], col)
		a.At = int64(binary.BigEndian.Uint64(col[16:24]))
		a.Result = col[24:] // pgx scans bytea into a fresh slice
	default:
		return fmt.Errorf("%w: digest column of %d bytes", ErrLayout, n)
	}
	return nil
}

// KeepsResults reports that a commit's result is stored with it.
func (s *Store) KeepsResults() bool { return true }

// digestColumn is the batch's digests, empty for none.
func digestColumn(reqs []tier.Request) [][]byte {
	digests := make([][]byte, len(reqs))
	for i := range reqs {
		digests[i] = []byte{}
		if reqs[i].Digest != (tier.Digest{}) {
			digests[i] = reqs[i].Digest[:]
		}
	}
	return digests
}

// columns splits a batch into the statement's arrays, keys in their
// stored form.
func columns(reqs []tier.Request) (ns, keys, tokens [][]byte) {
	ns, keys, tokens = make([][]byte, len(reqs)), make([][]byte, len(reqs)), make([][]byte, len(reqs))
	size := 0
	for i := range reqs {
		size += 1 + min(len(reqs[i].Key), sha256.Size+MaxStoredKey)
	}
	buf := make([]byte, 0, size) // one allocation for the batch's stored keys
	for i := range reqs {
		start := len(buf)
		buf = appendStoredKey(buf, reqs[i].Key)
		ns[i], keys[i], tokens[i] = []byte(reqs[i].NS), buf[start:len(buf):len(buf)], reqs[i].Token[:]
	}
	return ns, keys, tokens
}

// MaxStoredKey is the longest key stored as it is; a longer one is stored
// as its SHA-256 (a B-tree index entry holds at most about 2.7 kB, and the
// engine accepts keys up to 64 KiB).
const MaxStoredKey = 1024

// appendStoredKey appends a key's form in the table: 0x00 and the key, or, over
// MaxStoredKey bytes, 0x01 and its SHA-256. The first byte keeps the two
// forms apart, so no short key can equal a long key's digest; SHA-256 is
// collision resistant, so nobody can make two long keys that collide.
func appendStoredKey(buf, key []byte) []byte {
	if len(key) > MaxStoredKey {
		sum := sha256.Sum256(key)
		return append(append(buf, 1), sum[:]...)
	}
	return append(append(buf, 0), key...)
}

// Claim claims every key for lease, in one statement; out must have
// len(reqs), and no key may appear twice in reqs. Answers: Acquired (with
// the count the claim carries, and Expired when it took over a lease that
// ended), Held, Committed (with the committer's Token and the Digest) or
// Poisoned. Partition is -1: rows expire by the table's own clock. On error
// nothing is known: some keys may hold the caller's claims until their
// lease ends (a retry with the same tokens acquires them again).
func (s *Store) Claim(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Answer) error {
	if len(reqs) == 0 {
		return nil
	}
	return s.take(ctx, reqs, out, func(reqs []tier.Request) (string, []any) {
		ns, keys, tokens := columns(reqs)
		return s.claimQ, []any{ns, keys, tokens, max(lease.Milliseconds(), 1), s.window.Milliseconds(), s.max}
	})
}

// Mark is Claim with every key it takes committed at once, with its digest
// (tier.Marker): one statement instead of a claim and a commit.
func (s *Store) Mark(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	if len(reqs) == 0 {
		return nil
	}
	return s.take(ctx, reqs, out, func(reqs []tier.Request) (string, []any) {
		ns, keys, tokens := columns(reqs)
		return s.markQ, []any{ns, keys, tokens, digestColumn(reqs), s.window.Milliseconds(), s.max}
	})
}

// takeRounds bounds how often take runs its statement again for keys whose
// row went (a Forget, an expiry) between the statement and the read of the
// keys it did not take: each further round needs another removal of the
// same key in that gap. A key still unsettled after them answers Held.
const takeRounds = 4

// take runs a claim or mark statement (stmt builds it for a batch), which
// returns the rows it took, and reads the others. A key it did not take
// whose row is gone or expired by the read was freed in between: it is
// not held by anyone, so the statement runs again for it rather than
// answer Held.
func (s *Store) take(ctx context.Context, reqs []tier.Request, out []tier.Answer, stmt func([]tier.Request) (string, []any)) error {
	again, err := s.takeOnce(ctx, reqs, out, stmt)
	for round := 1; round < takeRounds && err == nil && len(again) > 0; round++ {
		sub := make([]tier.Request, len(again))
		for q, i := range again {
			sub[q] = reqs[i]
		}
		subOut := make([]tier.Answer, len(sub))
		var next []int
		next, err = s.takeOnce(ctx, sub, subOut, stmt)
		for q, i := range again {
			out[i] = subOut[q]
		}
		for q, j := range next {
			next[q] = again[j]
		}
		again = next
	}
	return err
}

// takeOnce is one round of take; it returns the indices of the keys freed
// between its statement and its read (answered Held meanwhile).
func (s *Store) takeOnce(ctx context.Context, reqs []tier.Request, out []tier.Answer, stmt func([]tier.Request) (string, []any)) (freed []int, err error) {
	q, args := stmt(reqs)
	ns, keys := args[0].([][]byte), args[1].([][]byte)
	at := make(map[string]int, len(reqs)) // (ns, key) → index in reqs
	for i := range reqs {
		at[rowID(ns[i], keys[i])] = i
	}
	taken := 0
	err = s.run(ctx, func(rows pgx.Rows) error {
		taken = 0
		clear(out)
		for rows.Next() {
			var rns, rkey []byte
			var attempts int32
			var takenOver bool
			if err := rows.Scan(&rns, &rkey, &attempts, &takenOver); err != nil {
				return err
			}
			i, ok := at[rowID(rns, rkey)]
			if !ok || out[i].Status != 0 {
				return errors.New("an answer for a key not asked")
			}
			out[i] = tier.Answer{Status: tier.Acquired, Attempts: uint16(attempts), Expired: s.max > 0 && takenOver, Partition: -1}
			taken++
		}
		return nil
	}, q, args...)
	if err != nil || taken == len(reqs) {
		return nil, err
	}
	// The keys not taken: read as they stand now.
	var sns, skeys [][]byte
	read := make([]bool, len(reqs))
	for i := range reqs {
		if out[i].Status == 0 {
			sns, skeys = append(sns, ns[i]), append(skeys, keys[i])
			out[i] = tier.Answer{Status: tier.Held, Partition: -1} // unless the row says more
		} else {
			read[i] = true
		}
	}
	err = s.run(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			i, ok := at[rowID(r.ns, r.key)]
			if !ok || out[i].Status == tier.Acquired {
				continue
			}
			a := tier.Answer{Status: tier.Held, Partition: -1}
			switch {
			case r.expires <= r.ms:
				// Expired since the claim ran: free now, but not taken by
				// it: the statement runs again for it.
				continue
			case r.state == "D":
				if err := r.committed(&a); err != nil {
					return err
				}
			case s.max > 0 && (r.state == "R" && int(r.attempts) >= s.max ||
				r.state == "C" && r.leaseEnd <= r.ms && int(r.attempts)+1 >= s.max):
				a.Status, a.Attempts = tier.Poisoned, uint16(r.attempts)
				if r.state == "C" {
					a.Attempts++
					a.Expired = true
				}
			}
			out[i], read[i] = a, true
		}
		return nil
	}, s.stateQ, sns, skeys)
	if err != nil {
		return nil, err
	}
	for i, ok := range read {
		if !ok {
			freed = append(freed, i) // its row went since the statement
		}
	}
	return freed, nil
}

// Lookup answers each key without claiming it, in one statement: Absent,
// Held, Committed (with Token, Digest, Result and At), Released (its
// attempt count; a claim whose lease ended counts one more) or Poisoned.
func (s *Store) Lookup(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	return s.look(ctx, reqs, out, s.stateQ)
}

// Forget deletes each key's row unless a live claim holds it, in one
// statement, and answers what it found, as Lookup does.
func (s *Store) Forget(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	return s.look(ctx, reqs, out, s.forgetQ)
}

// look runs q (stateQ or forgetQ) over the batch and answers each key from
// its row; a key without one is Absent.
func (s *Store) look(ctx context.Context, reqs []tier.Request, out []tier.Answer, q string) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, _ := columns(reqs)
	at := make(map[string]int, len(reqs))
	for i := range reqs {
		at[rowID(ns[i], keys[i])] = i
	}
	return s.run(ctx, func(rows pgx.Rows) error {
		for i := range out {
			out[i] = tier.Answer{Status: tier.Absent, Partition: -1}
		}
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			i, ok := at[rowID(r.ns, r.key)]
			if !ok {
				continue
			}
			a := tier.Answer{Status: tier.Absent, Partition: -1}
			switch {
			case r.expires <= r.ms:
			case r.state == "D":
				if err := r.committed(&a); err != nil {
					return err
				}
			case r.state == "C" && r.leaseEnd > r.ms:
				a.Status = tier.Held
			default: // a count, or a claim whose lease ended (counted)
				n := int(r.attempts)
				if r.state == "C" && s.max > 0 {
					n++
				}
				a.Status, a.Attempts = tier.Released, uint16(min(n, tier.MaxAttempts))
				if s.max > 0 && n >= s.max {
					a.Status = tier.Poisoned
				}
			}
			out[i] = a
		}
		return nil
	}, q, ns, keys)
}

// row is one row as stateQ and forgetQ return it, with the statement's
// clock reading.
type row struct {
	ns, key, token, digest []byte
	state                  string
	leaseEnd, expires, ms  int64
	attempts               int32
}

// scanRow reads the current row of rows.
func scanRow(rows pgx.Rows) (row, error) {
	var r row
	err := rows.Scan(&r.ns, &r.key, &r.state, &r.token, &r.leaseEnd, &r.attempts, &r.digest, &r.expires, &r.ms)
	return r, err
}

// committed makes a the answer for a committed row: its token, digest,
// time and result.
func (r *row) committed(a *tier.Answer) error {
	a.Status = tier.Committed
	copy(a.Token[:], r.token)
	return decodeCommitted(a, r.digest)
}

// rowID is the map key of a row's (ns, key): the namespace's length
// first, so two pairs never run together.
func rowID(ns, key []byte) string {
	return string(append(append(binary.AppendUvarint(nil, uint64(len(ns))), ns...), key...))
}

// Commit turns each unexpired claim of its token into a commit for the
// window, in one statement; out[i] is OK or Lost. partition is not used. On
// error the outcome of each commit is unknown (a retry is safe: a commit
// that finds its own token's commit succeeds).
func (s *Store) Commit(ctx context.Context, _ int64, reqs []tier.Request, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	return s.statuses(ctx, out, s.commitQ, ns, keys, tokens, committedColumn(reqs), s.window.Milliseconds())
}

// Release frees each key its token still holds, in one statement; out[i]
// is OK or Lost. Counted (with MaxAttempts) the key keeps its attempt
// count, one more; with giveBack nothing is counted and a commit of the
// same token, applied although the caller was told it failed, is undone.
// partition is not used.
func (s *Store) Release(ctx context.Context, _ int64, reqs []tier.Request, giveBack bool, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	count, undo := 1, 0
	if giveBack {
		count, undo = 0, 1
	}
	return s.statuses(ctx, out, s.releaseQ, ns, keys, tokens, count, undo, s.max)
}

// Extend makes each claim that reqs[i].Token holds, unexpired, last lease
// from now unless it lasts longer, in one statement; out[i] is OK or Lost.
func (s *Store) Extend(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	return s.statuses(ctx, out, s.extendQ, ns, keys, tokens, max(lease.Milliseconds(), 1))
}

// run runs one statement and hands its rows to read, and runs both again
// when PostgreSQL aborted the statement as a deadlock's victim (40P01) or
// a serialization failure (40001): a single statement is its own
// transaction, rolled back whole, so running it again is safe, and read
// starts its answers afresh. Claims lock rows in key order, but commits
// and releases (UPDATE … FROM) lock them in their join's order, and the
// two can meet.
func (s *Store) run(ctx context.Context, read func(pgx.Rows) error, q string, args ...any) error {
	for try := 0; ; try++ {
		rows, err := s.db.Query(ctx, q, args...)
		if err == nil {
			err = read(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil && try < 5 && ctx.Err() == nil && aborted(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil
	}
}

// aborted reports a statement PostgreSQL rolled back as a deadlock's
// victim (40P01) or a serialization failure (40001): running it again is
// safe.
func aborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// statuses runs a statement that returns the (1-based) index of every
// request it applied: those are OK, the others Lost.
func (s *Store) statuses(ctx context.Context, out []tier.Status, q string, args ...any) error {
	return s.run(ctx, func(rows pgx.Rows) error {
		for i := range out {
			out[i] = tier.Lost
		}
		for rows.Next() {
			var i int64
			if err := rows.Scan(&i); err != nil {
				return err
			}
			if i < 1 || int(i) > len(out) || out[i-1] == tier.OK {
				return fmt.Errorf("answer for key %d of %d", i, len(out))
			}
			out[i-1] = tier.OK
		}
		return nil
	}, q, args...)
}

// Drop starts a sweep of the table's expired rows in the background and
// returns at once (before and highWater are the engine's; every row carries
// its own expiry and answers as absent once it passed, so a sweep only
// reclaims space and no answer waits for it). A sweep deletes block range
// by block range (Options.SweepBlocks), one short statement each, so no
// claim waits behind a long delete; a Drop during a sweep runs one more
// after it. LastSweep reports how the last one ended.
func (s *Store) Drop(_, _ int64) error {
	s.sweeps.start(s.sweep)
	return nil
}

// LastSweep reports when the last finished sweep ended, how many rows it
// deleted and the error that stopped it (nil when it swept the whole
// table). A zero time means no sweep has finished.
func (s *Store) LastSweep() (at time.Time, deleted int64, err error) {
	return s.sweeps.last()
}

// sweep deletes the expired rows of the whole table, block range by block
// range, and returns how many it deleted.
func (s *Store) sweep(ctx context.Context) (int64, error) {
	var blocks int64
	if err := s.run(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&blocks); err != nil {
				return err
			}
		}
		return nil
	}, s.sizeQ); err != nil {
		return 0, err
	}
	var deleted int64
	for from := int64(0); from < blocks; from += s.sweeps.blocks {
		tag, err := s.db.Exec(ctx, s.sweepQ, from, from+s.sweeps.blocks)
		for try := 0; err != nil && try < 5 && ctx.Err() == nil && aborted(err); try++ {
			// A claim taking an expired row locks it in key order, the
			// sweep in the heap's: they can deadlock.
			tag, err = s.db.Exec(ctx, s.sweepQ, from, from+s.sweeps.blocks)
		}
		if err != nil {
			return deleted, fmt.Errorf("%w: sweeping blocks %d to %d: %w", ErrUnavailable, from, from+s.sweeps.blocks, err)
		}
		deleted += tag.RowsAffected()
	}
	return deleted, nil
}

// The Store is a shared exact tier whose retention the engine drives.
var (
	_ tier.Exact        = (*Store)(nil)
	_ tier.Marker       = (*Store)(nil)
	_ tier.Dropper      = (*Store)(nil)
	_ tier.ResultKeeper = (*Store)(nil)
	_ tier.Looker       = (*Store)(nil)
	_ tier.Forgetter    = (*Store)(nil)
)
