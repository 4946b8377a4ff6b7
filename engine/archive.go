package engine

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// The archive (Options.Archive) keeps every committed key of a partition
// that left the window for ArchiveWindow after it. Package tier/archive
// owns it: the copying of closed partitions (or the drain of a shared
// tier's log), its filters, and its side of a partition's life. The
// engine reaches it only as a tier.Archiver: it opens it
// (tier.OpenArchiver) and asks it for keys the exact tier left New (Find,
// Forget). What the embedded store drops, the store and the archiver
// decide between them (tier.ArchiveSource: HoldFor, Release).

// ArchiveStats are the archive's figures (Stats.Archive).
type ArchiveStats = tier.ArchiveStats

// archiveNS reports whether a namespace's keys are archived: not the
// engine's own (tokens), whose promise is their window.
func archiveNS(ns string) bool { return !ownNamespace(ns) }

// openArchive opens o.Archive behind the exact tier, loads its filters and
// starts nothing yet (assemble starts it once the engine is whole).
func (e *Engine) openArchive(o Options, opened *closers) error {
	c := tier.ArchiverConfig{
		Partitions: e.parts, Window: o.Window, ArchiveWindow: o.ArchiveWindow,
		ExpectedKeys: o.ExpectedKeys, FalsePositive: o.ArchiveFalsePositive,
		Hasher: e.hasher, Logger: e.logger,
		Skip:    func(ns []byte) bool { return !archiveNS(string(ns)) },
		Current: e.current.Load, Now: e.now,
		TierName: e.name, Process: hex.EncodeToString(e.process[:]), Binding: o.archiveBinding,
	}
	if e.local != nil {
		scanner, ok := e.exact.(tier.RecordScanner)
		if !ok || e.archSrc == nil {
			return fmt.Errorf("%w: Archive needs the embedded store (Tiers Default, embedded.Dir)", ErrOptions)
		}
		c.Local, c.Scanner, c.Hot, c.Forgetter, c.OpenedAt = e.archSrc, scanner, e.exact, e.forgetter, e.openedAt
	} else {
		c.Log, _ = e.exact.(tier.ArchiveLog)
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	a, err := tier.OpenArchiver(ctx, o.Archive, o.archiveEnv(e.parts), c)
	if err != nil {
		return err
	}
	opened.add(a)
	e.arch = a
	return nil
}

// withoutArchive opens the embedded store without an archive. A store
// that archived partitions (and dropped them from itself) is refused
// (ErrLayout) unless Options.DetachArchive lets the archive go: opened
// without it the store would answer New for that history, and its Forgets
// would miss it, so that an archive attached again later would bring
// forgotten keys back. With detach the history is let go, durably, and the
// store counts its detached archives: an archive records the count it was
// attached at (in its owner), so the detached one is refused from then
// on; a new archive starts empty.
func (e *Engine) withoutArchive(detach bool) error {
	src := e.archSrc
	next, ok, err := src.Archived()
	if err != nil {
		return err
	}
	attached, err := src.ArchiveAttached()
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
	if _, err := src.DetachArchive(); err != nil {
		return err
	}
	if ok {
		e.logger.Printf("tierdedup: the archive is detached: keys of partitions before %d that left the window are New from now on", next)
	} else {
		e.logger.Printf("tierdedup: the archive is detached")
	}
	return nil
}

// archiveNow is the time a call started at now asks the archive at: the
// engine's time as it is now, never earlier than now. The hot read
// covered the partitions live when it ran (the filters' and the store's
// own oldest, which a rotation after now may have moved on); the archive
// reads the unarchived partitions below the oldest live one at the time it
// is given. Given the call's start, a partition that left the window in
// between was in neither read, and an acknowledged key in it answered New
// inside the archive window. At the engine's time now, that partition is
// below the oldest live one, so the archive reads it (still in the store,
// or archived before the store dropped it).
func (e *Engine) archiveNow(now int64) int64 { return max(now, e.highWater.Load()) }

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
		held := out[i].Outcome == InFlight && a.Shared()
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
	ans, err := a.Find(ctx, ns.name, keys, fps, e.archiveNow(now))
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
		archived(&out[b.cand[j]], d, j, r, digests[q], c)
	}
	return nil
}

// archived answers candidate j (claim cl, sent with digest) Duplicate, or
// Conflict, from the archive's record r.
func archived(cl *Claim, d decision, j int, r *tier.Answer, digest Digest, c *tally) {
	cl.Outcome = Duplicate
	if conflicts(digest, r.Digest) {
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

// archiveBeforeMark reads the archive for the keys of reqs, before a
// one-step mark of them behind it (Namespace.marksInTier): the keys it
// holds inside the namespace's archive window are answered from it and
// not marked; it returns the requests left to mark (b.reqs and b.qidx
// compacted), each with Archive set and LogBy, the archive read's time
// plus tier.LogSkew/2. A commit that left the tier's window before LogBy
// was sealed into the archive before the read (Find waits for that), so
// a mark the tier accepts by LogBy and finds the key free is New; one
// reaching the tier later writes nothing and fails. On an error nothing
// was written.
func (e *Engine) archiveBeforeMark(ctx context.Context, b *batch, ns *Namespace, out []Claim, d decision, c *tally, now int64, reqs []tier.Request) ([]tier.Request, error) {
	at := e.archiveNow(now)
	keys := make([][]byte, len(reqs))
	fps := make([]shard.Fingerprint, len(reqs))
	for q := range reqs {
		keys[q], fps[q] = reqs[q].Key, d.fps[b.qidx[q]]
	}
	ans, err := e.arch.Find(ctx, ns.name, keys, fps, at)
	if err != nil {
		return nil, err
	}
	logBy := at + int64(tier.LogSkew/2)
	kept := 0
	for q := range reqs {
		j := b.qidx[q]
		if r := &ans[q]; r.Status == tier.Committed && !ns.archiveExpired(r.Partition, r.At, now) {
			archived(&out[b.cand[j]], d, j, r, reqs[q].Digest, c)
			continue
		}
		reqs[kept], b.qidx[kept] = reqs[q], j
		reqs[kept].Archive, reqs[kept].LogBy = true, logBy
		kept++
	}
	clear(reqs[kept:])
	b.reqs, b.qidx = reqs[:kept], b.qidx[:kept]
	return b.reqs, nil
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

// readBeforeForget reads the archive at at (the engine's time) for every
// key of b.cand, for a Forget behind a shared tier's archive log, before
// the shared tier appends the removals (see forget).
func (e *Engine) readBeforeForget(ctx context.Context, b *batch, ns *Namespace, keys [][]byte, at int64) ([]tier.Answer, error) {
	ks := make([][]byte, len(b.cand))
	for j, i := range b.cand {
		ks[j] = keys[i]
	}
	ans := make([]tier.Answer, len(ks))
	return ans, e.arch.Forget(ctx, ns.name, ks, at, ans)
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
		if forget || out[i].Outcome == New || out[i].Outcome == InFlight && e.arch.Shared() {
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
		ans, err = pre, e.arch.WaitApplied(ctx)
	case forget:
		ans = make([]tier.Answer, len(ks))
		err = e.arch.Forget(ctx, ns.name, ks, e.archiveNow(now), ans)
	default:
		ans, err = e.arch.Find(ctx, ns.name, ks, fps, e.archiveNow(now))
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
