package kafkadedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
)

// Process handles one poll's fetches, partition by partition: it claims
// the partition's records in its engine (one ClaimBatch), hands the New
// ones to h in offset order, and commits their marks, h's records and the
// partition's next offset with one CommitBatchWith, durable before
// Process returns. A handler error stops the partition at that record:
// the records before it commit, its claim is released (an attempt counted)
// and the later ones given back uncounted, and the client is set to fetch
// the partition again from that record. Records of a partition the Member
// does not hold, or before its stored offset, are skipped unhandled.
// Process returns the fetch errors, handler errors and storage errors,
// joined; a partition whose commit failed resumes at its stored offset.
func (m *Member) Process(ctx context.Context, cl *kgo.Client, fetches kgo.Fetches, h Handler) error {
	var errs []error
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
			continue // the poll's own context ended: nothing fetched
		}
		errs = append(errs, fmt.Errorf("kafkadedup: fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err))
	}
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		t := tp{fp.Topic, fp.Partition}
		m.mu.Lock()
		p := m.parts[t]
		m.mu.Unlock()
		if p == nil {
			return
		}
		if err := m.batch(ctx, cl, t, p, fp.Records, h); err != nil {
			errs = append(errs, fmt.Errorf("kafkadedup: %s/%d: %w", t.topic, t.part, err))
		}
	})
	return errors.Join(errs...)
}

// Run polls cl and processes every poll until ctx ends or the client is
// closed, allowing rebalances between polls. A poll under way when ctx
// ends is finished first (its handlers get a context that is not
// canceled), so its commits are not abandoned half-way. It returns ctx's
// error, or nil once the client is closed; errors of single polls go to
// the logger.
func (m *Member) Run(ctx context.Context, cl *kgo.Client, h Handler) error {
	for {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			cl.AllowRebalance()
			return err
		}
		if err := m.Process(context.WithoutCancel(ctx), cl, fetches, h); err != nil {
			m.log.Printf("%v", err)
		}
		cl.AllowRebalance()
	}
}

// batch handles one partition's records.
func (m *Member) batch(ctx context.Context, cl *kgo.Client, t tp, p *partition, recs []*kgo.Record, h Handler) error {
	m.reportStall(t, p)
	first := recs[0].Offset
	recs, resume, beyond := p.unhandled(recs)
	if beyond {
		// Fetched from past the offset the partition stopped at: the
		// rewind (SetOffsets) did not take (kgo skips a partition it is
		// not consuming at that moment, as during an assignment). Set it
		// again, from the polling goroutine, or the partition would
		// ignore every record to its end and stall there.
		at := p.stopped.Load()
		p.stopAt(cl, t, at, p.why)
		if m.stats.rewinds.Add(1)%100 == 1 {
			m.log.Printf("kafkadedup: %s/%d: fetched from offset %d, past the stop at %d: fetching from the stop again", t.topic, t.part, first, at)
		}
		return nil
	}
	if len(recs) == 0 {
		return nil
	}
	m.stats.records.Add(uint64(len(recs)))
	claims, bad, err := m.claim(ctx, p, recs)
	if err != nil {
		p.stopAt(cl, t, resume, "claiming: "+err.Error())
		return err
	}
	writes, stop, herr := m.handle(ctx, recs, claims, bad, h)
	next := recs[len(recs)-1].Offset + 1
	if stop < len(recs) {
		next = recs[stop].Offset
		if err := m.giveBack(ctx, p, claims[stop:]); err != nil {
			// The records before the stop were handled: they commit (or
			// the commit's failure stops the partition) whatever became of
			// the give-back, and the partition resumes at the stop.
			herr = errors.Join(herr, err)
		}
	}
	if err := m.commit(ctx, p, claims[:stop], writes, next); err != nil {
		// Nothing of the batch is durable: handle it again from the
		// stored offset.
		_ = p.e.UnclaimBatch(ctx, claims[:stop], nil)
		p.stopAt(cl, t, resume, "committing: "+err.Error())
		return errors.Join(herr, err)
	}
	if next > p.next.Load() {
		p.progress = time.Now() // the stored offset moved on
	}
	p.next.Store(next)
	if stop < len(recs) {
		p.stopAt(cl, t, next, fmt.Sprint(herr))
	}
	if m.o.CommitToGroup {
		cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{t.topic: {t.part: {Epoch: -1, Offset: next}}})
	}
	return herr
}

// unhandled returns the records of recs that the partition has yet to
// handle, from its stored offset on, and the offset it resumes at if they
// do not commit. It returns none when every record precedes the stored
// offset, or when they start beyond the offset the partition stopped at
// (beyond); a batch that starts at that offset clears the stop.
func (p *partition) unhandled(recs []*kgo.Record) (_ []*kgo.Record, resume int64, beyond bool) {
	// Records before the stored offset were handled and committed already.
	stored := p.next.Load()
	first := 0
	for first < len(recs) && recs[first].Offset < stored {
		first++
	}
	recs = recs[first:]
	if len(recs) == 0 {
		return nil, 0, false
	}
	if at := p.stopped.Load(); at >= 0 {
		if recs[0].Offset > at {
			return nil, 0, true // from beyond the stop: the client must fetch again from it
		}
		p.stopped.Store(-1)
	}
	// Where the partition resumes if this batch does not commit.
	resume = stored
	if resume < 0 {
		resume = recs[0].Offset
	}
	return recs, resume, false
}

