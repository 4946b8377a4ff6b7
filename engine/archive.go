package engine

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// The archive (Options.Archive) keeps every committed key of a partition
// that left the window for ArchiveWindow after it:
//
//	commit ──► hot partition p (exact tier, the Window)
//	           │ p closes and is sealed
//	           ▼
//	           archive.Put(p) ──► archived (durable) ──► the exact tier may drop p
//	                                                     once p leaves the Window
//	                              │ ArchiveWindow after p
//	                              ▼
//	                              archive.Drop: the key is New again
//
// A closed partition is archived as soon as it is sealed, so the archive
// normally holds it long before it leaves the window; the exact tier drops
// a partition only once the archive holds it (dropFloor), and while the
// archive lags behind the window, the exact tier's partitions that left
// the window are still read, unfiltered, for every key found nowhere else
// (lagRead).
//
// A filter ring of its own covers the archive (archiveSlots slots of
// group partitions each): a key it rules out never reaches the archive.
// Each slot's filter is saved in the archive as a blob after each
// partition it takes in, naming the newest partition it covers; a
// partition archived after its group's blob (a crash between the two) is
// scanned back into the filter at Open. What makes a blob invalid, and
// who checks (Open): another kind, secret check or filter parameters, or a
// damaged file (the snapshot's checksum), or one whose newest partition
// is not in the group its name gives: it is not loaded, and its group's
// partitions are scanned.
//
// Invariants:
//
//  1. The exact tier drops partition p only after archive.Put(p)
//     returned (next > p): no committed key is ever in neither.
//  2. A key is added to the archive filter before its partition becomes
//     visible to claims (next moves past it).
//  3. A Forget and the archiving of a partition exclude each other (mu),
//     so an archived copy never brings back a key a Forget removed.
//  4. The archive is consulted only for keys the exact tier left New,
//     and an archive that cannot answer fails the call (ErrUnavailable):
//     it never makes a key New.

// archiveSlots is the archive filter ring's slot count: 4 cache lines a
// block, 8 a probe.
const archiveSlots = 32

// archiveNS reports whether a namespace's keys are archived: not the
// engine's own (tokens), whose promise is their window.
func archiveNS(ns string) bool { return !strings.HasPrefix(ns, "\x00") }

// archiver drives the archive of the embedded store.
type archiver struct {
	e       *Engine
	store   tier.Archive
	name    string
	scanner tier.RecordScanner
	live    int64 // partitions the archive keeps, the current one counted
	group   int64 // partitions per filter slot
	filters *bloom.Filters
	check   [16]byte

	// next is the first partition not archived: every partition before
	// it that the exact tier held is in the archive (invariant 1).
	next atomic.Int64
	mu   sync.RWMutex // Lock: archiving a partition; RLock: a Forget
	wake chan struct{}
	stop context.CancelFunc
	done chan struct{}

	reads, hits, lagReads, archived, keys, failures atomic.Uint64
	held                                            atomic.Int64 // partitions the archive holds, as last listed

	// Behind a shared tier (archive_log.go): the tier's log, the archive
	// that takes it, the archive's own hasher (its filters are shared by
	// every process), this engine's name for the drain lease, the log's
	// entries not drained yet as last read, and whether this engine held
	// the lease at its last pass. next is then the first partition not
	// sealed in this engine's filter.
	log    tier.ArchiveLog
	app    tier.ArchiveAppender
	hasher shard.Hasher
	owner  string
	logLag atomic.Int64
	holder atomic.Bool
	// entryBytes is the size of the log's entries as the drain read them
	// (readCount); only the drain's goroutine uses it.
	entryBytes int64
}

// ArchiveLayout is how the archive's filter covers an archive window
// (ArchiveFilterLayout): Partitions the archive keeps (the current one
// counted), grouped Group to a filter slot, in Slots slots. Its memory is
// Slots filters each sized for Group partitions' keys.
type ArchiveLayout struct {
	Partitions, Group, Slots int
}

