// Package natsdedup handles NATS JetStream messages once each: it claims a
// message's key (its Nats-Msg-Id header, or the caller's key function) in a
// tierdedup engine, runs the handler while keeping both the broker's ack
// wait and the engine's claim alive, commits the mark with the handler's
// records, and acks the message only once that commit is durable.
//
// JetStream's own duplicate window (the stream's Duplicates setting) is
// kept in the server's memory and bounded in time; the engine extends it to
// the engine's window (days) on disk, and also covers what JetStream's
// window does not: redeliveries of a message whose ack was lost, or whose
// consumer died after its effect.
//
// It owns the mapping from JetStream's acknowledgements to the engine's
// outcomes:
//
//   - New: the handler runs; while it runs longer than half the lease, the
//     message gets InProgress and the claim an Extend, every half lease;
//     on success the mark and the handler's records are committed
//     (CommitBatchAsync) and the message acked in the commit's done; on
//     failure the claim is released and the message Nak'ed for
//     redelivery.
//   - Duplicate: acked (its effect was committed before).
//   - InFlight: another worker holds the key now: NakWithDelay, so the
//     redelivery comes after that worker committed or released it.
//   - Poison (the handler failed MaxAttempts times) and Conflict (the key
//     was committed with another payload): Term, after Options.Reject.
//
// It must not decide duplicates itself nor reach the engine's internals; the
// engine never imports it, so nats.go stays out of the engine's import
// graph.
//
// # Guarantees and what they rest on
//
//  1. A message is acked only after its mark (and the handler's records)
//     is durable: a crash before that leaves the message unacked, and its
//     redelivery finds the mark if it landed (Duplicate) or claims it anew.
//  2. With the handler's effect written as engine.Write records (an
//     embedded engine: Tiers Default), effect and mark are one atomic
//     write: the effect happens exactly once, whatever the kills.
//  3. While a handler runs, no other worker claims its key (the claim is
//     extended with the broker's ack wait), and a worker whose claim was
//     lost anyway (a stall longer than its lease) cannot commit.
//
// # Concurrency
//
// A Consumer is safe for concurrent use: Handle may be called from many
// goroutines (one JetStream Consume callback, or several).
package natsdedup
