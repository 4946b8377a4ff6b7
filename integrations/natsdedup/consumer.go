package natsdedup

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tierdedup/tierdedup/engine"
)

// Errors a Consumer returns or passes to Options.Reject.
var (
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("natsdedup: invalid options")
	// ErrPoison is the reason a message is terminated when its key
	// answered engine.Poison: its handler failed MaxAttempts times.
	ErrPoison = errors.New("natsdedup: handler keeps failing (poison)")
	// ErrConflict is the reason a message is terminated when its key was
	// committed with another payload digest (Options.Digest).
	ErrConflict = errors.New("natsdedup: key committed with another payload")
)

// Handler handles one New message. It returns the records of its effect,
// committed in the same atomic batch as the message's mark (an embedded
// engine only; nil otherwise), or an error: the claim is released and the
// message redelivered. ctx is canceled if the claim is lost meanwhile (a
// stall longer than its lease): the commit will fail, stop early.
type Handler func(ctx context.Context, msg jetstream.Msg) ([]engine.Write, error)

// Options configure a Consumer. The zero value of each field is its
// default.
type Options struct {
	// Namespace is the engine namespace of the keys; "" is the default
	// namespace. One per stream keeps streams' IDs apart.
	Namespace string
	// Key returns a message's dedup key; nil means its Nats-Msg-Id header.
	// A message without a usable key is terminated (Reject gets an error
	// matching engine.ErrEmptyKey or engine.ErrKeyTooLong).
	Key func(jetstream.Msg) []byte
	// Digest, if set, returns a message's payload digest: a key committed
	// with another digest terminates the message with ErrConflict.
	Digest func(jetstream.Msg) engine.Digest
	// AckWait is the JetStream consumer's AckWait; default 30s (the
	// server's). While a handler runs, every AckWait/2 (or half the
	// claim's lease, if shorter) the message gets InProgress and its claim
	// an Extend by AckWait.
	AckWait time.Duration
	// InFlightDelay is how long a message whose key another worker holds
	// waits before its redelivery (NakWithDelay); default 1s.
	InFlightDelay time.Duration
	// RetryDelay is how long a message whose handler failed, or whose
	// claim or commit failed, waits before its redelivery; 0 means at once
	// (Nak).
	RetryDelay time.Duration
	// Reject is called with each message about to be terminated, and why
	// (ErrPoison, ErrConflict, a key error); dead-letter it there.
	Reject func(msg jetstream.Msg, why error)
	// Logger receives failures to ack, nak or extend; nil means
	// log.Default.
	Logger *log.Logger
}

// Stats are a Consumer's counters since New.
type Stats struct {
	// Messages is every message Handle saw; New those handled and
	// committed; Duplicates those acked as duplicates; InFlight those
	// delayed because another worker held their key; Rejected those
	// terminated; Failed those redelivered after a handler, claim or
	// commit failure.
	Messages, New, Duplicates, InFlight, Rejected, Failed uint64
	// Extends counts lease extensions (with InProgress); LeaseLost the
	// claims found lost while their handler ran.
	Extends, LeaseLost uint64
}

// Consumer handles JetStream messages through an engine. It is safe for
// concurrent use.
type Consumer struct {
	e     *engine.Engine
	ns    *engine.Namespace
	o     Options
	log   *log.Logger
	stats struct {
		messages, news, dups, inflight, rejected, failed, extends, lost atomic.Uint64
	}
}

// maxDelay bounds AckWait, InFlightDelay and RetryDelay.
const maxDelay = 24 * time.Hour