// ArchiveFilterLayout returns the archive filter's layout for a partition
// length and an archive window (the capacity planner sizes it with it).
func ArchiveFilterLayout(partition, archiveWindow time.Duration) ArchiveLayout {
	live := (int64(archiveWindow)+int64(partition)-1)/int64(partition) + 1
	group := (live + archiveSlots - 2) / (archiveSlots - 1)
	return ArchiveLayout{Partitions: int(live), Group: int(group), Slots: min(archiveSlots, int((live+group-1)/group)+1)}
}

// openArchive opens o.Archive behind the embedded store, loads its
// filters and starts nothing yet (startArchive does).
func (e *Engine) openArchive(o Options, opened *closers) error {
	env := o.archiveEnv(e.parts)
	a := &archiver{e: e, name: o.Archive.Name(), hasher: e.hasher, wake: make(chan struct{}, 1)}
	if e.local != nil {
		scanner, ok := e.exact.(tier.RecordScanner)
		if !ok || e.archSrc == nil {
			return fmt.Errorf("%w: Archive needs the embedded store (Tiers Default, embedded.Dir)", ErrOptions)
		}
		gen, err := e.archSrc.ArchiveGeneration()
		if err != nil {
			return err
		}
		_, archived, err := e.archSrc.Archived()
		if err != nil {
			return err
		}
		a.scanner, a.check = scanner, hashCheck(e.hasher)
		env.Owner, env.Check, env.Existing = archiveOwner(e.archSrc.ID(), gen), a.check, archived
	} else {
		lg, ok := e.exact.(tier.ArchiveLog)
		if !ok {
			return fmt.Errorf("%w: Archive behind %s, which keeps no archive log", ErrOptions, e.name)
		}
		// The archive's own secret keys its filters: recorded in it, the
		// check of the layout is the archive's to keep.
		a.log, env.Owner, env.Log = lg, lg.LogOwner(), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	st, err := o.Archive.Open(ctx, env)
	switch {
	case errors.Is(err, ErrOptions), errors.Is(err, ErrLayout), errors.Is(err, ErrLocked):
		return err
	case err != nil:
		return fmt.Errorf("%w: archive: %w", ErrUnavailable, err)
	}
	opened.add(st)
	a.store = st
	if a.log != nil {
		app, ok := st.(tier.ArchiveAppender)
		if !ok {
			return fmt.Errorf("%w: archive %s cannot take a shared tier's log", ErrOptions, a.name)
		}
		a.app, a.hasher = app, shard.NewHasher(app.Secret())
		a.check = hashCheck(a.hasher)
		a.owner = hex.EncodeToString(e.process[:])
	}
	lay := ArchiveFilterLayout(o.Partition, o.ArchiveWindow)
	a.live, a.group = int64(lay.Partitions), int64(lay.Group)
	slots := lay.Slots
	cur := e.current.Load()
	a.filters, err = bloom.New(&bloom.Options{
		Partitions:    tier.Partitions{Length: a.group * e.parts.Length, Live: slots},
		ExpectedKeys:  int(min(int64(o.ExpectedKeys)*a.group, MaxExpectedKeys)),
		FalsePositive: o.ArchiveFalsePositive,
	}, cur/a.group)
	if err != nil {
		return fmt.Errorf("%w: archive filters: %w", ErrOptions, err)
	}
	load := a.load
	if a.log != nil {
		load = func(ctx context.Context, cur int64) error { return a.openLog(ctx, cur, o.archiveBinding(a.check)) }
	}
	if err := load(ctx, cur); err != nil {
		if errors.Is(err, ErrLayout) || errors.Is(err, ErrStorage) {
			return err
		}
		return fmt.Errorf("%w: archive: %w", ErrUnavailable, err)
	}
	if e.archSrc != nil {
		// Before any partition goes to it: from now on the store opens
		// only with this archive, or detaches it.
		if err := e.archSrc.SetArchiveAttached(); err != nil {
			return err
		}
	}
	e.arch = a
	return nil
}

// withoutArchive opens the embedded store without an archive. A store
// that archived partitions (and dropped them from itself) is refused
// unless detach: opened without its archive it would answer New for that
// history, and its Forgets would miss it, so that an archive attached
// again later would bring forgotten keys back. With detach the history
// is let go, durably, and the store's detached archives are counted: an
// archive records the count it was attached at (in its owner), so the
// detached one is refused from then on (ErrLayout); a new archive starts
// empty.
func (e *Engine) withoutArchive(detach bool) error {
	next, ok, err := e.archSrc.Archived()
	if err != nil {
		return err
	}
	attached, err := e.archSrc.ArchiveAttached()
	switch {
	case err != nil:
		return err
	case !ok && !attached:
		return nil
	case !detach && !ok:
		// Attached, nothing recorded archived yet: a Put whose reply was
		// lost may have stored a partition all the same.
		return fmt.Errorf("%w: the store has an archive attached: open it with its Options.Archive, or set Options.DetachArchive to let it go (it cannot be attached again)", ErrLayout)
	case !detach:
		return fmt.Errorf("%w: the store moved its partitions before %d to an archive (and may have dropped them): open it with its Options.Archive, or set Options.DetachArchive to let that history go (the archive cannot be attached again)", ErrLayout, next)
	}
	if _, err := e.archSrc.DetachArchive(); err != nil {
		return err
	}
	if ok {
		e.logger.Printf("tierdedup: the archive is detached: keys of partitions before %d that left the window are New from now on", next)
	} else {
		e.logger.Printf("tierdedup: the archive is detached")
	}
	return nil
}

// archiveOwner is the owner an archive of the embedded store records: the
// store's ID, and the count of archives detached from it before (none:
// the ID alone, as archives made before detaching was counted record).
func archiveOwner(id [16]byte, gen int64) string {
	owner := "embedded:" + hex.EncodeToString(id[:])
	if gen > 0 {
		owner += "/" + strconv.FormatInt(gen, 10)
	}
	return owner
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

// oldest is the oldest partition the archive keeps when cur is current.
func (a *archiver) oldest(cur int64) int64 { return cur - a.live + 1 }

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

// load drops what expired, loads each group's filter blob and scans back
// every archived partition no blob covers, and sets next.
func (a *archiver) load(ctx context.Context, cur int64) error {
	oldest := a.oldest(cur)
	if err := a.store.Drop(ctx, oldest); err != nil {
		return err
	}
	held, err := a.store.Archived(ctx)
	if err != nil {
		return err
	}
	a.held.Store(int64(len(held)))
	names, err := a.store.Blobs(ctx)
	if err != nil {
		return err
	}
	var groups []int64
	for _, n := range names {
		g, ok := blobGroup(n)
		if !ok {
			continue
		}
		if (g+1)*a.group <= oldest {
			_ = a.store.DeleteBlob(ctx, n) // every partition it covers expired
			continue
		}
		groups = append(groups, g)
	}
	covered, err := a.mergeBlobs(ctx, groups)
	if err != nil {
		return err
	}
	// An archive that lost what the store dropped (deleted, replaced by an
	// empty one, restored from an older copy) would answer New for keys
	// committed inside its window: refused.
	if rec, ok, err := a.e.archSrc.Archived(); err != nil {
		return err
	} else if ok && rec-1 >= oldest && !slices.Contains(held, rec-1) {
		return fmt.Errorf("%w: the archive does not hold partition %d, which the store recorded as archived (and may have dropped): a lost, replaced or older archive", ErrLayout, rec-1)
	}
	next := max(oldest, a.e.parts.Of(a.e.openedAt))
	for _, p := range held {
		if p < oldest {
			continue
		}
		next = max(next, p+1)
		if c, ok := covered[p/a.group]; ok && p <= c {
			continue
		}
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
	}
	a.next.Store(next)
	return nil
}

// mergeBlobs merges each group's filter blob into the archive filter and
// returns, for each group whose blob it merged, the newest partition the
// blob covers. A blob refused (another kind, secret or filter parameters,
// a damaged checksum, or a partition outside the group its name gives) is
// logged and left out: its group's partitions are scanned.
func (a *archiver) mergeBlobs(ctx context.Context, groups []int64) (map[int64]int64, error) {
	covered := map[int64]int64{}
	var srcs []bloom.SnapshotSource
	var merged []int64
	var open []tier.ReadBlob
	defer func() {
		for _, b := range open {
			_ = b.Close()
		}
	}()
	for _, g := range groups {
		b, ok, err := a.store.Blob(ctx, blobName(g))
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		open = append(open, b)
		srcs = append(srcs, bloom.SnapshotSource{R: b, Size: b.Size(), Accept: func(h bloom.SnapshotHeader) error {
			switch {
			case h.Kind != bloom.SnapshotArchive:
				return fmt.Errorf("blob kind %d is not an archive filter", h.Kind)
			case h.Secret != a.check:
				return errors.New("archive filter of another secret")
			case int64(h.Epoch)/a.group != g:
				// Its name and its content disagree (a file copied or
				// renamed): the snapshot's own partition decides.
				return fmt.Errorf("archive filter of partition %d stored as group %d's", h.Epoch, g)
			}
			covered[g] = int64(h.Epoch)
			return nil
		}})
		merged = append(merged, g)
	}
	for i, err := range a.filters.MergeSnapshots(srcs) {
		if err != nil {
			delete(covered, merged[i])
			a.e.logger.Printf("tierdedup: archive filter blob %s not used, its partitions are scanned: %v", blobName(merged[i]), err)
		}
	}
	return covered, nil
}

// scanBack adds archived partition p's keys to the archive filter.
func (a *archiver) scanBack(ctx context.Context, p int64) error {
	var fps []shard.Fingerprint
	err := a.store.Scan(ctx, p, func(ns, key []byte) error {
		fps = append(fps, shard.Sum(a.hasher, ns, key))
		if len(fps) == cap(fps) && len(fps) >= 1024 {
			a.filters.Add(fps, p/a.group)
			fps = fps[:0]
		}
		return nil
	})
	a.filters.Add(fps, p/a.group)
	return err
}

// start runs the archiving loop.
func (a *archiver) start() {
	ctx, cancel := context.WithCancel(context.Background())
	a.stop, a.done = cancel, make(chan struct{})
	go a.loop(ctx)
	a.poke()
}

func (a *archiver) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// loop archives whenever woken (a rotation), and retries every second
// while a closed partition waits for its seal or the archive fails.
func (a *archiver) loop(ctx context.Context) {
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
		if a.log != nil {
			a.logPass(ctx)
			retry.Reset(logTick)
		} else if behind := a.pass(ctx); behind {
			retry.Reset(time.Second)
		}
	}
}

// pass archives every closed, sealed partition not archived yet, oldest
// first, expires the archive, and lets the exact tier drop what the
// archive now holds. It reports whether a closed partition is still
// waiting.
func (a *archiver) pass(ctx context.Context) (behind bool) {
	e := a.e
	for ctx.Err() == nil {
		cur := e.current.Load()
		p := a.next.Load()
		if p >= cur {
			break
		}
		if p >= e.parts.Oldest(cur) && !e.local.Sealed(p) {
			return true // its writes may not all be in yet
		}
		if err := a.archive(ctx, p); err != nil {
			if ctx.Err() == nil {
				a.failures.Add(1)
				e.logger.Printf("tierdedup: archiving partition %d: %v", p, err)
			}
			return true
		}
	}
	if ctx.Err() != nil {
		return false
	}
	cur := e.current.Load()
	if err := a.store.Drop(ctx, a.oldest(cur)); err != nil {
		a.failures.Add(1)
		e.logger.Printf("tierdedup: expiring the archive: %v", err)
		return true
	}
	a.filters.Rotate(cur / a.group)
	if held, err := a.store.Archived(ctx); err == nil {
		a.held.Store(int64(len(held)))
	}
	archiveHook("drop")
	if err := e.dropHot(); err != nil {
		e.logger.Printf("tierdedup: dropping archived partitions: %v", err)
		return true
	}
	return false
}

// archive copies partition p of the exact tier into the archive, its keys
// into the archive filter, and saves p's group filter.
func (a *archiver) archive(ctx context.Context, p int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := p / a.group
	fps := make([]shard.Fingerprint, 0, 1024)
	var n uint64
	err := a.store.Put(ctx, p, func(put func(*tier.Record) error) error {
		return a.scanner.ScanRecords(ctx, p, func(r *tier.Record) error {
			if !archiveNS(string(r.NS)) {
				return nil
			}
			fps = append(fps, shard.Sum(a.e.hasher, r.NS, r.Key))
			if len(fps) == cap(fps) {
				a.filters.Add(fps, g) // before p becomes visible (invariant 2)
				fps = fps[:0]
			}
			if n == 0 {
				archiveHook("put")
			}
			n++
			return put(r)
		})
	})
	a.filters.Add(fps, g)
	if err != nil {
		return err
	}
	archiveHook("held")
	if err := a.e.archSrc.SetArchived(p + 1); err != nil {
		return err // before next moves: the exact tier keeps p
	}
	a.next.Store(p + 1)
	a.archived.Add(1)
	a.keys.Add(n)
	if err := a.store.PutBlob(ctx, blobName(g), func(w io.Writer) error {
		_, err := a.filters.WritePartition(w, g, bloom.SnapshotMeta{Kind: bloom.SnapshotArchive, Secret: a.check, Epoch: uint64(p)})
		return err
	}); err != nil && ctx.Err() == nil {
		// The next Open scans the partitions the blob misses.
		a.e.logger.Printf("tierdedup: saving the archive filter of partition %d: %v", p, err)
	}
	archiveHook("blob")
	return nil
}

// archiveHook calls the test hook of a stage of archiving, if set.
func archiveHook(stage string) {
	if f := hooks.InArchive.Load(); f != nil {
		(*f)(stage)
	}
}

// close stops the loop and closes the archive.
func (a *archiver) close() error {
	if a.stop != nil {
		a.stop()
		<-a.done
	}
	return a.store.Close()
}

// dropFloor is the first partition the exact tier must keep: the oldest
// live one, or the first the archive does not hold yet.
func (e *Engine) dropFloor(cur int64) int64 {
	floor := e.parts.Oldest(cur)
	if e.arch != nil {
		floor = min(floor, e.arch.next.Load())
	}
	return floor
}

// dropHot drops from the exact tier what the window and the archive let
// go, recording the clock as read under rotateMu (a reading taken before
// it could be older than one a rotation recorded meanwhile, and the
// recorded clock must never move back).
func (e *Engine) dropHot() error {
	e.rotateMu.Lock()
	defer e.rotateMu.Unlock()
	return e.dropper.Drop(e.dropFloor(e.current.Load()), e.highWater.Load())
}

// archiveCandidate is a key the exact tier left New that the archive may
// hold.
type archiveCandidate struct {
	j int // candidate index (b.cand)
	i int // key index
}

// resolveArchive answers from the archive the candidates the exact tier
// left New: Duplicate (or Conflict) when the archive holds them inside
// the archive window. The call fails, changing nothing, when the archive
// or a lagging partition cannot be read.
func (e *Engine) resolveArchive(ctx context.Context, b *batch, ns *Namespace, out []Claim, d decision, c *tally, now int64) error {
	a := e.arch
	if a == nil || ns.archiveWindow == 0 {
		return nil
	}
	var keys [][]byte
	var digests []Digest
	var idx []int
	for j, i := range b.cand {
		// Behind a shared tier a key another process holds may be one it
		// claimed only to ask the archive: asked here too, so an archived
		// key is Duplicate, not InFlight, while that claim lasts.
		held := out[i].Outcome == InFlight && a.log != nil
		if out[i].Outcome == New && !out[i].undo || held {
			keys = append(keys, out[i].Key)
			digests = append(digests, out[i].digest)
			idx = append(idx, j)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	fps := make([]shard.Fingerprint, len(idx))
	for q, j := range idx {
		fps[q] = d.fps[j]
	}
	ans, err := a.find(ctx, ns, keys, fps, now)
	if err != nil {
		var turned []int
		for _, j := range idx {
			if out[b.cand[j]].Outcome == New {
				turned = append(turned, b.cand[j])
			}
		}
		e.giveBackShared(ctx, ns, out, turned, now)
		return err
	}
	var turned []int // claims this call holds in the shared tier, to give back
	defer func() { e.giveBackShared(ctx, ns, out, turned, now) }()
	for q, j := range idx {
		r := &ans[q]
		if r.Status != tier.Committed || ns.archiveExpired(r.Partition, r.At, now) {
			continue
		}
		if out[b.cand[j]].Outcome == New {
			turned = append(turned, b.cand[j])
		}
		cl := &out[b.cand[j]]
		cl.Outcome = Duplicate
		if conflicts(digests[q], r.Digest) {
			cl.Outcome = Conflict
		}
		d.digests[j], cl.digest = r.Digest, r.Digest
		cl.Result, cl.CommittedAt = r.Result, r.At
		if r.Result == nil {
			cl.CommittedAt = 0
		}
		d.actions[j] = memory.Drop // not cached: memory would outlive the hot window's expiry rules
		c.storeHits++
	}
	return nil
}

// giveBackShared gives back the shared tier's claims of out[i] for each
// i of idx, which the archive answered (or could not answer): the tier
// acquired them because it no longer holds the key. A give-back that
// fails leaves the claim to its lease, after which a claim asks the
// archive again.
func (e *Engine) giveBackShared(ctx context.Context, ns *Namespace, out []Claim, idx []int, now int64) {
	if e.where != tier.ClaimsInStore || len(idx) == 0 {
		return
	}
	reqs, st := make([]tier.Request, len(idx)), make([]tier.Status, len(idx))
	for q, i := range idx {
		reqs[q] = tier.Request{NS: ns.name, Key: out[i].Key, Token: e.ownerToken(out[i].rtoken), Attempts: out[i].attempts}
	}
	gctx, cancel := giveBackContext(ctx)
	defer cancel()
	if err := e.exact.Release(gctx, e.parts.Of(now), reqs, true, st); err != nil {
		e.logger.Printf("tierdedup: giving back %d claims the archive answered: %v (they end with their lease)", len(idx), err)
	}
}

// find answers each key (fingerprint fps[q]) from the exact tier's
// partitions that left the window unarchived and from the archive:
// Committed with the record, or Absent.
//
// The unarchived partitions are read first, then the archive up to the
// first partition not archived as read after that: a partition the
// exact tier dropped meanwhile was archived before it was dropped
// (invariant 1), so one of the two reads holds it.
func (a *archiver) find(ctx context.Context, ns *Namespace, keys [][]byte, fps []shard.Fingerprint, now int64) ([]tier.Answer, error) {
	e := a.e
	cur := e.parts.Of(now)
	hotOldest := e.parts.Oldest(cur)
	oldest := a.oldest(cur)
	out := make([]tier.Answer, len(keys))
	for q := range out {
		out[q] = tier.Answer{Status: tier.Absent, Partition: -1}
	}
	// Every archived partition, not only those past the hot window: the
	// exact tier drops a partition once it is archived, and a window
	// lengthened since (on reopen) does not bring back what it dropped.
	// Partitions the exact tier still holds are answered there first, so
	// this reads the archive only for keys the exact tier left New.
	var upTo int64
	if a.log == nil {
		from := max(a.next.Load(), oldest)
		archiveHook("lagging") // tests: the archiver may archive and drop here
		if err := a.readLagging(ctx, ns.name, keys, from, hotOldest, out, false); err != nil {
			return nil, err
		}
		// Read after the exact tier was: a partition the archiver moved
		// and the exact tier dropped meanwhile (after next had passed it,
		// invariant 1) is then in the range asked of the archive. Read
		// before, it was in neither read.
		upTo = a.next.Load()
	} else {
		var err error
		if upTo, err = a.sealedFor(now); err != nil {
			return nil, err
		}
		fps = a.sums(ns.name, keys)
	}
	// The archive, where its filter says the key may be, in the archived
	// partitions that left the window.
	probes := make([]bloom.Probe, len(fps))
	gOldest := a.filters.Test(fps, probes)
	var qs []tier.ArchiveQuery
	var qidx []int
	for q := range fps {
		m := probes[q].Maybe
		if m == 0 || upTo <= oldest || out[q].Status == tier.Committed {
			continue
		}
		lo := gOldest + int64(bits.TrailingZeros64(m))
		hi := gOldest + int64(63-bits.LeadingZeros64(m))
		from, to := max(lo*a.group, oldest), min((hi+1)*a.group, upTo)
		if from >= to {
			continue
		}
		qs = append(qs, tier.ArchiveQuery{NS: ns.name, Key: keys[q], From: from, To: to})
		qidx = append(qidx, q)
	}
	if len(qs) > 0 {
		ans := make([]tier.Answer, len(qs))
		a.reads.Add(uint64(len(qs)))
		if err := a.store.Lookup(ctx, qs, ans); err != nil {
			return nil, fmt.Errorf("%w: archive: %w", ErrUnavailable, err)
		}
		for k, q := range qidx {
			if ans[k].Status == tier.Committed {
				out[q] = ans[k]
				a.hits.Add(1)
			}
		}
	}
	return out, nil
}

// readLagging reads (or, with forget, removes) each key in the exact
// tier's partitions [from, to) that left the window before the archive
// took them, 64 partitions a request (a request's mask), into out where
// out still says Absent (forget: where it found something).
func (a *archiver) readLagging(ctx context.Context, ns string, keys [][]byte, from, to int64, out []tier.Answer, forget bool) error {
	e := a.e
	for lo := from; lo < to; lo += 64 {
		span := min(to-lo, 64)
		mask := ^uint64(0)
		if span < 64 {
			mask = 1<<span - 1
		}
		var reqs []tier.Request
		var ridx []int
		for q := range keys {
			if forget || out[q].Status == tier.Absent {
				reqs = append(reqs, tier.Request{NS: ns, Key: keys[q], Oldest: lo, Mask: mask})
				ridx = append(ridx, q)
			}
		}
		if len(reqs) == 0 {
			return nil
		}
		ans := make([]tier.Answer, len(reqs))
		var err error
		if forget {
			err = e.forgetter.Forget(ctx, reqs, ans)
		} else {
			a.lagReads.Add(uint64(len(reqs)))
			err = e.exact.Claim(ctx, reqs, 0, ans)
		}
		if err != nil {
			return e.tierError(err)
		}
		for k, q := range ridx {
			if ans[k].Status == tier.Committed && (out[q].Status != tier.Committed || ans[k].Partition > out[q].Partition) {
				out[q] = ans[k]
			}
		}
	}
	return nil
}

// forget removes each key from the exact tier's unarchived partitions
// that left the window and from the archive, answering in out what it
// found (the newest); the caller holds a.mu's read lock, so no partition
// is archived meanwhile and next stays where it is. Behind a shared tier's
// archive log it only reads the archive, once the drain has applied what
// the log held when it was called: the caller calls it before the shared
// tier appends the removal, and then waits (waitApplied) until the drain
// has applied that too.
func (a *archiver) forget(ctx context.Context, ns string, keys [][]byte, now int64, out []tier.Answer) error {
	cur := a.e.parts.Of(now)
	oldest, next := a.oldest(cur), a.next.Load()
	for q := range out {
		out[q] = tier.Answer{Status: tier.Absent, Partition: -1}
	}
	if a.log != nil {
		next = cur + 1 // every partition the log fills, sealed or not
		// A commit still only in the log (Redis let the key go, the drain
		// has not applied it yet) is invisible to the read: wait until the
		// drain has applied what the log holds now, or fail as a Lookup
		// does, rather than answer New for a key that holds a commit.
		if err := a.waitApplied(ctx); err != nil {
			return err
		}
	} else if err := a.readLagging(ctx, ns, keys, max(next, oldest), a.e.parts.Oldest(cur), out, true); err != nil {
		return err
	}
	qs := make([]tier.ArchiveQuery, len(keys))
	for q := range keys {
		qs[q] = tier.ArchiveQuery{NS: ns, Key: keys[q], From: oldest, To: next}
	}
	ans := make([]tier.Answer, len(keys))
	remove := a.store.Forget
	if a.log != nil {
		// The removal the shared tier appends deletes the key in the
		// log's order: a delete here could remove a commit made after
		// this Forget and applied before it. The archive is read before
		// the shared tier appends the removal (lookup calls this first):
		// read after, a drain applying the removal in between would hide
		// what the key held.
		remove = a.store.Lookup
	}
	if err := remove(ctx, qs, ans); err != nil {
		return fmt.Errorf("%w: archive: %w", ErrUnavailable, err)
	}
	for q := range ans {
		if ans[q].Status == tier.Committed && out[q].Status != tier.Committed {
			out[q] = ans[q]
		}
	}
	return nil
}

// ArchiveStats are the archive's figures (Stats.Archive).
type ArchiveStats struct {
	// Name is the archive's ("files", "postgres"); Window its window.
	Name   string
	Window time.Duration
	// Held is the number of partitions the archive holds (as of its last
	// pass); Partitions archived and Keys archived since Open; Lag is the number
	// of closed partitions not archived yet; Failures counts failed
	// archiving passes.
	Held, Partitions, Keys, Lag, Failures uint64
	// Reads are keys looked up in the archive, Hits those it held;
	// LagReads keys read in the exact tier's unarchived partitions that
	// left the window.
	Reads, Hits, LagReads uint64
	// FilterBytes is the archive filter's memory.
	FilterBytes int64
	// Behind a shared tier: LogEntries are the entries of its archive log
	// not drained yet (commits and removals, as last read), and Drainer
	// says whether this engine held the drain lease at its last pass.
	// Lag is then the closed partitions not sealed yet (0 while the drain
	// keeps up).
	LogEntries uint64
	Drainer    bool
}

// readBeforeForget reads the archive for every key of b.cand, for a Forget
// behind a shared tier's archive log, before the shared tier appends the
// removals (see forget).
func (e *Engine) readBeforeForget(ctx context.Context, b *batch, ns *Namespace, keys [][]byte, now int64) ([]tier.Answer, error) {
	ks := make([][]byte, len(b.cand))
	for j, i := range b.cand {
		ks[j] = keys[i]
	}
	ans := make([]tier.Answer, len(ks))
	return ans, e.arch.forget(ctx, ns.name, ks, now, ans)
}

func (a *archiver) stats(window time.Duration) *ArchiveStats {
	cur := a.e.current.Load()
	return &ArchiveStats{
		Name: a.name, Window: window, Held: uint64(max(0, a.held.Load())),
		Partitions: a.archived.Load(), Keys: a.keys.Load(), Lag: uint64(max(0, cur-a.next.Load())), Failures: a.failures.Load(),
		Reads: a.reads.Load(), Hits: a.hits.Load(), LagReads: a.lagReads.Load(), FilterBytes: a.filters.Bytes(),
		LogEntries: uint64(max(0, a.logLag.Load())), Drainer: a.holder.Load(),
	}
}

// lookupArchive completes a Lookup from the archive for the keys of b.cand
// still New, or a Forget by removing every key of b.cand from it. pre is
// nil, or, for a Forget behind a shared tier's archive log, what
// readBeforeForget found before the shared tier appended the removals.
func (e *Engine) lookupArchive(ctx context.Context, b *batch, ns *Namespace, keys [][]byte, out []KeyInfo, forget bool, pre []tier.Answer, now int64) error {
	var ks [][]byte
	var fps []shard.Fingerprint
	var idx []int
	for _, i := range b.cand {
		if forget || out[i].Outcome == New || out[i].Outcome == InFlight && e.arch.log != nil {
			ks, fps, idx = append(ks, keys[i]), append(fps, b.fps[i]), append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	var ans []tier.Answer
	var err error
	switch {
	case forget && pre != nil:
		// Read before the shared tier appended the removals; the log may
		// still hold a commit of a key, which its drain would bring back
		// until it reaches the removal appended after it.
		ans, err = pre, e.arch.waitApplied(ctx)
	case forget:
		ans = make([]tier.Answer, len(ks))
		err = e.arch.forget(ctx, ns.name, ks, now, ans)
	default:
		ans, err = e.arch.find(ctx, ns, ks, fps, now)
	}
	if err != nil {
		return err
	}
	for q, i := range idx {
		a := &ans[q]
		if a.Status != tier.Committed || out[i].Outcome == Duplicate || (!forget && ns.archiveExpired(a.Partition, a.At, now)) {
			continue
		}
		if forget && out[i].Outcome == InFlight {
			continue // a live claim: nothing was removed, and the Forget fails ErrInFlight
		}
		// Dated whenever the commit was (every commit is, while an
		// archive keeps the namespace's keys).
		out[i] = KeyInfo{Outcome: Duplicate, Digest: a.Digest, Result: a.Result, Source: SourceArchive, Attempts: out[i].Attempts, CommittedAt: a.At}
		if a.Partition >= 0 {
			out[i].CommittedBefore = (a.Partition + 1) * e.parts.Length
		}
	}
	return nil
}
