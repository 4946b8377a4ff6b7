package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// commitQueue is the engine's one group commit, for an engine with an exact
// tier. Every commit (Commit, CommitBatch, CommitBatchWith, their Async
// forms, Do) is enqueued; one committer goroutine takes everything pending
// as soon as the previous write returns (up to maxGroup claims) and makes it
// durable in one write: one synced Pebble batch, one Redis pipeline, one
// statement. Synchronous callers wait for their result; the done functions
// of asynchronous ones run on one notifier goroutine, in enqueue order.
//
// Order: commits are taken in enqueue order, each group is durable before
// the next is written, and dones run in enqueue order after their group is
// durable, so one goroutine's commits become durable, and call done, in the
// order it enqueued them.
type commitQueue struct {
	e     *Engine
	slots chan struct{} // one per pending commit call: the bound
	wake  chan struct{} // cap 1: something was enqueued
	mu    sync.Mutex
	items []*pending
	shut  bool
	// notify carries each written group to the notifier, in order.
	notify   chan []*pending
	finished chan struct{} // the notifier has run every done
	// The committer's own scratch, reused between groups.
	claims []Claim
	errs   []error
	spans  []span
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
		e:        e,
		slots:    make(chan struct{}, bound),
		wake:     make(chan struct{}, 1),
		notify:   make(chan []*pending, 64),
		finished: make(chan struct{}),
	}
	go q.commit()
	go q.notifier()
	return q
}

// push enqueues p; with bounded it first waits for a slot (respecting ctx).
func (q *commitQueue) push(ctx context.Context, p *pending, bounded bool) error {
	if bounded {
		select {
		case q.slots <- struct{}{}:
			p.slot = true
		default:
			select {
			case q.slots <- struct{}{}:
				p.slot = true
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	q.mu.Lock()
	if q.shut {
		q.mu.Unlock()
		if p.slot {
			p.slot = false
			<-q.slots
		}
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

// commit is the committer: it writes what is pending, group by group,
// until the queue is shut and empty.
func (q *commitQueue) commit() {
	defer close(q.notify)
	for {
		q.mu.Lock()
		for len(q.items) == 0 {
			if q.shut {
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
		for _, p := range group {
			if p.slot {
				<-q.slots
			}
			if p.wait != nil {
				p.wait <- p.err
			}
		}
		q.notify <- group
	}
}

// write makes one group durable in one write and sets each call's error.
func (q *commitQueue) write(group []*pending) {
	q.claims, q.errs, q.spans = q.claims[:0], q.errs[:0], q.spans[:0]
	var deadline time.Time
	for _, p := range group {
		if p.err != nil || p.flush != nil {
			continue
		}
		if err := p.ctx.Err(); err != nil {
			p.err = err // given up before it was written: nothing changes
			continue
		}
		if d, ok := p.ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
			deadline = d
		}
		lo := len(q.claims)
		q.claims = append(q.claims, p.claims...)
		q.spans = append(q.spans, span{lo: lo, hi: len(q.claims), writes: p.writes})
	}
	if len(q.spans) == 0 {
		return
	}
	q.errs = append(q.errs, make([]error, len(q.claims))...)
	// A shared tier's call returns by the earliest caller's deadline.
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	_, _, err := q.e.commitSpans(ctx, q.claims, q.errs, q.spans, false)
	q.e.stats.commitGroups.Add(1)
	s := 0
	for _, p := range group {
		if p.err != nil || p.flush != nil {
			continue
		}
		sp := q.spans[s]
		s++
		errs := q.errs[sp.lo:sp.hi]
		if p.errs != nil {
			copy(p.errs, errs)
		}
		p.err = spanError(err, p.claims, errs, len(p.writes) > 0)
	}
	clear(q.claims)
	clear(q.errs)
	clear(q.spans)
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
// enqueue order.
func (q *commitQueue) notifier() {
	defer close(q.finished)
	for group := range q.notify {
		for _, p := range group {
			if p.done != nil {
				p.done(p.err)
			}
			if p.flush != nil {
				close(p.flush)
			}
		}
	}
}

// pending is how many calls wait now.
func (q *commitQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
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
	<-q.finished
}

// CommitAsync commits a New claim like Commit, but returns at once: done
// runs with Commit's error once the commit is durable as configured (or has
// failed). The dones of one goroutine's commits run in the order it called
// CommitAsync, each after its commit is durable, on one goroutine shared by
// the engine: keep done short (ack the message, record an offset), and do
// not call Flush or Close from it. The claim's Key bytes must stay unchanged
// until done runs.
//
// When Options.CommitQueue commits are pending, CommitAsync waits for room,
// or until ctx ends (done then gets ctx's error, in order). A commit whose
// ctx has ended when its turn comes is not written. Without an exact tier
// (memory- or bloom-only) there is nothing to wait for: the commit is made
// and done runs before CommitAsync returns.
func (e *Engine) CommitAsync(ctx context.Context, c Claim, done func(error)) {
	claims := []Claim{c}
	if c.Outcome != New {
		e.commitAsync(ctx, nil, nil, done, fmt.Errorf("%w: outcome %v", ErrNotClaimed, c.Outcome))
		return
	}
	e.commitAsync(ctx, claims, nil, done, nil)
}

// CommitBatchAsync is CommitBatchWith (writes may be nil) that returns at
// once, as CommitAsync does; done gets CommitBatchWith's error. claims is
// copied; the claims' Key bytes and the writes' bytes must stay unchanged
// until done runs.
func (e *Engine) CommitBatchAsync(ctx context.Context, claims []Claim, writes []Write, done func(error)) {
	if len(writes) > 0 {
		if err := e.need(e.writer != nil, "CommitBatchAsync with writes", "a tier that writes with commits"); err != nil {
			e.commitAsync(ctx, nil, nil, done, err)
			return
		}
	}
	e.commitAsync(ctx, append([]Claim(nil), claims...), writes, done, nil)
}

func (e *Engine) commitAsync(ctx context.Context, claims []Claim, writes []Write, done func(error), failed error) {
	if done == nil {
		done = func(error) {}
	}
	if e.queue == nil {
		if failed == nil {
			failed = e.commit(ctx, claims, nil, writes)
		}
		done(failed)
		return
	}
	p := &pending{ctx: ctx, claims: claims, writes: writes, done: done, err: failed}
	if failed == nil {
		if err := e.queue.push(ctx, p, true); err == nil {
			return
		} else {
			p.err = err
		}
	}
	// Failed before it was enqueued: its done still runs in order.
	if err := e.queue.push(ctx, p, false); err != nil {
		done(err) // the queue is shut: no done is pending
	}
}

// Flush returns once every commit enqueued before it is durable (or
// failed) and its done has run: before a partition is revoked, or at
// shutdown. It returns ctx's error if ctx ends first. Close flushes.
func (e *Engine) Flush(ctx context.Context) error {
	if e.queue == nil {
		return ctx.Err()
	}
	p := &pending{ctx: ctx, flush: make(chan struct{})}
	if err := e.queue.push(ctx, p, false); err != nil {
		return err
	}
	select {
	case <-p.flush:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queued commits claims through the queue and waits for the result.
func (e *Engine) queued(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	clear(errs)
	if len(writes) == 0 && !anyNew(claims) {
		return nil
	}
	p := &pending{ctx: ctx, claims: claims, errs: errs, writes: writes, wait: make(chan error, 1)}
	if err := e.queue.push(ctx, p, true); err != nil {
		return err
	}
	return <-p.wait
}

func anyNew(claims []Claim) bool {
	for i := range claims {
		if claims[i].Outcome == New {
			return true
		}
	}
	return false
}
