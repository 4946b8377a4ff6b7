package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	db                                                                       DB
	table                                                                    string
	window                                                                   time.Duration
	max                                                                      int
	claimQ, markQ, adoptQ, stateQ, commitQ, releaseQ, extendQ, sizeQ, sweepQ string
	forgetQ, fenceQ, unmarkQ                                                 string
	sweeps                                                                   sweeper
	uncached                                                                 bool // Options.Uncached, recorded in the layout
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
	create := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		ns bytea NOT NULL, key bytea NOT NULL,
		state "char" NOT NULL, -- 'C' claimed, 'D' committed, 'R' released (a count only), 'X' a give-back's fence (free but to its token)
		token bytea NOT NULL, lease_until bigint NOT NULL, attempts integer NOT NULL,
		digest bytea, expires bigint NOT NULL,
		taken_over boolean NOT NULL DEFAULT false, -- the last claim took over an ended lease
		PRIMARY KEY (ns, key))`, s.table)
	if err := createTables(ctx, db, create); err != nil {
		return nil, fmt.Errorf("%w: creating %s: %w", ErrUnavailable, s.table, err)
	}
	if err := s.checkLayout(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Claims reports where claims live: in the table, shared by every process.
func (s *Store) Claims() tier.Where { return tier.ClaimsInStore }

// Close stops a sweep in progress and waits for it; the DB stays the
// caller's.
func (s *Store) Close() error {
	s.sweeps.stop()
	return nil
}

// KeepsResults reports that a commit's result is stored with it.
func (s *Store) KeepsResults() bool { return true }

// The Store is a shared exact tier whose retention the engine drives.
var (
	_ tier.Exact        = (*Store)(nil)
	_ tier.Marker       = (*Store)(nil)
	_ tier.Dropper      = (*Store)(nil)
	_ tier.ResultKeeper = (*Store)(nil)
	_ tier.Looker       = (*Store)(nil)
	_ tier.Forgetter    = (*Store)(nil)
)
