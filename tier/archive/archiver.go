package archive

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/internal/machine"
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Slots is the archive filter ring's slot count: 4 cache lines a block, 8
// a probe.
const Slots = 32

// maxExpectedKeys bounds one slot's filter sizing (the engine's
// MaxExpectedKeys).
const maxExpectedKeys = 1 << 32

// Config is what the Archiver needs of the engine that opens it
// (tier.ArchiverConfig).
type Config = tier.ArchiverConfig

func init() {
	tier.RegisterArchiver(func(ctx context.Context, backend tier.ArchiveBackend, env tier.ArchiveEnv, c tier.ArchiverConfig) (tier.Archiver, error) {
		a, err := Open(ctx, backend, env, c)
		if err != nil {
			return nil, err // not a nil *Archiver in the interface
		}
		return a, nil
	})
	tier.RegisterArchiverCheck(Check)
}

// Check refuses (tier.ErrOptions) what Open would refuse of c before it
// opens anything: filters larger than the memory the process may use.
func Check(c Config) error {
	lay := FilterLayout(time.Duration(c.Partitions.Length), c.ArchiveWindow)
	return fitsMemory(slotKeys(c, lay), c, lay)
}

// slotKeys is the keys one slot of the archive's filter ring is sized
// for: ExpectedKeys for each of its partitions, at most maxExpectedKeys.
func slotKeys(c Config, lay Layout) int {
	return int(min(int64(c.ExpectedKeys)*int64(lay.Group), maxExpectedKeys))
}

// The Archiver is the engine's tier.Archiver.
var _ tier.Archiver = (*Archiver)(nil)

// Archiver drives one archive behind one exact tier (Open). Its methods
// are safe for concurrent use.
type Archiver struct {
	c       Config
	store   tier.Archive
	name    string
	live    int64 // partitions the archive keeps, the current one counted
	group   int64 // partitions per filter slot
	filters *bloom.Filters
	check   [16]byte
	hasher  shard.Hasher // the filter's: the engine's, or the archive's own behind a log

	// next is the first partition not archived: every partition before
	// it that the exact tier held is in the archive (invariant 1). Behind
	// a log, the first partition not sealed in this engine's filter.
	next atomic.Int64
	mu   sync.RWMutex // Lock: archiving a partition; RLock: a Forget
	wake chan struct{}
	stop context.CancelFunc
	done chan struct{}

	reads, hits, lagReads, archived, keys, failures atomic.Uint64
	held                                            atomic.Int64 // partitions the archive holds, as last listed

	// Behind a shared tier (log.go): the archive that takes the log, the
	// log's entries not drained yet as last read, and whether this engine
	// held the drain lease at its last pass.
	app    tier.ArchiveAppender
	logLag atomic.Int64
	passes atomic.Uint64 // log passes that read the log's length, counted after logLag
	holder atomic.Bool
	// entryBytes is the size of the log's positions as the drain read
	// them, and perPos their entries (readCount); only the drain's
	// goroutine uses them.
	entryBytes, perPos int64
	// trimmedTo is the position the drain last trimmed the log to (zero
	// before its first trim since Open); only the drain's goroutine uses
	// it.
	trimmedTo tier.LogPos
}

// Layout is how the archive's filter covers an archive window
// (FilterLayout): Partitions the archive keeps (the current one counted),
// grouped Group to a filter slot, in Slots slots. Its memory is Slots
// filters each sized for Group partitions' keys.
type Layout struct {
	Partitions, Group, Slots int
}

// FilterLayout returns the archive filter's layout for a partition length
// and an archive window (the capacity planner sizes it with it).
func FilterLayout(partition, archiveWindow time.Duration) Layout {
	live := (int64(archiveWindow)+int64(partition)-1)/int64(partition) + 1
	group := (live + Slots - 2) / (Slots - 1)
	return Layout{Partitions: int(live), Group: int(group), Slots: min(Slots, int((live+group-1)/group)+1)}
}

