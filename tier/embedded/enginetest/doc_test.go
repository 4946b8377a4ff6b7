// Package enginetest_test holds the engine's tests of the embedded store
// (tier/embedded): the seals of closed partitions, the checkpoints of the
// open ones and the journal, the moves of sealed partitions into the cold
// database (and their reference model), the handoff (export, import),
// crash recovery and storage faults, with kills at the critical points.
// They drive the engine through its public API only, beside the store
// they exercise; what they share with the engine's own tests is in
// internal/enginetest.
package enginetest_test
