// Package enginetest_test holds the engine's tests that need a Redis
// server of their own (the conformance suite on a node and a cluster,
// fencing, fail-open, lost replies, processes racing for keys, Advance,
// the archive behind Redis and its log's drain,
// Forget through the log, batches under faults, failover, attempts shared
// by processes), beside the Redis tier they exercise. They drive the
// engine through its public API only; what they share with the engine's
// own tests is in internal/enginetest.
package enginetest_test
