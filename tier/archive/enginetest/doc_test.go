// Package enginetest_test holds the engine's tests of the archive behind
// the embedded store (files and PostgreSQL archives): history kept for
// the archive window, transitions (a window or archive window changed on
// reopen, an archive detached, replaced or refused), faults and kills
// while archiving, Forget reaching the archive, sliding namespaces with an
// archive. They drive the engine through its public API only, beside the
// package that owns the archive; the archive behind Redis is tested in
// tier/redis/enginetest. What they share with the engine's own tests is in
// internal/enginetest.
package enginetest_test
