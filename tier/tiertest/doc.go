// Package tiertest is the contract suite every exact tier runs: Run opens
// fresh tiers through a caller's function and checks, through tier.Exact
// and whichever optional interfaces of package tier the value implements
// (CommitWriter, Extender, ResultKeeper, Looker, Forgetter, Advancer,
// Marker, Dropper, Scanner, Latching), the promises that package tier's
// documentation makes, separately for claims that live in the engine
// (tier.ClaimsInEngine) and claims that live in the store
// (tier.ClaimsInStore). A new tier that passes Run has met the contract the
// engine relies on; one that fails is told, by the subtest's name and
// message, which promise it broke.
//
// It owns the checks and what they assert, and nothing else: the caller
// owns the tiers (their directories, servers, prefixes or tables), opens
// one per check and cleans it up through the testing.T it is given. Every
// check asserts only what package tier documents (quoted in the check's
// comment), plus the hints of Options the caller vouches for; an
// implementation's own extra promises belong in that implementation's
// tests.
//
// It must never import anything but the standard library, testing and
// package tier (a tier package's tests import it, so it may not import a
// tier), never reach a server, directory or table but through the tier it
// was handed, never skip a check of tier.Exact itself (only a check of an
// optional interface the tier does not implement, or of a hint it does not
// give, is left out, and Run logs which and why), and never run its checks
// in parallel: tests share the machine with others.
//
// # Concurrency
//
// Run must be called from the test's goroutine. The checks call the tier
// from many goroutines only where the contract says the engine does
// (concurrent batches naming the same keys).
package tiertest
