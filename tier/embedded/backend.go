package embedded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// MaxCacheSize bounds Backend.CacheSize: 1 TiB.
const MaxCacheSize = 1 << 40

// Backend is the embedded store as the engine opens it (a
// tier.LocalBackend): a directory of one process holding a Pebble store
// and the Bloom filters in front of it. Its own settings are here; the
// engine gives the rest (window, partitions, filter sizing, clock) in the
// tier.Env. The default configuration is one line:
//
//	e, err := engine.Open(&engine.Options{Backend: embedded.Dir("/var/lib/orders-dedup")})
type Backend struct {
	// Dir is the directory: required, except in bloom-only, where it
	// keeps the filters' state across a clean restart when set.
	Dir string
	// FS is the filesystem under Dir; nil means the operating system's.
	FS vfs.FS
	// NoSync makes a commit return once its WAL write reaches the
	// operating system, without fsync: safe against process crashes, not
	// against machine crashes. The zero value syncs (group-committed).
	NoSync bool
	// CacheSize is Pebble's block cache in bytes, at most MaxCacheSize.
	// Zero means 64 MiB. Reads of duplicates that memory does not hold go
	// through it, as do Pebble's own filter and index blocks: a store much
	// larger than it reads them from the operating system's page cache,
	// decoding and checksumming each block again.
	CacheSize int
}

// Dir returns the Backend of the embedded store in dir, every other
// setting its default.
func Dir(dir string) *Backend { return &Backend{Dir: dir} }

// Name returns "bloom+pebble": the engine names its configuration
// "memory+bloom+pebble".
func (b *Backend) Name() string { return "bloom+pebble" }

// Claims returns tier.ClaimsInEngine: the store holds commits, the engine
// holds claims (in memory, or durably as attempts: DurableClaims).
func (b *Backend) Claims() tier.Where { return tier.ClaimsInEngine }

// Path returns Dir.
func (b *Backend) Path() string {
	if b == nil {
		return ""
	}
	return b.Dir
}

// Validate reports every setting refused, each matching tier.ErrOptions:
// no Dir (but in bloom-only), a CacheSize out of range, an archive log
// (a shared tier's), a window the partitions cannot cut.
func (b *Backend) Validate(env tier.Env) error {
	if b == nil {
		return fmt.Errorf("%w: the embedded Backend is nil", tier.ErrOptions)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: embedded: "+format, append([]any{tier.ErrOptions}, args...)...))
	}
	if b.Dir == "" && !env.FiltersOnly {
		bad("Dir is required")
	}
	if b.CacheSize < 0 || b.CacheSize > MaxCacheSize {
		bad("CacheSize %d is outside [0, %d]", b.CacheSize, MaxCacheSize)
	}
	if env.ArchiveLog {
		bad("an archive log is a shared tier's; the embedded store archives its own partitions")
	}
	if env.Partitions.Length <= 0 || env.Window <= 0 {
		bad("Window %v and Partitions %+v are not a layout", env.Window, env.Partitions)
	}
	return errors.Join(errs...)
}

// OpenLocal opens (or creates) the store in Dir exclusively (Open).
func (b *Backend) OpenLocal(ctx context.Context, env tier.Env) (tier.Local, error) {
	if err := b.Validate(env); err != nil {
		return nil, err
	}
	s, err := Open(b.options(env))
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (b *Backend) options(env tier.Env) *Options {
	return &Options{
		Dir: b.Dir, FS: b.FS, BloomOnly: env.FiltersOnly, NoSync: b.NoSync, CacheSize: b.CacheSize,
		Window: env.Window, Partition: time.Duration(env.Partitions.Length), ExpectedKeys: env.ExpectedKeys,
		FalsePositive: env.FalsePositive, Logger: env.Logger, Now: env.Now, HoldDrops: env.Archived,
	}
}

// Open opens the store and starts it, and returns its exact tier alone,
// which closes the whole store: the embedded store under the backend
// contract (tier/tiertest). Its clock stays at env.Now (the time of Open
// when 0): the caller's partition numbers decide, and nothing is sealed
// or dropped as time passes. The engine opens it with OpenLocal instead,
// to drive its filters and its clock. Bloom-only has no exact tier
// (tier.ErrOptions).
func (b *Backend) Open(ctx context.Context, env tier.Env) (tier.Exact, error) {
	if env.FiltersOnly {
		return nil, fmt.Errorf("%w: bloom-only has no exact tier", tier.ErrOptions)
	}
	if env.Now == 0 {
		env.Now = time.Now().UnixNano()
	}
	l, err := b.OpenLocal(ctx, env)
	if err != nil {
		return nil, err
	}
	s := l.(*Store)
	s.Start(env.Partitions.Of(s.Now()), s.Now)
	return started{Store: s.store, s: s}, nil
}

// started is the exact tier of a started store: every method the Pebble
// store offers (the optional interfaces too), but Close, which closes the
// whole store.
type started struct {
	*pebble.Store
	s *Store
}

// Close closes the whole store.
func (x started) Close() error { return x.s.Close(x.s.Now()) }

// Import replaces the directory b.Dir with the export in src, if the
// export's Version is greater than newerThan (Import); window and
// partition are the layout the directory will be opened with.
func (b *Backend) Import(ctx context.Context, src string, window, partition time.Duration, newerThan uint64) (ExportInfo, error) {
	if b == nil || b.Dir == "" {
		return ExportInfo{}, fmt.Errorf("%w: Import needs a Dir", tier.ErrOptions)
	}
	return Import(ctx, src, &Options{Dir: b.Dir, FS: b.FS, Window: window, Partition: partition}, newerThan)
}

var (
	_ tier.LocalBackend  = (*Backend)(nil)
	_ tier.Local         = (*Store)(nil)
	_ tier.ArchiveSource = (*Store)(nil)
	_ tier.Handoff       = (*Store)(nil)
)
