// Package enginetest holds the helpers the engine's tests share with the
// engine tests that live beside their backends (tier/redis/enginetest):
// a hand-moved clock, a quiet logger, opening an engine that fails the
// test, the shared tiers' backends over a test server, a Forget on a
// goroutine, and a clock that pauses Redis on a chosen reading.
//
// It is imported by tests only. It must never hold a test's assertions
// beyond failing on what a helper cannot do (an engine that does not
// open, a hook that did not fire).
package enginetest
