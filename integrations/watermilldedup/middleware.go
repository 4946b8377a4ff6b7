package watermilldedup

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
)

// Errors the Middleware returns (the router then nacks the message), passes
// to Options.Reject, or New refuses with; match them with errors.Is.
var (
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("watermilldedup: invalid options")
	// ErrEngine reports an engine whose configuration would break the
	// package's promise (see the package documentation): FailOpen,
	// memory-only or bloom-only.
	ErrEngine = errors.New("watermilldedup: engine refused")
	// ErrKey is the reason a message without a usable key is rejected:
	// Options.Key failed, or the key is empty or longer than the engine's
	// MaxKeySize (the error then matches engine.ErrEmptyKey or
	// engine.ErrKeyTooLong too). The handler does not run.
	ErrKey = errors.New("watermilldedup: no usable key")
	// ErrInFlight is returned, after Options.InFlightDelay, for a message
	// whose key another worker holds now: the router nacks it, and its
	// redelivery finds the key committed (Duplicate) or free again.
	ErrInFlight = errors.New("watermilldedup: key held by another worker")
	// ErrPoison is the reason a message is rejected when its key answered
	// engine.Poison: its handler failed the engine's MaxAttempts times.
	ErrPoison = errors.New("watermilldedup: handler keeps failing (poison)")
	// ErrConflict is the reason a message is rejected when its key was
	// committed with another payload digest (Options.Digest).
	ErrConflict = errors.New("watermilldedup: key committed with another payload")
	// ErrLeaseLost is returned when the claim was lost while the handler
	// ran (a stall longer than the engine's Lease): nothing is committed
	// and the router nacks the message. It matches engine.ErrLeaseLost.
	ErrLeaseLost = fmt.Errorf("watermilldedup: claim lost while the handler ran: %w", engine.ErrLeaseLost)
	// ErrOutputsTooLarge is returned when the messages a handler produced
	// do not fit the engine's MaxResultSize once encoded: they could not be
	// replayed, so nothing is committed, the claim is released (an attempt
	// counted) and the router nacks the message. It matches
	// engine.ErrResultTooLarge.
	ErrOutputsTooLarge = fmt.Errorf("watermilldedup: produced messages too large to store: %w", engine.ErrResultTooLarge)
	// ErrStoredOutputs is the reason a Duplicate is rejected when the
	// result stored with its key is not produced messages this package
	// encoded (another writer in the namespace, or a newer format).
	ErrStoredOutputs = errors.New("watermilldedup: stored result is not produced messages")
	// ErrNoClaim is returned by AddWrites called with a context that is
	// not a New message's handler context, or after that handler returned.
	ErrNoClaim = errors.New("watermilldedup: no claimed message in this context")
	// ErrWrites is returned by AddWrites when the engine cannot write
	// records with a commit (a shared Backend: Redis, PostgreSQL).
	ErrWrites = errors.New("watermilldedup: engine cannot write records with a commit (embedded store only)")
)

// Metadata keys set on the copy of a rejected message published to
// Options.DeadLetterTopic. The last four are the values of watermill's
// poison-queue keys (middleware.ReasonForPoisonedKey and the others), so
// tools that read a PoisonQueue's topic read this one too; they are
// spelled out because importing watermill's middleware package links its
// circuit breaker and backoff dependencies into every consumer.
const (
	// RejectedKey names why the message was rejected: "poison",
	// "conflict", "key" or "stored-outputs".
	RejectedKey = "tierdedup_rejected"
	// ReasonKey holds the rejection's error text.
	ReasonKey = "reason_poisoned"
	// TopicKey, HandlerKey and SubscriberKey hold the topic, router
	// handler and subscriber the message came from.
	TopicKey      = "topic_poisoned"
	HandlerKey    = "handler_poisoned"
	SubscriberKey = "subscriber_poisoned"
)

