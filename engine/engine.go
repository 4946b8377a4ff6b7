package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// Engine answers claims for keys in one or more namespaces. It is safe for
// concurrent use.
type Engine struct {
	tiers  Tiers
	window int64 // nanoseconds
	// cacheFor is how long memory keeps the engine's own commits: the window,
	// or, when a shared tier's server clock expires them, half of it, so a
	// process clock behind the server's by less than that cannot make memory
	// outlive the tier's record.
	cacheFor  int64
	lease     int64
	maxKey    int
	maxResult int
	// results: the tiers store a commit's result (memory-only, or an exact
	// tier that keeps them); a commit with one is refused otherwise.
	results     bool
	maxAttempts int
	parts       tier.Partitions
	clock       Clock
	logger      *log.Logger
	snapshots   *snapshotFile // nil when the Bloom filters are not persisted
	sealedDir   *snapshotFile // the sealed partitions' directory (Default)
	dirLock     io.Closer     // bloom-only's hold on Dir

	secret shard.Secret // keys the fingerprints; persisted by Default and BloomOnly
	hasher shard.Hasher // of secret
	mem    *memory.Table
	bloom  *bloom.Filters // the optional filter: nil unless Default or BloomOnly
	// exact is the exact tier, nil when there is none (MemoryOnly,
	// BloomOnly); where says where its claims live, and the optional
	// interfaces it implements are kept beside it (nil when it does not).
	exact   tier.Exact
	where   tier.Where
	writer  tier.CommitWriter
	dropper tier.Dropper
	scanner tier.Scanner
	latch   tier.Latching
	marker  tier.Marker
	// extender extends leases in the shared tier (nil: none, or claims
	// live in memory).
	extender tier.Extender
	// looker reads a shared tier without claiming; forgetter removes keys
	// from the exact tier (nil when it cannot).
	looker    tier.Looker
	forgetter tier.Forgetter
	advancer  tier.Advancer // compares versions in the shared tier
	// nsWindows are the namespaces' own windows (Options.NamespaceWindows).
	nsWindows map[string]int64
	// noSharedCache: memory keeps no commits of a shared tier
	// (Options.NoSharedCache), so a Forget reaches every process.
	noSharedCache bool
	// store is the embedded Pebble store (Default), for what its lifecycle
	// alone needs: its layout, snapshot epochs, compaction, disk figures.
	store   *pebble.Store
	process [8]byte      // random; with a claim's counter, its owner token in a shared tier
	retries retries      // claims in a shared tier whose reply was lost, for their retries
	queue   *commitQueue // the group commit; nil without an exact tier

	// warm is true while the Bloom filters have seen every key the store
	// holds, so a "no" may skip the store.
	warm       atomic.Bool
	rebuilding atomic.Bool
	// cold, while rebuilding, lists the partitions whose filter the
	// rebuild is refilling; every other live partition's filter is
	// complete. Nil when warm, or when no filter is known complete.
	cold atomic.Pointer[[]int64]
	// gate tracks the writes in flight, so the sealer knows when a closed
	// partition gets no more; sealed is the sealer's (and Open's) set of
	// partitions whose filter is saved with a seal the store holds; the
	// sealer wakes on sealWake (nil when partitions are not sealed).
	gate     writeGate
	sealFrom int64      // the partition the store was created in: the sealer skips older ones, which hold nothing
	sealMu   sync.Mutex // held by a sealing pass
	sealed   map[int64]bool
	sealWake chan struct{}

	highWater atomic.Int64 // highest clock reading seen, Unix ns
	current   atomic.Int64 // current partition
	openedAt  int64        // first clock reading, for Stats.Coverage
	rotateMu  sync.Mutex   // serialises rotation
	// counts orders attempt counts against commits and Forgets where the
	// engine keeps them in its exact tier (ClaimsInEngine with
	// MaxAttempts). A release frees its claim in memory before its count
	// is durable, so another claim may take the key meanwhile: the release
	// write-holds counts across that gap, and commits (their durable
	// write) and Forgets (fence to delete) read-hold it. So no count lands
	// after a later commit of its key (and erases it), nor after a Forget
	// read the key (and brings back what it reported removing).
	counts sync.RWMutex
	tokens atomic.Uint64

	life struct {
		sync.RWMutex // read-held by every call; write-held by Close
		closed       bool
	}
	stop    context.CancelFunc
	workers sync.WaitGroup // background rebuild

	scratch sync.Pool // *batch
	stats   counters
	def     Namespace
}

