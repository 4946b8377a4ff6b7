package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// openTimeout bounds the opening of a Backend (connecting, checking its
// layout, loading scripts).
const openTimeout = 30 * time.Second

// Open returns an Engine configured by opts: it validates them, opens the
// tiers they name (the embedded store in Dir, the Backend, or the
// bloom-only snapshot), then assembles the engine around them. In Default
// it opens (or creates) the Pebble directory exclusively: ErrLocked if
// another engine has it. Whatever fails, what Open opened is closed.
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
	var opened closers
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	now := e.reading()
	switch {
	case o.Backend != nil:
		err = e.openBackend(o, &opened)
	case o.Tiers == Default:
		now, err = e.openEmbedded(o, now, &opened)
	case o.Tiers == BloomOnly:
		now, err = e.openBloomOnly(o, now, &opened)
	}
	if err != nil {
		return nil, err
	}
	if err := e.assemble(o, now); err != nil {
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
		parts:       parts,
		clock:       o.Clock,
		logger:      o.Logger,
		secret:      shard.NewSecret(), // kept only by this process unless a tier persists one
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
	if o.Dir != "" {
		e.snapshots = newSnapshotFile(o.FS, o.Dir)
		e.sealedDir = newSnapshotFile(o.FS, e.snapshots.fs.PathJoin(o.Dir, sealedSubdir))
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
	case errors.Is(err, tier.ErrOptions):
		return fmt.Errorf("%w: %w", ErrOptions, err)
	case errors.Is(err, tier.ErrLayout):
		return fmt.Errorf("%w: %w", ErrLayout, err)
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

// openEmbedded opens the Pebble store in o.Dir, finishing an Import a
// crash interrupted first, and returns the clock reading to start from.
func (e *Engine) openEmbedded(o Options, now int64, opened *closers) (int64, error) {
	// An Import of Dir a crash interrupted is finished first: Dir is never
	// opened empty in place of the state it was replacing.
	if err := finishImport(e.snapshots.fs, canonical(e.snapshots.fs, o.Dir)); err != nil {
		return 0, err
	}
	if err := e.snapshots.refuseState(); err != nil {
		return 0, err
	}
	store, err := pebble.Open(&pebble.Options{Dir: o.Dir, FS: o.FS, NoSync: o.NoSync, CacheSize: o.CacheSize, Logger: o.Logger, Partition: o.Partition, Window: o.Window, Now: now})
	switch {
	case errors.Is(err, pebble.ErrLocked):
		return 0, fmt.Errorf("%w: %w", ErrLocked, err)
	case errors.Is(err, pebble.ErrLayout):
		return 0, fmt.Errorf("%w: %w", ErrLayout, err)
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	opened.add(store)
	e.store, e.exact, e.secret = store, store, store.Layout().Secret
	hw, err := store.HighWater()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	now = max(now, hw)
	e.sealFrom = math.MinInt64
	if created, err := store.Created(); err == nil {
		if created < now {
			e.openedAt = created
		}
		e.sealFrom = e.parts.Of(created)
	}
	if err := e.newFilters(o, now); err != nil {
		return 0, err
	}
	// The snapshot can match only the epoch the store sealed at its last
	// clean Close, which TakeSnapshotEpoch forgets before anything else is
	// written; the file is removed whatever the outcome. So a snapshot is
	// trusted at most once, and only for the exact state it was taken of.
	epoch, err := store.TakeSnapshotEpoch()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	id := store.Layout().ID
	e.sealed = make(map[int64]bool)
	err = e.snapshots.load(e.bloom, func(h bloom.SnapshotHeader) error {
		switch {
		case h.Kind != bloom.SnapshotCache:
			return fmt.Errorf("snapshot kind %d is not a store's cache", h.Kind)
		case h.StoreID != id:
			return errors.New("snapshot of another store")
		case epoch == 0 || h.Epoch != epoch:
			return errors.New("snapshot of an earlier state of this store (writes followed it)")
		}
		return nil
	}, true, e.logger)
	// Drop what expired while the store was closed, and persist the
	// high-water clock before answering anything.
	if derr := store.Drop(e.parts.Oldest(e.parts.Of(now)), now); derr != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, derr)
	}
	switch {
	case err == nil || store.Fresh():
		// Warm from the snapshot, or a store created by this Open, which
		// holds nothing the filters have not seen.
		e.warm.Store(true)
		err = e.keepSealed(e.parts.Of(now))
	default:
		if !isNotExist(err) {
			e.logger.Printf("tierdedup: bloom snapshot not used, rebuilding from Pebble: %v", err)
		}
		e.toRebuild, err = e.loadSealed(e.parts.Of(now))
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return now, nil
}

// openBloomOnly makes the filters the engine's only tier, loading their
// state from Dir when it is set, and returns the clock reading to start
// from.
func (e *Engine) openBloomOnly(o Options, now int64, opened *closers) (int64, error) {
	if err := e.newFilters(o, now); err != nil {
		return 0, err
	}
	e.warm.Store(true)
	if e.snapshots == nil {
		return now, nil
	}
	// One engine at a time: two would each save their own filters at
	// Close, and the last would erase the other's keys.
	lock, err := e.snapshots.lock()
	if err != nil {
		return 0, err
	}
	opened.add(lock)
	e.dirLock = lock
	// The snapshot is the whole state of bloom-only: it brings its secret
	// and clock, and one that cannot be used is an error, not a silent
	// fresh start that would let every duplicate through.
	hw, err := e.loadState(o)
	if err != nil {
		return 0, err
	}
	return max(now, hw), nil
}

// newFilters makes the Bloom filters, current at now.
func (e *Engine) newFilters(o Options, now int64) (err error) {
	bopts := &bloom.Options{Partitions: e.parts, ExpectedKeys: o.ExpectedKeys, FalsePositive: o.FalsePositive}
	if e.bloom, err = bloom.New(bopts, e.parts.Of(now)); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return nil
}

// assemble finds the exact tier's capabilities, sets the clock and the
// namespaces, and starts the background work: the rebuild and the sealer
// (Default) and the commit queue. Nothing after the first goroutine fails,
// so none leaks.
func (e *Engine) assemble(o Options, now int64) error {
	if now == 0 {
		// A clock outside the range the engine takes as time, and no
		// stored reading to stand on: running at 1970 would let the first
		// sane reading drop every partition written meanwhile.
		return fmt.Errorf("%w: Clock reads %v, outside [%v, %v], and the directory holds no earlier reading", ErrOptions, e.clock.Now(), minClock, maxClock)
	}
	if e.exact != nil {
		e.capabilities()
	}
	if len(o.NamespaceWindows) > 0 {
		e.nsWindows = make(map[string]int64, len(o.NamespaceWindows))
		for name, w := range o.NamespaceWindows {
			e.nsWindows[name] = int64(w)
		}
	}
	e.def = *e.newNamespace("") // now that where claims live is known
	e.hasher = shard.NewHasher(e.secret)
	e.highWater.Store(now)
	if e.openedAt == 0 {
		e.openedAt = now
	}
	e.current.Store(e.parts.Of(now))

	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	if e.store != nil {
		e.sealWake = make(chan struct{}, 1) // before the rebuild, which wakes the sealer
		if !e.warm.Load() {
			rebuild := e.toRebuild
			e.toRebuild = nil
			e.cold.Store(&rebuild)
			e.rebuilding.Store(true)
			e.workers.Add(1)
			go e.rebuild(ctx, spans(rebuild))
		}
		e.workers.Add(1)
		go e.sealer(ctx)
		e.sealWakeup() // partitions that closed while the engine was down
	}
	if e.exact != nil {
		e.queue = newCommitQueue(e, o.CommitQueue)
	}
	if o.Dir != "" {
		e.holdDir(e.snapshots.fs, o.Dir)
	}
	return nil
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
	if e.where == tier.ClaimsInStore {
		e.cacheFor = e.window / 2
	}
	e.writer, _ = base.(tier.CommitWriter)
	e.dropper, _ = base.(tier.Dropper)
	e.scanner, _ = base.(tier.Scanner)
	e.latch, _ = base.(tier.Latching)
	e.extender, _ = base.(tier.Extender)
	e.looker, _ = base.(tier.Looker)
	e.forgetter, _ = base.(tier.Forgetter)
	e.advancer, _ = base.(tier.Advancer)
	if k, ok := base.(tier.ResultKeeper); ok {
		e.results = k.KeepsResults()
	}
	if m, ok := base.(tier.Marker); ok {
		e.marker = m
		if wrapped {
			e.marker = failOpenMarker{f, m}
		}
	}
}