// fitsMemory refuses (tier.ErrOptions) archive filters whose size, a ring
// of lay.Slots filters of slotKeys keys each, sized whole at Open (they do
// not grow: their blobs are of that size), is more than this process may
// use (machine.Memory; not checked where that is unknown). Such a ring
// opens, as the OS lends untouched pages, but the first seals, which save
// a slot's whole filter, or the filters as they fill get the process
// killed, where an error at Open can name the remedy.
func fitsMemory(slotKeys int, c Config, lay Layout) error {
	fp := c.FalsePositive
	if fp == 0 {
		fp = bloom.DefaultFalsePositive
	}
	need := float64(bloom.Sizing(slotKeys, fp, lay.Slots).Bytes)
	mem, source, err := machine.Memory()
	if err != nil || need <= mem {
		return nil
	}
	return fmt.Errorf("%w: the archive's filters would take %.1f GiB (%d partitions of %v in its window, %d a filter, %d filters, each sized for %d keys a partition: ExpectedKeys), more than the %.1f GiB this process may use (%s): set ExpectedKeys to the keys one partition receives, or make Partition longer",
		tier.ErrOptions, need/(1<<30), lay.Partitions, time.Duration(c.Partitions.Length), lay.Group, lay.Slots, c.ExpectedKeys, mem/(1<<30), source)
}

// Open opens backend behind the exact tier c describes, loads its filters
// and starts nothing yet (Start does). Its errors match tier.ErrOptions
// (a configuration the archive cannot serve), tier.ErrLayout (an archive
// of another store, or one that lost what the store recorded archived),
// tier.ErrLocked, tier.ErrStorage, or tier.ErrUnavailable. On an error
// the archive is closed.
func Open(ctx context.Context, backend tier.ArchiveBackend, env tier.ArchiveEnv, c Config) (_ *Archiver, err error) {
	a := &Archiver{c: c, name: backend.Name(), hasher: c.Hasher, wake: make(chan struct{}, 1)}
	lay := FilterLayout(time.Duration(c.Partitions.Length), c.ArchiveWindow)
	a.live, a.group = int64(lay.Partitions), int64(lay.Group)
	if err := Check(c); err != nil {
		return nil, err // before anything is opened or written
	}
	if c.Local != nil {
		if c.Scanner == nil || c.Hot == nil {
			return nil, fmt.Errorf("%w: an archive behind a local store needs its Scanner and Hot", tier.ErrOptions)
		}
		gen, err := c.Local.ArchiveGeneration()
		if err != nil {
			return nil, err
		}
		_, archived, err := c.Local.Archived()
		if err != nil {
			return nil, err
		}
		a.check = hashCheck(c.Hasher)
		env.Owner, env.Check, env.Existing = owner(c.Local.ID(), gen), a.check, archived
	} else {
		if c.Log == nil {
			return nil, fmt.Errorf("%w: Archive behind %s, which keeps no archive log", tier.ErrOptions, c.TierName)
		}
		// The archive's own secret keys its filters: recorded in it, the
		// check of the layout is the archive's to keep.
		env.Owner, env.Log = c.Log.LogOwner(), true
	}
	st, err := backend.Open(ctx, env)
	switch {
	case errors.Is(err, tier.ErrOptions), errors.Is(err, tier.ErrLayout), errors.Is(err, tier.ErrLocked):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
	}
	a.store = st
	defer func() {
		if err != nil {
			_ = st.Close()
		}
	}()
	if c.Log != nil {
		app, ok := st.(tier.ArchiveAppender)
		if !ok {
			return nil, fmt.Errorf("%w: archive %s cannot take a shared tier's log", tier.ErrOptions, a.name)
		}
		a.app, a.hasher = app, shard.NewHasher(app.Secret())
		a.check = hashCheck(a.hasher)
	}
	cur := c.Current()
	a.filters, err = bloom.New(&bloom.Options{
		Partitions:    tier.Partitions{Length: a.group * c.Partitions.Length, Live: lay.Slots},
		ExpectedKeys:  slotKeys(c, lay),
		FalsePositive: c.FalsePositive,
	}, cur/a.group)
	if err != nil {
		return nil, fmt.Errorf("%w: archive filters: %w", tier.ErrOptions, err)
	}
	load := a.load
	if c.Log != nil {
		load = func(ctx context.Context, cur int64) error { return a.openLog(ctx, cur, c.Binding(a.check)) }
	}
	if err := load(ctx, cur); err != nil {
		if errors.Is(err, tier.ErrLayout) || errors.Is(err, tier.ErrStorage) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
	}
	if c.Local != nil {
		// Before any partition goes to it: from now on the store opens
		// only with this archive, or detaches it.
		if err := c.Local.SetArchiveAttached(); err != nil {
			return nil, err
		}
		// The store keeps what the archive does not hold yet, and says
		// when it sealed a partition the archive may take.
		c.Local.HoldFor(a.Next)
		c.Local.OnSealed(a.Poke)
	}
	return a, nil
}

