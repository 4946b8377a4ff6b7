// Package enginetest_test holds the engine's tests that need PostgreSQL
// (the conformance model on the tier, fencing between processes, a server
// killed mid-run, statements lost or run late, sweeps, layout checks),
// beside the PostgreSQL tier they exercise. They drive the engine through
// its public API only; what they share with the engine's own tests is in
// internal/enginetest.
package enginetest_test
