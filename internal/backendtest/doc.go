// Package backendtest holds end-to-end checks of a shared tier (Redis,
// PostgreSQL) through the engine's public API, which each shared tier's
// own tests run with its client wrapped to fault on demand: a lost
// reply followed by a late give-back, and a commit group of large
// results; and the mark nemesis (RunNemesis), consumer processes marking
// through a server the tier's test pauses, while consumers are killed. It owns no tier and no fault: the tier's test supplies both
// (a go-redis hook, a wrapped pgx pool). It must never be imported
// outside tests.
//
// # Concurrency
//
// Each check drives its engines from the calling goroutine only; the
// nemesis's ledger is fed by its consumers' output goroutines, under its
// lock.
package backendtest
