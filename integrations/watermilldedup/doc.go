// Package watermilldedup handles Watermill messages once each: a
// message.HandlerMiddleware (Middleware.Middleware) that claims a message's
// key (its UUID, or the caller's key function) in a tierdedup engine
// before the handler runs, keeps the claim alive while it runs, commits the
// mark with the handler's records and produced messages once it succeeded,
// and returns to the router, which acks, only once that commit is durable.
//
// Watermill's own middleware.Deduplicator keeps its keys in a map in the
// process's memory (its documentation asks for a shared backend) and marks
// a message before its handler runs: a handler error loses the message
// (the redelivery is taken for a duplicate), a restart forgets every key
// (redeliveries and producer re-sends run again), and a second process
// sees none of them. This package keeps them in the engine (on disk, or in
// Redis or PostgreSQL for many processes) for the engine's window, and
// marks a message only with its handler's success.
//
// It owns the mapping from Watermill's handler results to the engine's
// outcomes (the router acks a nil error, nacks an error):
//
//   - New: the handler runs with a context (msg.Context()) that AddWrites
//     can put engine.Write records into, and that is canceled if the claim
//     is lost; every half lease the claim is extended. On success the
//     mark, the records and the produced messages (as the claim's Result)
//     are committed in one write (CommitBatchAsync) and the produced
//     messages returned once it is durable: the router publishes them, then
//     acks. On a handler error the claim is released and the handler's
//     error returned (nack): the redelivery runs it again.
//   - Duplicate: the produced messages stored with the mark are returned
//     again, with their UUIDs, metadata and payloads, and a nil error: the
//     router publishes them again (a process that died after the commit
//     and before its publish lost nothing; a consumer downstream dedups
//     them by UUID) and acks.
//   - InFlight: another worker holds the key now: after
//     Options.InFlightDelay, ErrInFlight (nack), so the redelivery comes
//     after that worker committed or released it.
//   - Poison (the handler failed the engine's MaxAttempts times),
//     Conflict (the key was committed with another payload digest), a
//     message without a usable key (ErrKey: Options.Key failed, or the key
//     is empty or too long; a nack would bring it back unchanged), and a
//     Duplicate whose stored result is not produced messages
//     (ErrStoredOutputs): Options.Reject, then a copy to
//     Options.DeadLetterTopic if set, and a nil error (ack) once it is
//     published; an error (nack) if that publish failed. Without a
//     dead-letter topic the message is acked after Reject, as the NATS
//     integration terminates it.
//   - A failure to claim or commit (engine.ErrStorage, ErrUnavailable, a
//     context ended): an error (nack). A commit that failed is not
//     released: it may have landed, and its redelivery then finds a
//     Duplicate; if it did not, the key is InFlight until the lease ends.
//   - A panicking handler: its claim is released, then the panic goes on
//     (the router's own recover nacks the message; a
//     middleware.Recoverer in front of this middleware turns it into an
//     error, which nacks it too). Behind this middleware, a Recoverer makes
//     it an ordinary handler error.
//
// It must not decide duplicates itself nor reach the engine's internals;
// it must never return a nil error for a New message before its mark is
// durable, and never ack a rejected message before its dead-letter copy
// was published. The engine never imports it, so Watermill stays out of
// the engine's import graph; it imports only Watermill's core packages
// (not the router's middleware package, whose poison-queue metadata keys
// it spells out: ReasonKey and the others).
//
// # Guarantees and what they rest on
//
//  1. A message's handler result reaches the router only after its mark
//     (with the handler's records and produced messages) is durable: a
//     crash before that leaves the message unacked, and its redelivery
//     finds the mark if it landed (Duplicate) or claims it anew (a claim
//     of a process that died is void when the embedded store reopens, and
//     ends with its lease in a shared tier).
//  2. With the handler's effect written through AddWrites (an embedded
//     engine: Tiers Default, no Backend), effect and mark are one atomic
//     write: the effect happens exactly once, whatever the kills. Effects
//     outside the engine (a call to another service, a row in another
//     database) happen at least once: a crash after them and before the
//     commit runs the handler again.
//  3. The produced messages of a committed message are published at least
//     once, always with the UUIDs, metadata and payloads of the handler's
//     one committed run, given a publisher that returns only once the
//     broker has them (watermill-amqp: Publish.ConfirmDelivery).
//  4. While a handler runs, no other worker claims its key (the claim is
//     extended every half lease), and a worker whose claim was lost
//     anyway (a stall longer than the lease) commits nothing and returns
//     ErrLeaseLost.
//
// # Combinations refused or to avoid
//
// New refuses, with ErrEngine, an engine opened with FailOpen (a store
// outage would run redelivered messages again), memory-only (its marks die
// with the process: Watermill's map does as much) or bloom-only (a false
// positive would ack a new message unhandled, and it stores no produced
// messages). The engine's MaxResultSize bounds a message's produced
// messages, encoded (a version byte, then each message's UUID, metadata and
// payload with varint lengths): a handler whose outputs do not fit fails
// with ErrOutputsTooLarge, its claim released, as if it had returned an
// error, rather than commit a mark whose outputs a redelivery could not
// replay. Set the engine's MaxAttempts so that a handler that always fails
// becomes Poison and is rejected, not redelivered forever. A shared
// Backend (Redis, PostgreSQL) stores produced messages but no records:
// AddWrites returns ErrWrites there.
//
// Do not put behind it anything that acks the message before the
// handler's result (middleware.InstantAck, a handler calling msg.Ack): the
// message would be acked before its mark is durable. A Retry middleware
// behind it retries within one claim; in front of it, each retry claims
// again (a Duplicate once a try committed). Give the Middleware a
// namespace of its own (Options.Namespace): a stored result there is read
// as produced messages.
//
// # Concurrency
//
// A Middleware is safe for concurrent use: the router runs each message's
// handler on its own goroutine, and one Middleware may serve many handlers
// and routers. AddWrites may be called from the handler's goroutines until
// the handler returns.
package watermilldedup
