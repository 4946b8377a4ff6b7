package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// commitQueue is the engine's one group commit, for an engine with an exact
// tier. Every commit (Commit, CommitBatch, CommitBatchWith, their Async
// forms, Do) is enqueued; one writer goroutine takes everything pending as
// soon as the previous write returns (up to maxGroup claims) and makes it
// durable in one write: one synced Pebble batch, one Redis pipeline, one
// statement. Synchronous callers wait for their result; the done functions
// of asynchronous ones run on one notifier goroutine, in enqueue order.
//
// Order: calls are taken in enqueue order, each group is durable before the
// next is written, and dones run in enqueue order after their group is
// durable, so one goroutine's commits become durable, and call done, in the
// order it enqueued them. A call refused before it was written (a claim
// that is not New, a closed engine) still has its done run in that order.
//
// Bound: an asynchronous call holds a slot from its enqueue until its done
// has run, so Options.CommitQueue bounds the memory of everything pending.
// Synchronous calls hold none (each is bounded by its waiting goroutine),
// and the writer never waits for the notifier: a done may call Commit or Do
// without deadlocking the queue.
type commitQueue struct {
	e     *Engine
	slots chan struct{} // one per pending asynchronous call: the bound
	wake  chan struct{} // cap 1: something was enqueued
	mu    sync.Mutex
	items []*pending // to write, in order
	notes []*pending // written, their dones to run, in order
	cond  *sync.Cond // on mu: notes were added, or the writer ended
	shut  bool       // no call is accepted any more
	wrote bool       // the writer has ended: everything accepted is written
	noted bool       // the notifier has ended: every done has run
	ended chan struct{}
}

// holdCommits, when set by tests, holds the writer back until it is
// closed, so that what is enqueued meanwhile is written as one group.
var holdCommits atomic.Pointer[chan struct{}]

// pending is one enqueued commit call.
type pending struct {
	ctx    context.Context
	claims []Claim
	errs   []error // the caller's, nil or one per claim
	writes []Write
	done   func(error) // asynchronous: run by the notifier
	wait   chan error  // synchronous: the result
	flush  chan struct{}
	slot   bool // holds a slot of the bound
	err    error
}

// maxGroup bounds the claims of one group write: a larger group would
// delay its first caller for little gain.
const maxGroup = 4096

func newCommitQueue(e *Engine, bound int) *commitQueue {
	q := &commitQueue{
		e:     e,
		slots: make(chan struct{}, bound),
		wake:  make(chan struct{}, 1),
		ended: make(chan struct{}),
	}
	q.cond = sync.NewCond(&q.mu)
	go q.commit()
	go q.notifier()
	return q
}