// New returns a Consumer that claims through e.
func New(e *engine.Engine, opts *Options) (*Consumer, error) {
	o := *opts
	var errs []error
	if e == nil {
		errs = append(errs, fmt.Errorf("%w: no engine", ErrOptions))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"AckWait", o.AckWait}, {"InFlightDelay", o.InFlightDelay}, {"RetryDelay", o.RetryDelay}} {
		if d.v < 0 || d.v > maxDelay {
			errs = append(errs, fmt.Errorf("%w: %s %v outside [0, %v]", ErrOptions, d.name, d.v, maxDelay))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ns, err := e.Namespace(o.Namespace)
	if err != nil {
		return nil, err
	}
	if o.AckWait == 0 {
		o.AckWait = 30 * time.Second
	}
	if o.InFlightDelay == 0 {
		o.InFlightDelay = time.Second
	}
	if o.Key == nil {
		o.Key = func(m jetstream.Msg) []byte { return []byte(m.Headers().Get(nats.MsgIdHdr)) }
	}
	c := &Consumer{e: e, ns: ns, o: o, log: o.Logger}
	if c.log == nil {
		c.log = log.Default()
	}
	return c, nil
}

// Handle handles one message (see the package documentation for what each
// outcome does). It returns once the message was acked, nak'ed or
// terminated, or, for a New message, once its commit was enqueued: the ack
// follows when the commit is durable, while the next message is handled.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg, h Handler) {
	c.stats.messages.Add(1)
	key := c.o.Key(msg)
	var digest engine.Digest
	if c.o.Digest != nil {
		digest = c.o.Digest(msg)
	}
	cl, err := c.ns.ClaimDigest(ctx, key, digest)
	switch {
	case errors.Is(err, engine.ErrEmptyKey), errors.Is(err, engine.ErrKeyTooLong):
		c.terminate(msg, err)
		return
	case err != nil:
		c.log.Printf("natsdedup: claim: %v", err)
		c.retry(msg)
		return
	}
	switch cl.Outcome {
	case engine.Duplicate:
		c.stats.dups.Add(1)
		c.check("ack", msg.Ack())
		return
	case engine.InFlight:
		c.stats.inflight.Add(1)
		c.check("nak", msg.NakWithDelay(c.o.InFlightDelay))
		return
	case engine.Poison:
		c.terminate(msg, ErrPoison)
		return
	case engine.Conflict:
		c.terminate(msg, ErrConflict)
		return
	}

	done := func(err error) {
		if err != nil {
			if errors.Is(err, engine.ErrLeaseLost) {
				c.stats.lost.Add(1) // lost between the handler's end and its commit
			}
			c.log.Printf("natsdedup: commit: %v", err)
			c.retry(msg)
			return
		}
		c.stats.news.Add(1)
		c.check("ack", msg.Ack())
	}
	if err := c.run(ctx, msg, &cl, h, done); err != nil {
		c.retry(msg)
	}
}

// run runs h for the claimed message in the engine's claim session
// (engine.Run), sending InProgress and extending the claim every
// AckWait/2 while it runs, and commits its mark with the handler's writes;
// done is told once the commit is durable. A failed or panicking handler's
// claim is given back (a panic then goes on, the message redelivered at
// once); a lost claim cancels the handler's context and fails.
func (c *Consumer) run(ctx context.Context, msg jetstream.Msg, cl *engine.Claim, h Handler, done func(error)) error {
	var writes []engine.Write
	returned := false
	defer func() {
		if !returned {
			c.retry(msg) // the handler panicked: redelivered now, not at AckWait
		}
	}()
	err := c.e.Run(ctx, cl, engine.SessionOptions{
		Heartbeat: engine.HeartbeatOptions{
			Lease:    c.o.AckWait,
			Every:    c.o.AckWait / 2,
			Beat:     func() { c.check("in-progress", msg.InProgress()) },
			Extended: func() { c.stats.extends.Add(1) },
			Failed:   func(err error) { c.log.Printf("natsdedup: extend: %v", err) },
		},
		GiveBackFailed: func(err error) { c.log.Printf("natsdedup: release: %v", err) },
	}, func(hctx context.Context) (err error) {
		writes, err = h(hctx, msg)
		return err
	}, func(ctx context.Context, cl engine.Claim) error {
		// The commit outlives the caller's cancellation (Handle has
		// returned before it is written; the handler's work is done, and a
		// commit canceled with it would run the handler again), bounded by
		// the ack wait, after which the message is redelivered anyway.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.AckWait)
		finish := func(err error) { cancel(); done(err) }
		if len(writes) > 0 {
			c.e.CommitBatchAsync(cctx, []engine.Claim{cl}, writes, finish)
		} else {
			c.e.CommitAsync(cctx, cl, finish)
		}
		return nil
	})
	returned = true
	if errors.Is(err, engine.ErrLeaseLost) {
		c.stats.lost.Add(1)
	}
	return err
}

func (c *Consumer) retry(msg jetstream.Msg) {
	c.stats.failed.Add(1)
	if c.o.RetryDelay > 0 {
		c.check("nak", msg.NakWithDelay(c.o.RetryDelay))
	} else {
		c.check("nak", msg.Nak())
	}
}

func (c *Consumer) terminate(msg jetstream.Msg, why error) {
	c.stats.rejected.Add(1)
	if c.o.Reject != nil {
		c.o.Reject(msg, why)
	}
	c.check("term", msg.Term()) // the reason goes to Reject (TermWithReason needs nats-server 2.10.4)
}

func (c *Consumer) check(what string, err error) {
	if err != nil {
		c.log.Printf("natsdedup: %s: %v", what, err)
	}
}

// Stats returns the Consumer's counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Messages: s.messages.Load(), New: s.news.Load(), Duplicates: s.dups.Load(), InFlight: s.inflight.Load(),
		Rejected: s.rejected.Load(), Failed: s.failed.Load(), Extends: s.extends.Load(), LeaseLost: s.lost.Load(),
	}
}
