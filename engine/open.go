package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// openTimeout bounds the opening of a Backend (connecting, checking its
// layout, loading scripts).
const openTimeout = 30 * time.Second

// Open returns an Engine configured by opts: it validates them, opens the
// tiers they name (the Backend: the embedded store, or a shared tier), then
// assembles the engine around them. The embedded store's directory is
// opened (or created) exclusively: ErrLocked if another engine has it.
// Whatever fails, what Open opened is closed.
func Open(opts *Options) (_ *Engine, err error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.WithDefaults()
	e, err := newEngine(o)
	if err != nil {
		return nil, err
	}
	o.Namespaces = maps.Clone(o.Namespaces) // the caller's map may change after Open
	e.opts = o
	var opened closers
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	if o.Archive != nil {
		// Before any tier is opened: a refused archive leaves nothing
		// written (a new store directory, a shared tier's layout).
		c := tier.ArchiverConfig{Partitions: e.parts, Window: o.Window, ArchiveWindow: o.ArchiveWindow, ExpectedKeys: o.ExpectedKeys, FalsePositive: o.ArchiveFalsePositive}
		if err := tier.CheckArchiver(c); err != nil {
			return nil, err
		}
	}
	now := e.reading()
	if now == 0 && !o.local() {
		// Only a directory may hold a reading to stand on: refused before
		// any tier is opened (a shared tier would record its layout).
		return nil, e.clockError()
	}
	switch lb, local := o.Backend.(tier.LocalBackend); {
	case local:
		now, err = e.openLocal(lb, o, now, &opened)
	case o.Backend != nil:
		err = e.openBackend(o, &opened)
	}
	if err != nil {
		return nil, err
	}
	if err := e.assemble(o, now, &opened); err != nil {
		return nil, err
	}
	return e, nil
}

// closers are what Open opened, closed in reverse if it fails.
type closers []io.Closer

func (c *closers) add(x io.Closer) { *c = append(*c, x) }

func (c closers) close() {
	for i := len(c) - 1; i >= 0; i-- {
		_ = c[i].Close()
	}
}

// closerFunc adapts a function to io.Closer.
type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// newEngine returns an engine of o's settings and memory table, with no
// tier behind it yet.
func newEngine(o Options) (*Engine, error) {
	parts, _ := tier.NewPartitions(o.Window, o.Partition)
	e := &Engine{
		tiers:       o.Tiers,
		name:        o.Name(),
		window:      int64(o.Window),
		cacheFor:    int64(o.Window),
		lease:       int64(o.Lease),
		maxKey:      o.MaxKeySize,
		maxResult:   o.MaxResultSize,
		results:     o.Tiers == MemoryOnly && o.Backend == nil,
		maxAttempts: o.MaxAttempts,
		// Kept only where claims live in the engine (capabilities).
		durableClaims: o.DurableClaims,
		parts:         parts,
		clock:         o.Clock,
		logger:        o.logLogger(),
		secret:        shard.NewSecret(), // kept only by this process unless a tier persists one
	}
	e.def = Namespace{e: e}
	e.tokens.Store(uint64(time.Now().UnixNano()))
	mopts := &memory.Options{Capacity: o.MemoryCapacity, Stripes: o.Stripes, MaxAttempts: o.MaxAttempts, Results: e.results}
	switch {
	case o.Backend != nil && o.Backend.Claims() == tier.ClaimsInStore:
		// The shared tier alone counts attempts: it sees every process's,
		// and keeps them exactly as long as it says (a count here could
		// outlive or exceed the shared one, and answer Poison for a
		// committed key).
		mopts.MaxAttempts = 0
		if o.NoSharedCache {
			mopts.Capacity, mopts.NoCommitted = 0, true
			e.noSharedCache = true
		}
	case o.Tiers == BloomOnly:
		mopts.Capacity, mopts.NoCommitted = 0, true
	}
	var err error
	if e.mem, err = memory.New(mopts); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return e, nil
}

// openBackend opens o.Backend as the exact tier (behind the fail-open
// wrapper if asked), and draws this engine's random ID, which with a
// claim's counter makes its owner token there.
func (e *Engine) openBackend(o Options, opened *closers) error {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	x, err := o.Backend.Open(ctx, o.env())
	switch {
	case errors.Is(err, ErrOptions), errors.Is(err, ErrLayout):
		return err // package tier's, which the engine's are
	case err != nil && o.Backend.Claims() == tier.ClaimsInStore:
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case err != nil:
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	opened.add(x)
	e.exact = x
	if o.FailOpen {
		e.exact = newFailOpen(x, &e.stats.failOpen, time.Duration(e.lease))
	}
	_, _ = rand.Read(e.process[:])
	return nil
}

// openLocal opens the store of a LocalBackend (the embedded default, or
// bloom-only's filters and their state), and returns the clock reading to
// start from.
func (e *Engine) openLocal(lb tier.LocalBackend, o Options, now int64, opened *closers) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	env := o.env()
	env.Now = now
	local, err := lb.OpenLocal(ctx, env)
	if errors.Is(err, tier.ErrNoClock) {
		return 0, e.clockError()
	}
	if err != nil {
		return 0, err // tier's ErrLocked, ErrLayout, ErrOptions or ErrStorage, which the engine's are
	}
	opened.add(closerFunc(func() error { local.Discard(); return nil }))
	e.local, e.secret, e.openedAt = local, local.Secret(), local.OpenedAt()
	e.archSrc, _ = local.(tier.ArchiveSource)
	e.handoff, _ = local.(tier.Handoff)
	if x := local.Exact(); x != nil {
		e.exact = x
	}
	return local.Now(), nil
}

