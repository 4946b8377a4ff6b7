package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Namespace is one key space of an Engine: the same key bytes in two
// namespaces are two keys. Consumers commonly dedup message IDs in one and
// business keys (order:42) in another. The Engine's own methods use the
// default namespace, named "". A Namespace is safe for concurrent use.
type Namespace struct {
	e    *Engine
	name string
	// window is the namespace's own window (Options.NamespaceWindows),
	// zero for the engine's; cacheFor is how long memory keeps its commits.
	window, cacheFor int64
}

// Namespace returns the namespace called name (at most MaxNamespace bytes,
// not starting with a NUL byte, which marks the engine's own); "" is the
// default namespace.
func (e *Engine) Namespace(name string) (*Namespace, error) {
	if err := checkNamespace(name); err != nil {
		return nil, err
	}
	if name == "" {
		return &e.def, nil
	}
	return e.newNamespace(name), nil
}

// checkNamespace is the rule for a caller's namespace name.
func checkNamespace(name string) error {
	switch {
	case len(name) > MaxNamespace:
		return fmt.Errorf("%w: name of %d bytes, max %d", ErrNamespace, len(name), MaxNamespace)
	case ownNamespace(name):
		return fmt.Errorf("%w: names starting with a NUL byte are the engine's own", ErrNamespace)
	}
	return nil
}

// ownNamespace reports whether name is one of the engine's own
// namespaces (tokens, versions): their names start with a NUL byte.
func ownNamespace(name string) bool { return len(name) > 0 && name[0] == 0 }

// newNamespace is the namespace called name with its window.
func (e *Engine) newNamespace(name string) *Namespace {
	n := &Namespace{e: e, name: name, cacheFor: e.cacheFor}
	if w, ok := e.nsWindows[name]; ok {
		n.window = w
		n.cacheFor = w
		if e.where == tier.ClaimsInStore {
			n.cacheFor = w / 2 // as the engine's: a process clock behind the server's
		}
		n.cacheFor = min(n.cacheFor, e.cacheFor)
	}
	return n
}

// Window returns how long a commit in the namespace stays a Duplicate: its
// own window (Options.NamespaceWindows), or the engine's.
func (n *Namespace) Window() time.Duration {
	if n.window > 0 {
		return time.Duration(n.window)
	}
	return time.Duration(n.e.window)
}

// expired reports whether a commit the exact tier found in partition (at
// at, zero if it stored no time) has outlived the namespace's own window
// by now. A commit without a time is dated at its partition's end, so it
// is never judged older than it is.
func (n *Namespace) expired(partition, at, now int64) bool {
	if n.window == 0 || partition < 0 {
		return false
	}
	if at == 0 {
		at = (partition + 1) * n.e.parts.Length
	}
	return now-at >= n.window
}

// Name returns the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Claim claims key in the default namespace; see Namespace.Claim.
func (e *Engine) Claim(ctx context.Context, key []byte) (Claim, error) {
	return e.def.Claim(ctx, key)
}

// ClaimBatch claims keys in the default namespace; see Namespace.ClaimBatch.
func (e *Engine) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return e.def.ClaimBatch(ctx, keys, digests, out)
}

// MarkIfAbsent marks key in the default namespace; see
// Namespace.MarkIfAbsent.
func (e *Engine) MarkIfAbsent(ctx context.Context, key []byte) (Outcome, error) {
	return e.def.MarkIfAbsent(ctx, key)
}

// MarkBatch marks keys in the default namespace; see Namespace.MarkBatch.
func (e *Engine) MarkBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	return e.def.MarkBatch(ctx, keys, digests, out)
}

// Do runs fn once for key in the default namespace; see Namespace.Do.
func (e *Engine) Do(ctx context.Context, key []byte, fn func(context.Context) error) (Outcome, error) {
	return e.def.Do(ctx, key, fn)
}

// DoResult runs fn once for key in the default namespace and stores its
// result; see Namespace.DoResult.
func (e *Engine) DoResult(ctx context.Context, key []byte, fn func(context.Context) ([]byte, error)) (Outcome, []byte, error) {
	return e.def.DoResult(ctx, key, fn)
}

// Claim asks whether key is new. New grants a claim leased for
// Options.Lease: the caller must Commit it after processing or Release it
// after a failure. Any other outcome grants nothing.
func (n *Namespace) Claim(ctx context.Context, key []byte) (Claim, error) {
	return n.ClaimDigest(ctx, key, Digest{})
}

// ClaimDigest is Claim with the payload's digest: a key committed with a
// different digest answers Conflict, and a New claim stores d on Commit.
func (n *Namespace) ClaimDigest(ctx context.Context, key []byte, d Digest) (Claim, error) {
	keys := [1][]byte{key}
	digests := [1]Digest{d}
	var out [1]Claim
	err := n.e.claim(ctx, n, keys[:], digests[:], out[:], false)
	return out[0], err
}

// ClaimBatch claims every key at once, one Claim per key in out (which must
// have len(keys)); digests is nil or one per key. A key repeated in the
// batch is New at most once, its repeats InFlight. On error no claim is
// held and out is unspecified.
func (n *Namespace) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return n.e.claim(ctx, n, keys, digests, out, false)
}