// reserve waits for a slot of the bound, or until ctx ends.
func (q *commitQueue) reserve(ctx context.Context, p *pending) error {
	select {
	case q.slots <- struct{}{}:
		p.slot = true
		return nil
	default:
	}
	select {
	case q.slots <- struct{}{}:
		p.slot = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// push enqueues p to be written.
func (q *commitQueue) push(p *pending) error {
	q.mu.Lock()
	if q.shut {
		q.mu.Unlock()
		return ErrClosed
	}
	q.items = append(q.items, p)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// refuse has p's done run with p.err, in order after every done already
// due; it reports false when the notifier has ended (every earlier done has
// run): the caller then runs it.
func (q *commitQueue) refuse(p *pending) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !q.wrote:
		q.items = append(q.items, p) // through the writer, which skips it
		select {
		case q.wake <- struct{}{}:
		default:
		}
	case !q.noted:
		q.notes = append(q.notes, p)
		q.cond.Signal()
	default:
		return false
	}
	return true
}

// commit is the writer: it writes what is pending, group by group, until
// the queue is shut and empty.
func (q *commitQueue) commit() {
	for {
		q.mu.Lock()
		for len(q.items) == 0 {
			if q.shut {
				q.wrote = true // in the same step: refuse sees it
				q.cond.Signal()
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if gate := holdCommits.Load(); gate != nil {
			q.mu.Unlock()
			<-*gate
			q.mu.Lock()
		}
		n, claims := 0, 0
		for n < len(q.items) && (n == 0 || claims+len(q.items[n].claims) <= maxGroup) {
			claims += len(q.items[n].claims)
			n++
		}
		group := make([]*pending, n)
		copy(group, q.items)
		rest := copy(q.items, q.items[n:])
		clear(q.items[rest:])
		q.items = q.items[:rest]
		q.mu.Unlock()

		q.write(group)
		q.mu.Lock()
		for _, p := range group {
			if p.wait != nil {
				p.wait <- p.err
			} else {
				q.notes = append(q.notes, p)
			}
		}
		q.cond.Signal()
		q.mu.Unlock()
	}
}

// write makes one group durable in one write and sets each call's error.
func (q *commitQueue) write(group []*pending) {
	var claims []Claim
	var spans []span
	// A shared tier's call runs until the latest caller's deadline (none if
	// a caller has none): one caller's short deadline must not fail the
	// others; each synchronous caller stops waiting at its own.
	var deadline time.Time
	bounded := true
	for _, p := range group {
		if p.err != nil || p.flush != nil {
			continue
		}
		if err := p.ctx.Err(); err != nil {
			p.err = err // given up before it was written: nothing changes
			continue
		}
		if d, ok := p.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
		lo := len(claims)
		claims = append(claims, p.claims...)
		spans = append(spans, span{lo: lo, hi: len(claims), writes: p.writes})
	}
	if len(spans) == 0 {
		return
	}
	errs := make([]error, len(claims))
	ctx := context.Background()
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	t0 := time.Now()
	_, _, err := q.e.commitSpans(ctx, claims, errs, spans, forClaim)
	q.e.stats.commitLatency.observe(time.Since(t0))
	q.e.stats.commitGroups.Add(1)
	s := 0
	for _, p := range group {
		if p.err != nil || p.flush != nil {
			continue
		}
		sp := spans[s]
		s++
		if p.errs != nil {
			copy(p.errs, errs[sp.lo:sp.hi])
		}
		p.err = spanError(err, p.claims, errs[sp.lo:sp.hi], len(p.writes) > 0)
	}
}

// spanError is one call's error from its share of a group: the write's
// error if the call had something in it, else ErrLeaseLost if any of its
// claims lost its lease.
func spanError(err error, claims []Claim, errs []error, writes bool) error {
	news, lost := 0, 0
	var failed error
	for i, c := range claims {
		if c.Outcome != New {
			continue
		}
		news++
		switch {
		case errs[i] == nil:
		case errors.Is(errs[i], ErrLeaseLost):
			lost++
		default:
			failed = errs[i]
		}
	}
	switch {
	case failed != nil:
		return failed
	case err != nil && (lost < news || writes && news == 0):
		return err
	case lost > 0:
		return fmt.Errorf("%w: %d of %d claims", ErrLeaseLost, lost, news)
	}
	return nil
}

// notifier runs the asynchronous callers' dones, and ends the flushes, in
// enqueue order, giving back each call's slot once its done has run.
func (q *commitQueue) notifier() {
	defer close(q.ended)
	for {
		q.mu.Lock()
		for len(q.notes) == 0 && !q.wrote {
			q.cond.Wait()
		}
		if len(q.notes) == 0 {
			q.noted = true // in the same step: refuse sees it
			q.mu.Unlock()
			return
		}
		notes := q.notes
		q.notes = nil
		q.mu.Unlock()
		for _, p := range notes {
			if p.done != nil {
				q.deliver(p)
			}
			if p.flush != nil {
				close(p.flush)
			}
			if p.slot {
				<-q.slots
			}
		}
	}
}

// deliver runs p's done. A done that panics is recovered, counted
// (Stats.Calls.DonePanics) and logged with its stack, as net/http does for a
// handler: the notifier goes on, so the other callers' dones still run,
// in order, and the queue keeps its slots and flushes.
func (q *commitQueue) deliver(p *pending) {
	defer func() {
		if r := recover(); r != nil {
			q.e.stats.donePanics.Add(1)
			q.e.logger.Printf("tierdedup: a CommitAsync done panicked (recovered; the other dones are delivered): %v\n%s", r, debug.Stack())
		}
	}()
	p.done(p.err)
}

// pending is how many calls wait now, to be written or for their done.
func (q *commitQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) + len(q.notes)
}

// close refuses new commits, writes every pending one and waits until every
// done has run.
func (q *commitQueue) close() {
	q.mu.Lock()
	q.shut = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	<-q.ended
}
