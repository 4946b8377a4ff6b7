package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Config is what a caller chooses of the PostgreSQL tier; the engine
// supplies the rest (its window, MaxAttempts and NoSharedCache) when it
// opens the Backend.
type Config struct {
	// Table is the table of dedup rows, created if missing; zero means
	// "tierdedup". Processes that deduplicate together use the same
	// table. Letters, digits and underscores, at most 63.
	Table string
	// SweepBlocks is Options.SweepBlocks; zero means 4096.
	SweepBlocks int
}

// Backend is the PostgreSQL tier as an engine's backend
// (engine.Options.Backend).
type Backend struct {
	db     DB
	config Config
}

// NewBackend returns the PostgreSQL tier over db, a *pgxpool.Pool (safe
// for concurrent use). The caller owns it and closes it after the engine.
func NewBackend(db DB, c Config) *Backend {
	return &Backend{db: db, config: c}
}

// Name returns "postgres".
func (b *Backend) Name() string { return "postgres" }

// Claims returns tier.ClaimsInStore: every process on the table shares
// the claims.
func (b *Backend) Claims() tier.Where { return tier.ClaimsInStore }

// Validate reports a nil database (also a typed nil, such as a
// *pgxpool.Pool left nil), an invalid table name and namespace windows (a
// row's expiry is the table's window), all at once; each error matches
// tier.ErrOptions and ErrOptions.
func (b *Backend) Validate(env tier.Env) error {
	var errs []error
	if b == nil {
		return fmt.Errorf("%w: %w: a nil PostgreSQL backend", tier.ErrOptions, ErrOptions)
	}
	if tier.Nil(b.db) {
		errs = append(errs, fmt.Errorf("%w: %w: the PostgreSQL backend needs a database (it is nil)", tier.ErrOptions, ErrOptions))
	}
	if len(env.NamespaceWindows) > 0 {
		errs = append(errs, fmt.Errorf("%w: %w: NamespaceWindows are not supported by the PostgreSQL tier", tier.ErrOptions, ErrOptions))
	}
	if env.ArchiveLog {
		errs = append(errs, fmt.Errorf("%w: %w: the PostgreSQL tier keeps no archive log; an archive behind a shared tier needs the Redis tier", tier.ErrOptions, ErrOptions))
	}
	o := b.options(env)
	// The engine's own settings (window, attempts) are the engine's to
	// report: only the table's are checked here.
	o.Window, o.MaxAttempts = max(o.Window, time.Millisecond), 0
	if err := o.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", tier.ErrOptions, err))
	}
	return errors.Join(errs...)
}

func (b *Backend) options(env tier.Env) *Options {
	return &Options{Table: b.config.Table, Window: env.Window, MaxAttempts: env.MaxAttempts, Uncached: env.NoSharedCache, SweepBlocks: b.config.SweepBlocks}
}

// Open creates the table if missing and checks (or records) its layout:
// the window, MaxAttempts and NoSharedCache of env. Errors wrap
// tier.ErrOptions (ErrOptions), tier.ErrLayout (ErrLayout) or
// ErrUnavailable.
func (b *Backend) Open(ctx context.Context, env tier.Env) (tier.Exact, error) {
	if err := b.Validate(env); err != nil {
		return nil, err
	}
	s, err := New(ctx, b.db, b.options(env))
	if err != nil {
		return nil, tier.Classify(err, ErrLayout, ErrOptions)
	}
	return s, nil
}
