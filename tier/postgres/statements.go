package postgres

import (
	"fmt"
	"strings"
)

// now is the server's clock in milliseconds, read once per statement.
const now = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

// taking is the end of a claim or mark statement: which rows it takes
// (expired, another token's fence, a count below the limit, this token's
// claim, or a claim whose lease ended, counted as an attempt) and what it
// returns. A fence of the statement's own token is not taken: the
// statement is a late copy of a call that was given back (fenceQ). clock is the
// statement's reading of the server clock, in milliseconds.
func taking(clock string) string {
	return strings.NewReplacer("NOW", clock).Replace(`	attempts = CASE
		WHEN t.expires <= NOW THEN 0
		WHEN t.state = 'C' AND t.token <> EXCLUDED.token THEN t.attempts + 1
		ELSE t.attempts END,
	taken_over = t.expires > NOW AND t.state = 'C' AND t.token <> EXCLUDED.token
WHERE t.expires <= NOW
   OR (t.state IN ('R', 'X') AND ($6 = 0 OR t.attempts < $6) AND NOT (t.state = 'X' AND t.token = EXCLUDED.token))
   OR (t.state = 'C' AND t.token = EXCLUDED.token)
   OR (t.state = 'C' AND t.lease_until <= NOW AND ($6 = 0 OR t.attempts + 1 < $6))
RETURNING t.ns, t.key, t.attempts, t.taken_over`)
}

// prepare writes the table's statements: those of a claim here (claim,
// mark, adopt, state), the rest in prepareSettle.
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
	// Adopt: a retry's keys (tier.Request.Earlier) that a claim or commit
	// of the caller's earlier calls holds (a token of the caller's
	// process, from the earliest lost call's up to the caller's) move to
	// the caller's token, rows locked in key order; the claim or mark
	// statement then finds them its own. For a mark ($5), an adopted
	// commit becomes the mark's: its digest ($6), for the window ($7).
	s.adoptQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[], $6::bytea[]) AS r(ns, key, token, earlier, digest)),
l AS (SELECT t.ns, t.key FROM %[1]s t JOIN r ON t.ns = r.ns AND t.key = r.key ORDER BY t.ns, t.key FOR UPDATE OF t)
UPDATE %[1]s AS t SET token = r.token,
	digest = CASE WHEN $5 AND t.state = 'D' THEN NULLIF(r.digest, '\x'::bytea) ELSE t.digest END,
	expires = CASE WHEN $5 AND t.state = 'D' THEN c.ms + $7 ELSE t.expires END
FROM r, l, c
WHERE t.ns = l.ns AND t.key = l.key AND t.ns = r.ns AND t.key = r.key
  AND t.state IN ('C', 'D') AND t.expires > c.ms
  AND substring(t.token FROM 1 FOR 8) = substring(r.token FROM 1 FOR 8)
  AND t.token >= r.earlier AND t.token < r.token`, s.table, now)
	s.stateQ = fmt.Sprintf(`
SELECT t.ns, t.key, t.state::text, t.token, t.lease_until, t.attempts, t.digest, t.expires, %[2]s
FROM %[1]s t JOIN unnest($1::bytea[], $2::bytea[]) AS r(ns, key) ON t.ns = r.ns AND t.key = r.key`, s.table, now)
	s.prepareSettle()
}

// prepareSettle writes the statements that settle or read keys a claim
// took: commit, release, extend, forget, the table's size and sweep, and
// (prepareFence) a failed mark's give-back.
func (s *Store) prepareSettle() {
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
	// Forget: every row of the batch goes unless a live claim holds it
	// (or it is a give-back's fence, which stays, its count cleared);
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
	WHERE t.ns = cur.ns AND t.key = cur.key AND cur.state <> 'X'
	  AND NOT (cur.state = 'C' AND cur.lease_until > c.ms AND cur.expires > c.ms)),
fx AS (
	UPDATE %[1]s AS t SET attempts = 0 FROM cur
	WHERE t.ns = cur.ns AND t.key = cur.key AND cur.state = 'X' AND cur.attempts > 0)
SELECT cur.ns, cur.key, cur.state::text, cur.token, cur.lease_until, cur.attempts, cur.digest, cur.expires, c.ms
FROM cur, c`, s.table, now) // del and fx run to completion whether read or not
	s.sizeQ = fmt.Sprintf(`SELECT pg_relation_size('%s') / current_setting('block_size')::bigint`, s.table)
	// Sweep: the expired rows of blocks [$1, $2), found by a TID range
	// scan (no index on the write path).
	s.sweepQ = fmt.Sprintf(`DELETE FROM %s WHERE ctid >= format('(%%s,0)', $1::bigint)::tid AND ctid < format('(%%s,0)', $2::bigint)::tid AND expires <= %s`, s.table, now)
	s.prepareFence()
}

// prepareFence writes the statements of a failed mark's give-back.
func (s *Store) prepareFence() {
	// Fence and unmark: a failed mark's give-back (Unmark), two
	// statements in this order. The fence first: a key no live claim or
	// commit holds (free, expired, an attempt count, a claim whose lease
	// ended, another call's fence) gets the call's fence row ('X', its
	// token, for at least $4 ms), which the call's mark statement, if it
	// runs late (a statement the server had not run when its caller gave
	// up), does not take, and every other statement takes as free. A fence
	// row keeps the key's attempt count (an ended claim's counted, with
	// MaxAttempts $5, as a takeover counts it): it reads as that count. A
	// row names one token: another call's fence becomes this call's (the
	// earlier call's late statement, which had longer to arrive, is no
	// longer fenced out). Then the undo: a commit of the call's token
	// becomes its fence, keeping the count the claim carried. A mark
	// committed between the two is undone by the second; one committed
	// before the first is left alone by it. A live claim or another's
	// commit is left as it is: the late statement cannot take them either,
	// until they end.
	s.fenceQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms)
INSERT INTO %[1]s AS t (ns, key, state, token, lease_until, attempts, digest, expires, taken_over)
SELECT r.ns, r.key, 'X', r.token, 0, 0, NULL, c.ms + $4, false
FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) AS r(ns, key, token), c ORDER BY r.ns, r.key
ON CONFLICT (ns, key) DO UPDATE SET
	state = 'X', token = EXCLUDED.token, lease_until = 0, digest = NULL, taken_over = false,
	attempts = CASE
		WHEN t.expires <= EXCLUDED.expires - $4 THEN 0
		WHEN t.state = 'C' AND $5 > 0 THEN t.attempts + 1
		ELSE t.attempts END,
	expires = CASE WHEN t.expires <= EXCLUDED.expires - $4 THEN EXCLUDED.expires ELSE GREATEST(t.expires, EXCLUDED.expires) END
WHERE t.expires <= EXCLUDED.expires - $4 OR t.state IN ('X', 'R')
   OR (t.state = 'C' AND t.lease_until <= EXCLUDED.expires - $4)`, s.table, now)
	s.unmarkQ = fmt.Sprintf(`
WITH c AS (SELECT %[2]s AS ms),
r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(ns, key, token, i))
UPDATE %[1]s AS t SET state = 'X', lease_until = 0, digest = NULL,
	expires = CASE WHEN t.attempts > 0 THEN t.expires ELSE c.ms + $4 END
FROM r, c
WHERE t.ns = r.ns AND t.key = r.key AND t.token = r.token AND t.state = 'D' AND t.expires > c.ms
RETURNING r.i`, s.table, now)
}