// assemble finds the exact tier's capabilities, sets the clock and the
// namespaces, and starts the background work: the rebuild and the sealer
// (the local store's) and the commit queue. Nothing after the first
// goroutine fails, so none leaks.
func (e *Engine) assemble(o Options, now int64, opened *closers) error {
	if now == 0 {
		// A clock outside the range the engine takes as time, and no
		// stored reading to stand on: running at 1970 would let the first
		// sane reading drop every partition written meanwhile.
		return e.clockError()
	}
	if e.exact != nil {
		e.capabilities()
	}
	if nsw := o.nsWindows(); len(nsw) > 0 {
		e.nsWindows = make(map[string]int64, len(nsw))
		for name, w := range nsw {
			e.nsWindows[name] = int64(w)
		}
	}
	e.hasher = shard.NewHasher(e.secret)
	e.highWater.Store(now)
	if e.openedAt == 0 {
		e.openedAt = now
	}
	e.current.Store(e.parts.Of(now))
	if o.Archive == nil && e.archSrc != nil {
		if err := e.withoutArchive(o.DetachArchive); err != nil {
			return err
		}
	}
	if o.Archive != nil {
		if err := e.openArchive(o, opened); err != nil {
			return err
		}
		e.archiveWindow, e.nsArchiveWindows = o.ArchiveWindow, o.nsArchiveWindows()
		// A mark must ask the archive before it commits, and commit
		// through the archive log: claim, archive, commit; or, where the
		// tier logs its marks (tier.LogMarker, not under FailOpen), read
		// the archive, then mark bound by LogBy (archiveBeforeMark), for
		// the namespaces that allows (Namespace.marksInTier).
		lm, ok := e.marker.(tier.LogMarker)
		e.logMarks = ok && lm.MarksWithLog()
		if !e.logMarks {
			e.marker = nil
		}
	}
	e.def = *e.newNamespace("") // now that where claims live, and the archive, are known
	if err := e.Serves(o.Needs); err != nil {
		return err // before any goroutine starts: Open closes what it opened
	}
	if e.arch != nil {
		// Only now, with every check of Open passed: a refused Open
		// leaves the archive's recorded window as it found it.
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		err := e.arch.Grow(ctx)
		cancel()
		if err != nil {
			return err
		}
	}

	if e.local != nil {
		e.local.Start(e.current.Load(), e.highWater.Load)
	}
	if e.exact != nil {
		e.queue = newCommitQueue(e, o.CommitQueue)
	}
	if e.arch != nil {
		e.arch.Start()
	}
	return nil
}

// clockError refuses a clock outside the range the engine takes as time
// with no stored reading to stand on: running at 1970 would let the first
// sane reading drop every partition written meanwhile.
func (e *Engine) clockError() error {
	return fmt.Errorf("%w: Clock reads %v, outside [%v, %v], and the directory holds no earlier reading", ErrOptions, e.clock.Now(), minClock, maxClock)
}

// capabilities finds the optional interfaces of the exact tier, under the
// fail-open wrapper; marks go through the wrapper, as claims and commits
// do.
func (e *Engine) capabilities() {
	base := e.exact
	f, wrapped := base.(failOpen)
	if wrapped {
		base = f.Exact
	}
	e.where = base.Claims()
	e.durableClaims = e.durableClaims && e.where == tier.ClaimsInEngine
	if e.where == tier.ClaimsInStore {
		e.cacheFor = e.window / 2
	}
	e.writer, _ = base.(tier.CommitWriter)
	e.dropper, _ = base.(tier.Dropper)
	e.latch, _ = base.(tier.Latching)
	e.extender, _ = base.(tier.Extender)
	e.looker, _ = base.(tier.Looker)
	e.forgetter, _ = base.(tier.Forgetter)
	e.advancer, _ = base.(tier.Advancer)
	if k, ok := base.(tier.ResultKeeper); ok {
		e.results = k.KeepsResults()
	}
	if pm, ok := base.(tier.PartialMarker); ok && !pm.CanMark() {
		return
	}
	if m, ok := base.(tier.Marker); ok {
		e.marker = m
		if wrapped {
			e.marker = failOpenMarker{f, m}
		}
	}
}