// Options configure a Middleware. The zero value of each field is its
// default.
type Options struct {
	// Namespace is the engine namespace of the keys; "" is the default
	// namespace. Give each consumer group of a topic one of its own, and
	// write nothing else there: a Duplicate's stored result is read as
	// produced messages.
	Namespace string
	// Key returns a message's dedup key; nil means its UUID (which
	// watermill-amqp's marshaler, among others, carries in a header, so a
	// redelivery or a producer's re-send of the same message keeps it). Return a business key
	// from Metadata when producers do not reuse UUIDs on retry. The bytes
	// must stay unchanged until the message is handled. An error, an empty
	// key or one longer than the engine's MaxKeySize rejects the message
	// (ErrKey), without running the handler.
	Key func(*message.Message) ([]byte, error)
	// Digest, if set, returns a message's payload digest
	// (engine.DigestOf(msg.Payload), say): a key committed with another
	// digest rejects the message with ErrConflict.
	Digest func(*message.Message) engine.Digest
	// InFlightDelay is how long a message whose key another worker holds
	// waits before the Middleware returns ErrInFlight and the router nacks
	// it; default 1s. The wait holds the subscriber's slot (most
	// subscribers hand out the next message after the ack or nack), which
	// is the delay: a nack is redelivered at once by AMQP and GoChannel.
	InFlightDelay time.Duration
	// CommitTimeout bounds the release of a failed handler's claim and the
	// commit of a handled message's mark, which run even when the message's
	// context has ended (a router closing), so handled work is not thrown
	// away; default 10s.
	CommitTimeout time.Duration
	// Reject is called with each message about to be rejected, and why
	// (an error matching ErrPoison, ErrConflict, ErrKey or
	// ErrStoredOutputs). It is called again if the message comes back
	// (a dead-letter publish failed).
	Reject func(msg *message.Message, why error)
	// DeadLetter, with DeadLetterTopic (both or neither), receives a copy
	// of each rejected message (its UUID, payload and metadata, with
	// RejectedKey, ReasonKey, TopicKey, HandlerKey and SubscriberKey
	// added); the message is acked once that publish returned, and nacked
	// if it failed. Without them a rejected message is acked after Reject
	// (dropped).
	DeadLetter message.Publisher
	// DeadLetterTopic is the topic DeadLetter publishes rejected messages
	// to.
	DeadLetterTopic string
	// Logger receives failures to extend, release or dead-letter; nil
	// means watermill.NewStdLogger(false, false).
	Logger watermill.LoggerAdapter
}

// Stats are a Middleware's counters since New.
type Stats struct {
	// Messages is every message the Middleware saw; New those handled and
	// committed; Duplicates those acked unhandled as duplicates, Replayed
	// the stored produced messages they returned again; InFlight those
	// nacked because another worker held their key; Rejected those
	// rejected (Poison, Conflict, no key, bad stored outputs), DeadLettered
	// those of them published to the dead-letter topic; Failed those nacked
	// after a handler, claim, commit or dead-letter failure, a lost claim
	// or a panic.
	Messages, New, Duplicates, Replayed, InFlight, Rejected, DeadLettered, Failed uint64
	// Extends counts lease extensions; LeaseLost the claims found lost
	// while their handler ran.
	Extends, LeaseLost uint64
}

// Middleware is a message.HandlerMiddleware over a tierdedup engine (its
// Middleware method). It is safe for concurrent use: the router runs
// every message's handler on a goroutine of its own.
type Middleware struct {
	e         *engine.Engine
	ns        *engine.Namespace
	o         Options
	lease     time.Duration
	maxResult int
	writable  bool
	stats     struct {
		messages, news, dups, replayed, inflight, rejected, deadLettered, failed, extends, lost atomic.Uint64
	}
}

// maxDelay bounds InFlightDelay and CommitTimeout.
const maxDelay = 24 * time.Hour