// Open returns an Engine configured by opts. In Default it opens (or
// creates) the Pebble directory exclusively: ErrLocked if another engine
// has it.
func Open(opts *Options) (*Engine, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.WithDefaults()
	window, partition := o.Window, o.Partition
	parts, _ := tier.NewPartitions(window, partition)
	e := &Engine{
		tiers:       o.Tiers,
		window:      int64(window),
		cacheFor:    int64(window),
		lease:       int64(o.Lease),
		maxKey:      o.MaxKeySize,
		maxResult:   o.MaxResultSize,
		results:     o.Tiers == MemoryOnly,
		maxAttempts: o.MaxAttempts,
		parts:       parts,
		clock:       o.Clock,
		logger:      o.Logger,
	}
	e.def = Namespace{e: e}
	e.tokens.Store(uint64(time.Now().UnixNano()))

	mopts := &memory.Options{Capacity: o.MemoryCapacity, Stripes: o.Stripes, MaxAttempts: o.MaxAttempts, Results: o.Tiers == MemoryOnly}
	switch o.Tiers {
	case BloomOnly:
		mopts.Capacity, mopts.NoCommitted = 0, true
	case Redis, Postgres:
		// The shared tier alone counts attempts: it sees every process's,
		// and keeps them exactly as long as it says (a count here could
		// outlive or exceed the shared one, and answer Poison for a
		// committed key).
		mopts.MaxAttempts = 0
		if o.NoSharedCache {
			mopts.Capacity, mopts.NoCommitted = 0, true
			e.noSharedCache = true
		}
	}
	var err error
	if e.mem, err = memory.New(mopts); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if o.Dir != "" {
		e.snapshots = newSnapshotFile(o.FS, o.Dir)
		e.sealedDir = newSnapshotFile(o.FS, e.snapshots.fs.PathJoin(o.Dir, sealedSubdir))
	}

	now := e.reading()
	e.secret = shard.NewSecret() // memory-only and Redis: fingerprints live only in this process
	if o.Tiers == Default {
		// An Import of Dir a crash interrupted is finished first: Dir is
		// never opened empty in place of the state it was replacing.
		if err := finishImport(e.snapshots.fs, canonical(e.snapshots.fs, o.Dir)); err != nil {
			return nil, err
		}
		if err := e.snapshots.refuseState(); err != nil {
			return nil, err
		}
		e.store, err = pebble.Open(&pebble.Options{Dir: o.Dir, FS: o.FS, NoSync: o.NoSync, CacheSize: o.CacheSize, Logger: o.Logger, Partition: partition, Window: window, Now: now})
		switch {
		case errors.Is(err, pebble.ErrLocked):
			return nil, fmt.Errorf("%w: %w", ErrLocked, err)
		case errors.Is(err, pebble.ErrLayout):
			return nil, fmt.Errorf("%w: %w", ErrLayout, err)
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrStorage, err)
		}
		e.exact = e.store
		e.secret = e.store.Layout().Secret
		hw, err := e.store.HighWater()
		if err != nil {
			e.store.Close()
			return nil, fmt.Errorf("%w: %w", ErrStorage, err)
		}
		now = max(now, hw)
		e.sealFrom = math.MinInt64
		if created, err := e.store.Created(); err == nil {
			if created < now {
				e.openedAt = created
			}
			e.sealFrom = parts.Of(created)
		}
	}

	if o.Tiers == Redis {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rs, err := redis.New(ctx, o.Redis, &redis.Options{
			Prefix: o.RedisPrefix, Window: window, RequireNoEviction: o.RequireNoEviction, Logger: o.Logger,
			MaxAttempts: o.MaxAttempts, NamespaceWindows: o.NamespaceWindows, Uncached: o.NoSharedCache,
		})
		switch {
		case errors.Is(err, redis.ErrEvictionPolicy), errors.Is(err, redis.ErrOptions):
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		case errors.Is(err, redis.ErrLayout):
			return nil, fmt.Errorf("%w: %w", ErrLayout, err)
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		e.share(rs, o.FailOpen)
	}
	if o.Tiers == Postgres {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ps, err := postgres.New(ctx, o.Postgres, &postgres.Options{Table: o.PostgresTable, Window: window, MaxAttempts: o.MaxAttempts, Uncached: o.NoSharedCache})
		switch {
		case errors.Is(err, postgres.ErrOptions):
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		case errors.Is(err, postgres.ErrLayout):
			return nil, fmt.Errorf("%w: %w", ErrLayout, err)
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		e.share(ps, o.FailOpen)
	}
	if e.exact != nil {
		// Capabilities are the tier's own, found under the fail-open
		// wrapper; marks go through it, as claims and commits do.
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

	if len(o.NamespaceWindows) > 0 {
		e.nsWindows = make(map[string]int64, len(o.NamespaceWindows))
		for name, w := range o.NamespaceWindows {
			e.nsWindows[name] = int64(w)
		}
	}
	e.def = *e.newNamespace("") // now that where claims live is known

	if o.Tiers == Default || o.Tiers == BloomOnly {
		bopts := &bloom.Options{Partitions: parts, ExpectedKeys: o.ExpectedKeys, FalsePositive: o.FalsePositive}
		if e.bloom, err = bloom.New(bopts, parts.Of(now)); err != nil {
			e.closeStore()
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		}
	}
	if o.Tiers == BloomOnly && e.snapshots != nil {
		// One engine at a time: two would each save their own filters at
		// Close, and the last would erase the other's keys.
		if e.dirLock, err = e.snapshots.lock(); err != nil {
			return nil, err
		}
		// The snapshot is the whole state of bloom-only: it brings its
		// secret and clock, and one that cannot be used is an error, not a
		// silent fresh start that would let every duplicate through.
		hw, err := e.loadState(o)
		if err != nil {
			_ = e.dirLock.Close()
			return nil, err
		}
		now = max(now, hw)
	}
	if now == 0 {
		// A clock outside the range the engine takes as time, and no
		// stored reading to stand on: running at 1970 would let the
		// first sane reading drop every partition written meanwhile.
		e.closeStore()
		if e.dirLock != nil {
			_ = e.dirLock.Close()
		}
		return nil, fmt.Errorf("%w: Clock reads %v, outside [%v, %v], and the directory holds no earlier reading", ErrOptions, e.clock.Now(), minClock, maxClock)
	}
	e.hasher = shard.NewHasher(e.secret)
	e.highWater.Store(now)
	if e.openedAt == 0 {
		e.openedAt = now
	}
	e.current.Store(parts.Of(now))

	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	switch o.Tiers {
	case BloomOnly:
		e.warm.Store(true)
	case Default:
		// The snapshot can match only the epoch the store sealed at its
		// last clean Close, which TakeSnapshotEpoch forgets before anything
		// else is written; the file is removed whatever the outcome. So a
		// snapshot is trusted at most once, and only for the exact state
		// it was taken of.
		epoch, err := e.store.TakeSnapshotEpoch()
		if err != nil {
			e.closeStore()
			return nil, fmt.Errorf("%w: %w", ErrStorage, err)
		}
		id := e.store.Layout().ID
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
		if derr := e.store.Drop(parts.Oldest(parts.Of(now)), now); derr != nil {
			e.closeStore()
			return nil, fmt.Errorf("%w: %w", ErrStorage, derr)
		}
		var rebuild []int64
		switch {
		case err == nil || e.store.Fresh():
			// Warm from the snapshot, or a store created by this Open,
			// which holds nothing the filters have not seen.
			e.warm.Store(true)
			err = e.keepSealed(parts.Of(now))
		default:
			if !isNotExist(err) {
				e.logger.Printf("tierdedup: bloom snapshot not used, rebuilding from Pebble: %v", err)
			}
			rebuild, err = e.loadSealed(parts.Of(now))
		}
		if err != nil {
			e.closeStore()
			return nil, fmt.Errorf("%w: %w", ErrStorage, err)
		}
		e.sealWake = make(chan struct{}, 1) // before the rebuild, which wakes the sealer
		if !e.warm.Load() {
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
		// Last: nothing after it fails, so its goroutines never leak.
		e.queue = newCommitQueue(e, o.CommitQueue)
	}
	if o.Dir != "" {
		e.holdDir(e.snapshots.fs, o.Dir)
	}
	return e, nil
}

// loadState loads bloom-only's snapshot (it is kept: a crash falls back to
// the state of the last clean Close) and returns its clock. A directory
// holding a Pebble store, a snapshot written for other parameters and a
// damaged snapshot are refused.
func (e *Engine) loadState(o Options) (highWater int64, err error) {
	if err := e.snapshots.refuseStore(); err != nil {
		return 0, err
	}
	err = e.snapshots.load(e.bloom, func(h bloom.SnapshotHeader) error {
		if h.Kind != bloom.SnapshotState {
			return layoutError("Tiers", "memory+bloom+pebble", BloomOnly.String())
		}
		m, k, _ := e.bloom.Params()
		switch {
		case h.PartitionLength != e.parts.Length:
			return layoutError("Partition", time.Duration(h.PartitionLength).String(), time.Duration(e.parts.Length).String())
		case h.Live != e.parts.Live:
			return layoutError("Window", fmt.Sprintf("%d live partitions", h.Live), fmt.Sprintf("%d", e.parts.Live))
		case h.M != m || h.K != k:
			return layoutError("ExpectedKeys/FalsePositive", fmt.Sprintf("filters of %d bits, %d hashes", h.M, h.K), fmt.Sprintf("%d bits, %d hashes", m, k))
		}
		e.secret, highWater = h.Secret, h.HighWater
		return nil
	}, false, e.logger)
	switch {
	case err == nil:
		return highWater, nil
	case isNotExist(err):
		return 0, nil
	case errors.Is(err, ErrLayout):
		return 0, err
	default:
		return 0, fmt.Errorf("%w: bloom-only state: %w (remove the file to start empty)", ErrStorage, err)
	}
}

// share makes x, a tier shared by many processes, the exact tier (behind
// the fail-open wrapper if asked), and draws this engine's random ID, which
// with a claim's counter makes its owner token there.
func (e *Engine) share(x tier.Exact, failOpenOn bool) {
	e.exact = x
	if failOpenOn {
		e.exact = newFailOpen(x, &e.stats.failOpen, time.Duration(e.lease))
	}
	_, _ = rand.Read(e.process[:])
}

func (e *Engine) closeStore() {
	if e.store != nil {
		_ = e.store.Close()
	}
}
