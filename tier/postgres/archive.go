package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
	// The archiver (filters, copying, the log drain) that drives every
	// archive backend: linked wherever an archive backend is.
	_ "github.com/tierdedup/tierdedup/tier/archive"
)

// The PostgreSQL archive keeps each archived partition in a table
// partition of its own: <table> is partitioned by LIST (part), and
// archiving partition p, in one transaction, creates <table>_p<p> with
// the check part = p, copies the partition's rows into it (COPY), adds
// its primary key, attaches it (the check spares the scan), and records p
// in <table>_parts; expiry detaches and drops whole tables, never DELETEs.
// Filter blobs are rows of <table>_blobs, chunked.
//
// Fed from a shared tier's log (ArchiveAppender), it creates a
// partition's table when the first key of it comes (listed in
// <table>_open until sealed), inserts keys with ON CONFLICT DO NOTHING,
// and records in <table>_log, in the same transaction, the last log
// position applied, the first partition not sealed, and the archive's
// own fingerprint secret (drawn when the table is created).
//
// What makes it invalid, and who checks (Open, ErrLayout): a row of
// <table>_layout of another format, partition length, owner or secret
// check, or a longer window than asked (keys were promised it). A table
// partition is visible only once its transaction committed, with its row
// in <table>_parts: a crash rolls the whole Put back.

// ArchiveDB is what the archive needs of a PostgreSQL pool: a
// *pgxpool.Pool is one.
type ArchiveDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Archive is the PostgreSQL archive backend (tier.ArchiveBackend).
type Archive struct {
	// DB is the pool; required. The caller closes it after the engine.
	DB ArchiveDB
	// Table names the archive's tables; zero means "tierdedup_archive".
	// Letters, digits and underscores, at most 40.
	Table string
}

var archiveTable = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)

// archiveFormat is the archive's layout version.
const archiveFormat = 1

// blobChunk is the size of a blob's rows.
const blobChunk = 1 << 20

// Name returns "postgres".
func (a Archive) Name() string { return "postgres" }

func (a Archive) table() string {
	if a.Table == "" {
		return "tierdedup_archive"
	}
	return a.Table
}

// Validate refuses a nil DB and an invalid table name.
func (a Archive) Validate(env tier.ArchiveEnv) error {
	var errs []error
	if tier.Nil(a.DB) {
		errs = append(errs, fmt.Errorf("%w: postgres.Archive.DB is nil", tier.ErrOptions))
	}
	if !archiveTable.MatchString(a.table()) {
		errs = append(errs, fmt.Errorf("%w: archive table %q: letters, digits and underscores, at most 40", tier.ErrOptions, a.table()))
	}
	if env.Partitions.Length <= 0 || env.Window <= 0 {
		errs = append(errs, fmt.Errorf("%w: archive partitions %+v, window %v", tier.ErrOptions, env.Partitions, env.Window))
	}
	return errors.Join(errs...)
}