// New returns a Middleware that claims through e. It refuses (ErrEngine)
// an engine opened with FailOpen, memory-only or bloom-only, and invalid
// options (ErrOptions); opts may be nil.
func New(e *engine.Engine, opts *Options) (*Middleware, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if e == nil {
		return nil, fmt.Errorf("%w: no engine", ErrOptions)
	}
	var errs []error
	bad := func(sentinel error, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...))
	}
	eo := e.Options()
	checkEngine(eo, func(format string, args ...any) { bad(ErrEngine, format, args...) })
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"InFlightDelay", o.InFlightDelay}, {"CommitTimeout", o.CommitTimeout}} {
		if d.v < 0 || d.v > maxDelay {
			bad(ErrOptions, "%s %v outside [0, %v]", d.name, d.v, maxDelay)
		}
	}
	if (o.DeadLetter == nil) != (o.DeadLetterTopic == "") {
		bad(ErrOptions, "DeadLetter and DeadLetterTopic go together (publisher set: %t, topic %q)", o.DeadLetter != nil, o.DeadLetterTopic)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ns, err := e.Namespace(o.Namespace)
	if err != nil {
		return nil, err
	}
	if o.InFlightDelay == 0 {
		o.InFlightDelay = time.Second
	}
	if o.CommitTimeout == 0 {
		o.CommitTimeout = 10 * time.Second
	}
	if o.Key == nil {
		o.Key = func(m *message.Message) ([]byte, error) { return []byte(m.UUID), nil }
	}
	if o.Logger == nil {
		o.Logger = watermill.NewStdLogger(false, false)
	}
	return &Middleware{
		e: e, ns: ns, o: o, lease: eo.Lease, maxResult: eo.MaxResultSize,
		writable: isLocal(eo.Backend) && eo.Tiers == engine.Default,
	}, nil
}

// checkEngine reports, through bad, an engine configuration under which a
// message could be lost, or handled twice after a restart.
func checkEngine(eo engine.Options, bad func(format string, args ...any)) {
	name := eo.Name()
	switch eo.Tiers {
	case engine.MemoryOnly:
		bad("engine %s: its marks die with the process, so every redelivery after a restart runs again (Watermill's own Deduplicator does that much)", name)
	case engine.BloomOnly:
		bad("engine %s: a filter's false positive would ack a new message unhandled, and it stores no produced messages to replay", name)
	}
	if eo.FailOpen {
		bad("engine %s with FailOpen: a store outage would run every redelivered message again", name)
	}
}

// Middleware is the message.HandlerMiddleware: pass it to
// Router.AddMiddleware or Handler.AddMiddleware. See the package
// documentation for what each outcome returns.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(msg, h)
	}
}

func (m *Middleware) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	m.stats.messages.Add(1)
	ctx := msg.Context()
	key, err := m.o.Key(msg)
	if err != nil {
		return m.reject(msg, "key", fmt.Errorf("%w: %w", ErrKey, err))
	}
	var digest engine.Digest
	if m.o.Digest != nil {
		digest = m.o.Digest(msg)
	}
	cl, err := m.ns.ClaimDigest(ctx, key, digest)
	switch {
	case errors.Is(err, engine.ErrEmptyKey), errors.Is(err, engine.ErrKeyTooLong):
		return m.reject(msg, "key", fmt.Errorf("%w: %w", ErrKey, err))
	case err != nil:
		m.stats.failed.Add(1)
		return nil, fmt.Errorf("watermilldedup: claim: %w", err)
	}
	switch cl.Outcome {
	case engine.New:
		return m.execute(msg, h, cl)
	case engine.Duplicate:
		outs, err := decodeOutputs(cl.Result)
		if err != nil {
			return m.reject(msg, "stored-outputs", err)
		}
		m.stats.dups.Add(1)
		m.stats.replayed.Add(uint64(len(outs)))
		return outs, nil
	case engine.InFlight:
		m.stats.inflight.Add(1)
		t := time.NewTimer(m.o.InFlightDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return nil, ErrInFlight
	case engine.Poison:
		return m.reject(msg, "poison", ErrPoison)
	case engine.Conflict:
		return m.reject(msg, "conflict", ErrConflict)
	}
	m.stats.failed.Add(1)
	return nil, fmt.Errorf("watermilldedup: unexpected outcome %v", cl.Outcome)
}