// MarkIfAbsent claims and commits key in one call: New means it was absent
// and is now marked (durably, as configured), Duplicate or Conflict that it
// was marked before, InFlight that a two-phase claim holds it. While the
// call runs it holds the key as a claim does, so a concurrent call of the
// same key may see it InFlight until the mark is durable; a mark whose
// lease ended before its commit (a stall longer than the Lease) answers
// InFlight and marks nothing.
func (n *Namespace) MarkIfAbsent(ctx context.Context, key []byte) (Outcome, error) {
	keys := [1][]byte{key}
	var out [1]Outcome
	err := n.MarkBatch(ctx, keys[:], nil, out[:])
	return out[0], err
}

// MarkBatch is MarkIfAbsent for a batch, one Outcome per key in out (which
// must have len(keys)), with one durable write for the whole batch. A key
// repeated in the batch is New once and Duplicate after.
func (n *Namespace) MarkBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d keys, %d outcomes", ErrBatch, len(keys), len(out))
	}
	// Close waits for the whole mark: its claim is committed or given
	// back in every tier before Close returns.
	ctx, done, err := n.e.hold(ctx)
	if err != nil {
		return err
	}
	defer done()
	b := n.e.getBatch(len(keys))
	defer n.e.putBatch(b)
	claims, errs := b.claims[:len(keys)], b.errs[:len(keys)]
	// A tier that marks in one step (Marker) commits every New key in
	// the claim itself.
	marked := n.e.marker != nil
	if err := n.e.claim(ctx, n, keys, digests, claims, marked); err != nil {
		return err
	}
	if marked {
		clear(errs)
	} else if err := n.e.commitMarks(ctx, claims, errs); err != nil && !errors.Is(err, ErrLeaseLost) {
		// Nothing is known to be durable (a failed Pebble batch wrote
		// nothing; a Redis commit whose reply was lost is remembered, so
		// the retry of this mark is New): give the claims back.
		gctx, cancel := giveBackContext(ctx)
		if rerr := n.e.releaseAs(gctx, claims, nil, true); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			err = errors.Join(err, fmt.Errorf("giving the claims back: %w", rerr))
		}
		cancel()
		return err
	}
	for i := range claims {
		out[i] = claims[i].Outcome
		if out[i] == New && errs[i] != nil {
			// Its lease ended and another worker took the key over
			// before the commit: someone else holds it now.
			out[i] = InFlight
			continue
		}
		if out[i] == InFlight {
			// A repeat of a key marked earlier in this batch is a duplicate
			// of it, now that it is committed.
			for j := range i {
				if claims[j].Outcome == New && errs[j] == nil && claims[j].fp == claims[i].fp {
					out[i] = Duplicate
					if conflicts(claims[i].digest, claims[j].digest) {
						out[i] = Conflict
					}
					break
				}
			}
		}
	}
	clear(errs)
	return nil
}

// giveBackMargin bounds how long giving claims back (the Release after a
// failed handler, or of a batch that did not commit) may outlive the
// caller's deadline: the give-back must run even when the caller's context
// has ended, but never hang on a server that stopped answering.
const giveBackMargin = 250 * time.Millisecond

// giveBackContext is ctx without its cancellation, bounded by its deadline
// (or now, if that has passed) plus giveBackMargin.
func giveBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	d, ok := ctx.Deadline()
	if !ok {
		return base, func() {}
	}
	if now := time.Now(); d.Before(now) {
		d = now
	}
	return context.WithDeadline(base, d.Add(giveBackMargin))
}

// Do runs fn for key exactly once inside the window: it claims the key,
// runs fn if the claim is New, then commits (fn returned nil) or releases
// (fn failed or panicked, so a redelivery can run it). It returns the claim's
// outcome and fn's error or the engine's. Ack the message when the error is
// nil and the outcome is New or Duplicate; leave InFlight for redelivery;
// dead-letter Conflict and Poison.
func (n *Namespace) Do(ctx context.Context, key []byte, fn func(context.Context) error) (Outcome, error) {
	o, _, err := n.do(ctx, key, fn, nil)
	return o, err
}

// DoResult is Do for a handler with a result to give every duplicate: fn
// runs once inside the window, its result (at most Options.MaxResultSize
// bytes) is committed with the key, and a later call for the key returns
// the stored result with Duplicate (or Conflict) instead of running fn, as
// an API answers a retried request with its original response. On New it
// returns fn's result. A result too long is ErrResultTooLarge, and the
// claim is released, as for a failed fn.
func (n *Namespace) DoResult(ctx context.Context, key []byte, fn func(context.Context) ([]byte, error)) (Outcome, []byte, error) {
	return n.do(ctx, key, nil, fn)
}

// do is Do (fn) or DoResult (rfn).
func (n *Namespace) do(ctx context.Context, key []byte, fn func(context.Context) error, rfn func(context.Context) ([]byte, error)) (o Outcome, result []byte, err error) {
	if rfn != nil {
		if err := n.e.needResults("DoResult"); err != nil {
			return 0, nil, err // before claiming: fn must not run for a result nothing can keep
		}
	}
	c, err := n.Claim(ctx, key)
	if err != nil || c.Outcome != New {
		return c.Outcome, c.Result, err
	}
	committed := false
	defer func() {
		if !committed {
			gctx, cancel := giveBackContext(ctx)
			defer cancel()
			if rerr := n.e.Release(gctx, c); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if rfn != nil {
		c.Result, err = rfn(ctx)
		if err == nil {
			err = n.e.checkResults([]Claim{c})
		}
	} else {
		err = fn(ctx)
	}
	if err != nil {
		return New, nil, err
	}
	committed = true
	return New, c.Result, n.e.Commit(ctx, c)
}