// Open creates the archive's tables if missing and checks its layout.
func (a Archive) Open(ctx context.Context, env tier.ArchiveEnv) (tier.Archive, error) {
	if err := a.Validate(env); err != nil {
		return nil, err
	}
	t := a.table()
	ar := &pgArchive{db: a.DB, t: t}
	if env.Existing {
		var held bool
		if err := queryRow(ctx, a.DB, `SELECT to_regclass($1) IS NOT NULL`, []any{&held}, t+"_layout"); err != nil {
			return nil, fmt.Errorf("%w: %s_layout: %w", ErrUnavailable, t, err)
		}
		if held {
			if err := queryRow(ctx, a.DB, `SELECT EXISTS (SELECT 1 FROM `+t+`_layout WHERE id = 1)`, []any{&held}); err != nil {
				return nil, fmt.Errorf("%w: %s_layout: %w", ErrUnavailable, t, err)
			}
		}
		if !held {
			return nil, fmt.Errorf("%w: archive %s is new, and %s moved partitions to another archive before", tier.ErrLayout, t, env.Owner)
		}
	}
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + t + `_layout (id int PRIMARY KEY, format int NOT NULL, partition_ns bigint NOT NULL, window_ns bigint NOT NULL, "check" bytea NOT NULL, owner text NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + t + ` (part bigint NOT NULL, ns bytea NOT NULL, key bytea NOT NULL, digest bytea, at bigint, result bytea, full_key bytea, PRIMARY KEY (ns, key, part)) PARTITION BY LIST (part)`,
		// An archive created before long keys were stored hashed: the
		// column is added (a catalog change; every table partition gets
		// it, NULL).
		`ALTER TABLE ` + t + ` ADD COLUMN IF NOT EXISTS full_key bytea`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_parts (part bigint PRIMARY KEY, keys bigint NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_blobs (name text NOT NULL, chunk int NOT NULL, data bytea NOT NULL, PRIMARY KEY (name, chunk))`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_log (id int PRIMARY KEY, ms bigint NOT NULL, seq bigint NOT NULL, sealed_next bigint NOT NULL, secret bytea NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_open (part bigint PRIMARY KEY)`,
	}
	if err := createTables(ctx, a.DB, stmts...); err != nil {
		return nil, fmt.Errorf("%w: creating %s: %w", ErrUnavailable, t, err)
	}
	if _, err := a.DB.Exec(ctx, `INSERT INTO `+t+`_layout VALUES (1, $1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`,
		archiveFormat, env.Partitions.Length, int64(env.Window), env.Check[:], env.Owner); err != nil {
		return nil, fmt.Errorf("%w: %s_layout: %w", ErrUnavailable, t, err)
	}
	var format int
	var part, window int64
	var check []byte
	var owner string
	if err := queryRow(ctx, a.DB, `SELECT format, partition_ns, window_ns, "check", owner FROM `+t+`_layout WHERE id = 1`, []any{&format, &part, &window, &check, &owner}); err != nil {
		return nil, fmt.Errorf("%w: %s_layout: %w", ErrUnavailable, t, err)
	}
	switch {
	case format != archiveFormat:
		return nil, fmt.Errorf("%w: archive %s: format %d, want %d", tier.ErrLayout, t, format, archiveFormat)
	case part != env.Partitions.Length:
		return nil, fmt.Errorf("%w: archive %s: partition length %d ns, want %d", tier.ErrLayout, t, part, env.Partitions.Length)
	case !bytes.Equal(check, env.Check[:]):
		return nil, fmt.Errorf("%w: archive %s: written under another fingerprint secret", tier.ErrLayout, t)
	case owner != env.Owner:
		return nil, fmt.Errorf("%w: archive %s: of %s, not %s", tier.ErrLayout, t, owner, env.Owner)
	case int64(env.Window) < window:
		return nil, fmt.Errorf("%w: archive %s: window %d ns recorded, %v asked (a window may grow, never shrink)", tier.ErrLayout, t, window, env.Window)
	case int64(env.Window) > window:
		ar.grow = int64(env.Window) // recorded by GrowWindow, once the engine's Open passed
	}
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, err
	}
	if _, err := a.DB.Exec(ctx, `INSERT INTO `+t+`_log VALUES (1, 0, 0, -1, $1) ON CONFLICT (id) DO NOTHING`, secret[:]); err != nil {
		return nil, fmt.Errorf("%w: %s_log: %w", ErrUnavailable, t, err)
	}
	var stored []byte
	if err := queryRow(ctx, a.DB, `SELECT secret FROM `+t+`_log WHERE id = 1`, []any{&stored}); err != nil {
		return nil, fmt.Errorf("%w: %s_log: %w", ErrUnavailable, t, err)
	}
	if len(stored) != len(ar.secret) {
		return nil, fmt.Errorf("%w: archive %s: a secret of %d bytes", tier.ErrLayout, t, len(stored))
	}
	copy(ar.secret[:], stored)
	// A table partition that a crashed Put left unattached (its
	// transaction rolled back, so none exists) needs nothing; one that
	// exists unrecorded cannot, as both are in one transaction.
	return ar, nil
}

func queryRow(ctx context.Context, db DB, sql string, dst []any, args ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return errors.New("no row")
	}
	if err := rows.Scan(dst...); err != nil {
		return err
	}
	return rows.Err()
}

// pgArchive is an opened Archive.
type pgArchive struct {
	db     ArchiveDB
	t      string
	putMu  sync.Mutex
	secret [16]byte
	grow   int64 // a longer window than recorded, for GrowWindow (0: none)
}

// GrowWindow records the longer window Open found
// (tier.ArchiveWindowGrower). The statement never shrinks the recorded
// one: a late copy, or a process of a longer window that grew it
// meanwhile, leaves the longer.
func (ar *pgArchive) GrowWindow(ctx context.Context) error {
	if ar.grow == 0 {
		return nil
	}
	if _, err := ar.db.Exec(ctx, `UPDATE `+ar.t+`_layout SET window_ns = GREATEST(window_ns, $1) WHERE id = 1`, ar.grow); err != nil {
		return fmt.Errorf("%w: %s_layout: %w", ErrUnavailable, ar.t, err)
	}
	ar.grow = 0
	return nil
}

func (ar *pgArchive) part(p int64) string { return ar.t + "_p" + strconv.FormatInt(p, 10) }

func unavailable(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

// Archived lists the recorded partitions.
func (ar *pgArchive) Archived(ctx context.Context) ([]int64, error) {
	rows, err := ar.db.Query(ctx, `SELECT part FROM `+ar.t+`_parts ORDER BY part`)
	if err == nil {
		var out []int64
		if out, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err == nil {
			return out, nil
		}
	}
	return nil, unavailable("archived partitions", err)
}

// copySource feeds COPY from the scan, which a goroutine runs: pgx pulls
// rows one at a time.
type copySource struct {
	rows chan []any
	err  chan error
	cur  []any
	done bool
	fail error
}

func (c *copySource) Next() bool {
	if c.done {
		return false
	}
	r, ok := <-c.rows
	if !ok {
		c.done = true
		c.fail = <-c.err
		return false
	}
	c.cur = r
	return true
}
func (c *copySource) Values() ([]any, error) { return c.cur, nil }
func (c *copySource) Err() error             { return c.fail }

// Put copies partition p into a new table partition, in one transaction.
func (ar *pgArchive) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	ar.putMu.Lock()
	defer ar.putMu.Unlock()
	var held bool
	if err := queryRow(ctx, ar.db, `SELECT EXISTS (SELECT 1 FROM `+ar.t+`_parts WHERE part = $1)`, []any{&held}, p); err != nil {
		return unavailable("archive put", err)
	}
	if held {
		return nil
	}
	tx, err := ar.db.Begin(ctx)
	if err != nil {
		return unavailable("archive put", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	name := ar.part(p)
	if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+name); err != nil {
		return unavailable("archive put", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE `+name+` (LIKE `+ar.t+`, CHECK (part = `+strconv.FormatInt(p, 10)+`))`); err != nil {
		return unavailable("archive put", err)
	}
	src := &copySource{rows: make(chan []any, 1024), err: make(chan error, 1)}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(src.rows)
		src.err <- scan(func(r *tier.Record) error {
			key, full := archivedKey(r.Key)
			row := []any{p, bytes.Clone(r.NS), bytes.Clone(key), nil, nil, nil, bytes.Clone(full)}
			if r.Digest != (tier.Digest{}) {
				row[3] = bytes.Clone(r.Digest[:])
			}
			if r.At != 0 {
				row[4] = r.At
			}
			if r.Result != nil {
				row[5] = bytes.Clone(r.Result)
			}
			select {
			case src.rows <- row:
				return nil
			case <-sctx.Done():
				return sctx.Err()
			}
		})
	}()
	n, err := tx.CopyFrom(ctx, pgx.Identifier{name}, []string{"part", "ns", "key", "digest", "at", "result", "full_key"}, src)
	cancel()
	for range src.rows { // let the scan end
	}
	if err == nil && src.fail != nil {
		err = src.fail
	}
	if err != nil {
		return unavailable("archive copy", err)
	}
	for _, stmt := range []string{
		`ALTER TABLE ` + name + ` ADD PRIMARY KEY (ns, key, part)`,
		`ALTER TABLE ` + ar.t + ` ATTACH PARTITION ` + name + ` FOR VALUES IN (` + strconv.FormatInt(p, 10) + `)`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return unavailable("archive put", err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+ar.t+`_parts VALUES ($1, $2)`, p, n); err != nil {
		return unavailable("archive put", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable("archive commit", err)
	}
	return nil
}

// Drop detaches and drops the table partitions before `before`, each in
// one transaction with its record.
func (ar *pgArchive) Drop(ctx context.Context, before int64) error {
	held, err := ar.Archived(ctx)
	if err != nil {
		return err
	}
	open, err := ar.openParts(ctx)
	if err != nil {
		return err
	}
	held = append(held, open...)
	slices.Sort(held)
	held = slices.Compact(held)
	for _, p := range held {
		if p >= before {
			break
		}
		tx, err := ar.db.Begin(ctx)
		if err != nil {
			return unavailable("archive drop", err)
		}
		for _, stmt := range []string{
			`DELETE FROM ` + ar.t + `_parts WHERE part = ` + strconv.FormatInt(p, 10),
			`DELETE FROM ` + ar.t + `_open WHERE part = ` + strconv.FormatInt(p, 10),
			`ALTER TABLE ` + ar.t + ` DETACH PARTITION ` + ar.part(p),
			`DROP TABLE ` + ar.part(p),
		} {
			if _, err = tx.Exec(ctx, stmt); err != nil {
				break
			}
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		_ = tx.Rollback(context.Background())
		if err != nil {
			return unavailable("archive drop", err)
		}
	}
	return nil
}

// Close does nothing: the caller owns the pool.
func (ar *pgArchive) Close() error { return nil }