// execute runs h for a New claim in the engine's claim session
// (engine.Run: the lease kept while h runs, a lost claim cancelling h's
// context), then commits its mark, the handler's records and its produced
// messages, and returns once that commit is durable; a failed or
// panicking handler's claim is given back (a panic then goes on to the
// router, or a Recoverer in front of this middleware).
func (m *Middleware) execute(msg *message.Message, h message.HandlerFunc, cl engine.Claim) (outs []*message.Message, err error) {
	orig := msg.Context()
	col := &collector{writable: m.writable}
	var writes []engine.Write
	stage := "a panic" // what the handler did, for the give-back's log
	panicking := true
	defer func() {
		if panicking {
			m.stats.failed.Add(1)
		}
	}()
	err = m.e.Run(context.WithValue(orig, collectorKey{}, col), &cl, engine.SessionOptions{
		Heartbeat: engine.HeartbeatOptions{
			Lease:    m.lease,
			Extended: func() { m.stats.extends.Add(1) },
			Failed:   func(err error) { m.o.Logger.Error("watermilldedup: extend", err, nil) },
		},
		// The give-back runs even if the message's context ended.
		GiveBackTimeout: m.o.CommitTimeout,
		GiveBackFailed: func(err error) {
			m.o.Logger.Error("watermilldedup: release after "+stage, err, watermill.LogFields{"message_uuid": msg.UUID})
		},
	}, func(hctx context.Context) error {
		msg.SetContext(hctx)
		defer func() {
			msg.SetContext(orig)
			writes = col.close()
		}()
		var err error
		if outs, err = h(msg); err != nil {
			stage = "a handler error"
			return err
		}
		result := encodeOutputs(outs)
		if len(result) > m.maxResult {
			stage = "outputs too large"
			err := fmt.Errorf("%w: %d messages, %d bytes encoded, engine MaxResultSize %d", ErrOutputsTooLarge, len(outs), len(result), m.maxResult)
			outs = nil
			return err
		}
		cl.Result = result
		return nil
	}, func(_ context.Context, c engine.Claim) error {
		// The commit runs even if the message's context ended.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(orig), m.o.CommitTimeout)
		defer cancel()
		done := make(chan error, 1)
		m.e.CommitBatchAsync(ctx, []engine.Claim{c}, writes, func(err error) { done <- err })
		if err := <-done; err != nil {
			// Not acked: the redelivery finds the mark if it landed after
			// all (Duplicate), or the claim until its lease ends (InFlight).
			outs = nil
			return fmt.Errorf("watermilldedup: commit: %w", err)
		}
		return nil
	})
	panicking = false
	switch {
	case err == nil:
		m.stats.news.Add(1)
		return outs, nil
	case errors.Is(err, engine.ErrLeaseLost):
		m.stats.lost.Add(1)
		err, outs = ErrLeaseLost, nil
	}
	m.stats.failed.Add(1)
	return outs, err
}

// reject calls Options.Reject and dead-letters msg if so configured: nil
// (ack) once that is done, an error (nack) if the dead-letter publish
// failed.
func (m *Middleware) reject(msg *message.Message, kind string, why error) ([]*message.Message, error) {
	m.stats.rejected.Add(1)
	if m.o.Reject != nil {
		m.o.Reject(msg, why)
	}
	if m.o.DeadLetter == nil {
		return nil, nil
	}
	ctx := msg.Context()
	dl := msg.Copy()
	dl.SetContext(context.WithoutCancel(ctx))
	dl.Metadata.Set(RejectedKey, kind)
	dl.Metadata.Set(ReasonKey, why.Error())
	dl.Metadata.Set(TopicKey, message.SubscribeTopicFromCtx(ctx))
	dl.Metadata.Set(HandlerKey, message.HandlerNameFromCtx(ctx))
	dl.Metadata.Set(SubscriberKey, message.SubscriberNameFromCtx(ctx))
	if err := m.o.DeadLetter.Publish(m.o.DeadLetterTopic, dl); err != nil {
		m.stats.failed.Add(1)
		m.o.Logger.Error("watermilldedup: dead-letter", err, watermill.LogFields{"message_uuid": msg.UUID, "topic": m.o.DeadLetterTopic})
		return nil, fmt.Errorf("watermilldedup: dead-letter to %q: %w (rejected: %w)", m.o.DeadLetterTopic, err, why)
	}
	m.stats.deadLettered.Add(1)
	return nil, nil
}

// Stats returns the Middleware's counters.
func (m *Middleware) Stats() Stats {
	s := &m.stats
	return Stats{
		Messages: s.messages.Load(), New: s.news.Load(), Duplicates: s.dups.Load(), Replayed: s.replayed.Load(),
		InFlight: s.inflight.Load(), Rejected: s.rejected.Load(), DeadLettered: s.deadLettered.Load(),
		Failed: s.failed.Load(), Extends: s.extends.Load(), LeaseLost: s.lost.Load(),
	}
}

// isLocal reports whether b is a store in this process (the embedded
// one), whose commits take the handler's records in the same write.
func isLocal(b tier.Backend) bool {
	_, ok := b.(tier.LocalBackend)
	return ok
}