// owner is the owner an archive of the embedded store records: the
// store's ID, and the count of archives detached from it before (none:
// the ID alone, as archives made before detaching was counted record).
func owner(id [16]byte, gen int64) string {
	o := "embedded:" + hex.EncodeToString(id[:])
	if gen > 0 {
		o += "/" + strconv.FormatInt(gen, 10)
	}
	return o
}

// hashCheck is the digest of a hasher's secret a filter blob records.
func hashCheck(h shard.Hasher) (check [16]byte) {
	fp := shard.Sum(h, "\x00archive", nil)
	copy(check[:8], u64(fp.Hi))
	copy(check[8:], u64(fp.Lo))
	return check
}

func u64(x uint64) []byte {
	var b [8]byte
	for i := range b {
		b[i] = byte(x >> (8 * i))
	}
	return b[:]
}

// Check is the digest of the secret keying the archive's filters (the
// engine's, or the archive's own behind a shared tier's log).
func (a *Archiver) Check() [16]byte { return a.check }

// Next is how far the archive reaches: the first partition not archived
// (behind a log, not sealed in this engine's filter). The exact tier may
// drop the partitions before it that left its window.
func (a *Archiver) Next() int64 { return a.next.Load() }

// Shared reports an archive fed from a shared tier's log.
func (a *Archiver) Shared() bool { return a.c.Log != nil }

// Forgetting holds archiving off while a Forget runs (invariant 3); the
// caller calls the returned function when its removal is done.
func (a *Archiver) Forgetting() (done func()) {
	a.mu.RLock()
	return a.mu.RUnlock
}

// oldest is the oldest partition the archive keeps when cur is current.
func (a *Archiver) oldest(cur int64) int64 { return cur - a.live + 1 }

// blobName names group g's filter blob.
func blobName(g int64) string { return "filter-" + strconv.FormatInt(g, 10) }

func blobGroup(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "filter-")
	if !ok {
		return 0, false
	}
	g, err := strconv.ParseInt(s, 10, 64)
	return g, err == nil && g >= 0
}

// Start runs the archiving loop.
func (a *Archiver) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	a.stop, a.done = cancel, make(chan struct{})
	go a.loop(ctx)
	a.Poke()
}

// Grow records the longer archive window Open found, where the archive
// left it to be recorded (tier.ArchiveWindowGrower); see tier.Archiver.
func (a *Archiver) Grow(ctx context.Context) error {
	g, ok := a.store.(tier.ArchiveWindowGrower)
	if !ok {
		return nil
	}
	if err := g.GrowWindow(ctx); err != nil {
		if errors.Is(err, tier.ErrStorage) {
			return err
		}
		return fmt.Errorf("%w: archive: recording its longer window: %w", tier.ErrUnavailable, err)
	}
	return nil
}

// Poke wakes the loop: a partition closed, or the store sealed one.
func (a *Archiver) Poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// loop archives whenever woken: a rotation (a partition closed) or the
// store's seal of one (the partition's writes are all in). A closed
// partition waiting for its seal waits for that event; a failed pass is
// tried again a second later. Behind a shared tier's log, which nothing
// announces, it passes every logTick.
func (a *Archiver) loop(ctx context.Context) {
	defer close(a.done)
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-retry.C:
		}
		if a.c.Log != nil {
			a.logPass(ctx)
			retry.Reset(logTick)
		} else if failed := a.pass(ctx); failed {
			retry.Reset(time.Second)
		}
	}
}

// hook calls the test hook of a stage of archiving, if set.
func hook(stage string) {
	if f := hooks.InArchive.Load(); f != nil {
		(*f)(stage)
	}
}

// Close stops the loop (between partitions) and closes the archive.
func (a *Archiver) Close() error {
	if a.stop != nil {
		a.stop()
		<-a.done
	}
	return a.store.Close()
}