// claim claims the keys of recs in the partition's engine with one
// ClaimBatch and returns each record's claim. A record whose key the
// engine would refuse is not claimed: bad holds why, by record.
func (m *Member) claim(ctx context.Context, p *partition, recs []*kgo.Record) (claims []engine.Claim, bad []error, err error) {
	keys := make([][]byte, len(recs))
	var digests []engine.Digest
	if m.o.Digest != nil {
		digests = make([]engine.Digest, len(recs))
	}
	// A key the engine refuses would fail the whole batch: reject the
	// record instead (the engine's own limits decide).
	bad = make([]error, len(recs))
	valid := keys[:0:0]
	var validAt []int
	for i, r := range recs {
		keys[i] = m.o.Key(r)
		if err := checkKey(keys[i], m.o.Engine.MaxKeySize); err != nil {
			bad[i] = err
			continue
		}
		valid = append(valid, keys[i])
		validAt = append(validAt, i)
		if digests != nil {
			digests[len(valid)-1] = m.o.Digest(r)
		}
	}
	vclaims := make([]engine.Claim, len(valid))
	var vdigests []engine.Digest
	if digests != nil {
		vdigests = digests[:len(valid)]
	}
	if err := p.e.ClaimBatch(ctx, valid, vdigests, vclaims); err != nil {
		return nil, nil, err
	}
	claims = make([]engine.Claim, len(recs))
	for j, i := range validAt {
		claims[i] = vclaims[j]
	}
	return claims, bad, nil
}

// handle goes through recs in offset order as their claims say: it hands
// the New ones to h, collecting their writes, counts the duplicates and
// rejects the records it must. It returns the writes and where it
// stopped: len(recs), or the record whose handler failed or whose key is
// in flight elsewhere, with why (herr).
func (m *Member) handle(ctx context.Context, recs []*kgo.Record, claims []engine.Claim, bad []error, h Handler) (writes []engine.Write, stop int, herr error) {
	claimed := map[string]bool{} // keys claimed New earlier in this batch
	stop = len(recs)
records:
	for i, r := range recs {
		c := &claims[i]
		switch {
		case bad[i] != nil:
			m.reject(ctx, r, bad[i])
		case c.Outcome == engine.New:
			w, err := h(ctx, r)
			if err != nil {
				stop, herr = i, err
				break records
			}
			writes = append(writes, w...)
			claimed[string(c.Key)] = true
		case c.Outcome == engine.Duplicate:
			m.stats.dups.Add(1)
		case c.Outcome == engine.InFlight && claimed[string(c.Key)]:
			// A copy of a record handled earlier in this batch: it
			// commits with it.
			m.stats.dups.Add(1)
		case c.Outcome == engine.InFlight:
			// Held by a claim this batch did not make: resume here later.
			stop, herr = i, fmt.Errorf("record at offset %d: key in flight elsewhere", r.Offset)
			break records
		case c.Outcome == engine.Poison:
			m.reject(ctx, r, ErrPoison)
		case c.Outcome == engine.Conflict:
			m.reject(ctx, r, ErrConflict)
		}
	}
	return writes, stop, herr
}

// giveBack gives back the claims of a batch from the record it stopped at
// on, counting the stop as a failure: the stopped record's claim is
// released if it was New (the handler failed: an attempt), the later ones
// are given back uncounted.
func (m *Member) giveBack(ctx context.Context, p *partition, claims []engine.Claim) error {
	m.stats.failed.Add(1)
	if c := claims[0]; c.Outcome == engine.New {
		_ = p.e.Release(ctx, c) // the handler failed: an attempt
	}
	return p.e.UnclaimBatch(ctx, claims[1:], nil)
}

// commit commits claims, the handlers' writes and the partition's next
// offset with one CommitBatchWith, and counts the New claims committed.
func (m *Member) commit(ctx context.Context, p *partition, claims []engine.Claim, writes []engine.Write, next int64) error {
	var offset [8]byte
	binary.BigEndian.PutUint64(offset[:], uint64(next))
	writes = append(writes, engine.Write{Key: p.key, Value: offset[:]})
	if err := p.e.CommitBatchWith(ctx, claims, nil, writes); err != nil {
		return err
	}
	for i := range claims {
		if claims[i].Outcome == engine.New {
			m.stats.news.Add(1)
		}
	}
	return nil
}

// reportStall logs and counts partition t when it has received records
// but committed none for Options.StallReport, once each StallReport.
func (m *Member) reportStall(t tp, p *partition) {
	now := time.Now()
	if now.Sub(p.progress) < m.o.StallReport || now.Sub(p.reported) < m.o.StallReport {
		return
	}
	p.reported = now
	m.stats.stalls.Add(1)
	why := "no stop: its records are handled, and their commits do not land"
	if at := p.stopped.Load(); at >= 0 {
		why = fmt.Sprintf("stopped at offset %d: %s", at, p.why)
	}
	m.log.Printf("kafkadedup: %s/%d: no commit for %v while records arrive (stored offset %d); %s", t.topic, t.part, now.Sub(p.progress).Round(time.Second), p.next.Load(), why)
}

// stopAt stops partition t at offset at, for why: its records are ignored
// until a batch starts there again, and the client is set to fetch from
// it.
func (p *partition) stopAt(cl *kgo.Client, t tp, at int64, why string) {
	p.stopped.Store(at)
	p.why = why
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{t.topic: {t.part: {Epoch: -1, Offset: at}}})
}

func (m *Member) reject(ctx context.Context, r *kgo.Record, why error) {
	m.stats.rejected.Add(1)
	if m.o.Reject != nil {
		m.o.Reject(ctx, r, why)
	}
}

// checkKey applies the engine's key limits (max 0 means the engine's
// default).
func checkKey(key []byte, max int) error {
	if max == 0 {
		max = engine.DefaultMaxKeySize
	}
	switch {
	case len(key) == 0:
		return engine.ErrEmptyKey
	case len(key) > max:
		return fmt.Errorf("%w: %d bytes, max %d", engine.ErrKeyTooLong, len(key), max)
	}
	return nil
}
