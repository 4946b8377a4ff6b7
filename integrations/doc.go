// Package integrations holds nothing itself: its subpackages connect the
// engine to the systems a consumer or an API already runs, each as a
// client of the engine's public API.
//
//   - kafkadedup: a Kafka consumer-group member (franz-go) that acts once
//     per record, storing its offsets with its marks;
//   - natsdedup: NATS JetStream messages handled once, acked once durable;
//   - watermilldedup: a Watermill handler middleware, for any broker
//     Watermill speaks: handled once, acked once durable;
//   - httpdedup: the Idempotency-Key middleware and client Transport;
//   - promdedup: the engine's Stats as Prometheus metrics;
//   - oteldedup: the same metrics as OpenTelemetry instruments, and spans
//     of Do and DoResult.
//
// An integration must never be imported by the engine, a tier or shard:
// arrows point from here down, so a broker's or an exporter's client
// library is linked only into the programs that import its integration.
// None decides a duplicate itself; the engine does. natsdedup, oteldedup
// and watermilldedup are modules of their own (docs/layout.md, Modules),
// so their libraries set no minimum version in a program that imports
// only the engine.
package integrations
