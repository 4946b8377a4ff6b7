// Package redis is the shared, exact tier: claims and committed keys in
// Redis or Redis Cluster, so that many consumer processes deduplicate
// against one truth.
//
// It owns the Redis key and value layout, the atomic claim (one script
// call per key: claim where the key is free or its holder's lease ended,
// with the owner token, the lease end by the server's clock and the key's
// attempt count), the fenced commit and release (compare-and-set on the
// token and an unexpired lease), and the translation of Redis failures
// into ErrUnavailable. It must never answer from anything but Redis's
// reply, never hash a key instead of storing its bytes, never pin keys to
// one cluster slot with a hash tag, and never create its own client: the
// caller passes a go-redis UniversalClient (single node, Sentinel or
// Cluster).
//
// # Concurrency
//
// A Store is safe for concurrent use; each batch call is one pipeline, one
// round trip per node. Pipelines are not transactions: keys of a batch are
// decided independently, each atomically.
//
// # Invariants
//
//  1. A claim is set only where no live claim or commit exists (one
//     script, atomic on the server): of N concurrent claims of a key
//     across processes exactly one is Acquired.
//  2. A retried claim whose first attempt the server applied finds its own
//     token and is Acquired again, never reported as held or committed.
//  3. Commit and Release change a key only while it holds the caller's
//     claim token with an unexpired lease; a commit that finds its own
//     committed value (a retry) is acknowledged.
//  4. Every value has a TTL: committed keys and (with MaxAttempts) claims
//     and attempt counts the window, claims without MaxAttempts their lease.
//  5. Keys are Prefix ‖ NUL ‖ len(ns) ‖ ns ‖ key and prefixes hold no NUL:
//     two prefixes never share a key.
//  6. Every call returns by its context's deadline, whatever the client's
//     own timeouts.
//  7. With the archive log (Options.ArchiveLog), a commit or mark of a
//     request marked Archive is appended to the log in the script run that
//     commits it (one entry per call, after its last write; nothing the
//     script runs after its first write can fail), and every Forget,
//     undone commit and undone mark appends its removal in the script
//     that makes it: no commit Redis holds is missing from the log, and a
//     removal always follows the commit it removes. The same script
//     records the removal in the log's removals hash (Store.Removing),
//     which keeps it until the drain's trim passes it, so an archive read
//     before the drain applied it knows the archive may still hold the
//     commit it undid. The prefix's layout
//     records the log, so no process on it commits without appending. A
//     mark with Archive commits nothing past its Request.LogBy (the
//     server's clock), and a Mark mixing Archive with plain requests is
//     refused. A Forget's delete that finds its key absent appends that
//     removal only by its Request.LogBy: later it writes nothing for the
//     key and the call fails (ErrUnavailable), so a late copy cannot hide
//     a commit made since that has left Redis for the archive.
//  8. A mark answers as its one copy applied: its SET NX (or, with
//     Archive, its script call) is never resent by the client (markOnce,
//     scriptOnce), and a lost reply is settled by the claim
//     script, which answers acquired where the mark's own commit was
//     removed by a Forget since (the Forget's fence, or the forgotten set
//     it writes before removing anything) and marks the key only where no
//     trace of the mark exists.
package redis
