package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Engine answers claims for keys in one or more namespaces. It is safe for
// concurrent use.
type Engine struct {
	tiers  Tiers
	name   string // the configuration's name (Options.Name)
	window int64  // nanoseconds
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
	// toRebuild, between openEmbedded and assemble, lists the partitions
	// whose filter must be rebuilt from the store.
	toRebuild []int64

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
