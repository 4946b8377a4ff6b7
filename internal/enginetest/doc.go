// Package enginetest holds the helpers the engine's tests share with the
// engine tests that live beside their backends and stores
// (tier/redis/enginetest, tier/postgres/enginetest,
// tier/archive/enginetest, tier/embedded/enginetest): the one list of
// the engine's configurations (Configs; a test picks from it and adds
// only how it drives them), the reference model's rules of one key
// (rules.go: retention, leases, attempts, conflicts, versions), which
// every model of the engine's tests asks, the conformance
// suite and its reference model (Conformance, run on the engine's own
// configurations and on each shared tier's), processes racing for keys
// through a shared tier (ProcessesRace), a load kept up through a shared
// tier's outage (OutageLoad), ageing a shared tier's own clock with the
// test's (AgeRedis, AgePostgres), a hand-moved clock, a quiet logger, opening
// an engine that fails the test, the shared tiers' backends over a test
// server, a Forget on a goroutine, a clock that pauses Redis on a chosen
// reading, the embedded store's settings and files, and the test hooks
// (internal/hooks) that hold background work at its critical points.
//
// It is imported by tests only. It must never hold a test's assertions
// beyond failing on what a helper cannot do (an engine that does not
// open, a hook that did not fire).
package enginetest
