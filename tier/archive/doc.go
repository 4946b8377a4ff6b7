// Package archive moves the partitions an exact tier closes into a
// tier.Archive and answers from it: it owns the archive's side of a
// partition's life (closed and sealed in the exact tier → archived →
// dropped from the exact tier → expired from the archive), the archive's
// filter ring and its blobs, the archiving loop, the drain of a shared
// tier's archive log, and the reads and removals of archived keys.
//
// The engine opens an Archiver through tier.OpenArchiver (this package
// registers Open there when it is linked, which every archive backend's
// package ensures by importing it; the engine itself never imports it)
// with what it needs of the engine (tier.ArchiverConfig: the clock, the
// exact tier's partitions, reads and drops) and, through the
// tier.Archiver interface, asks it only two things: what it holds for a key (Find, Forget) and how
// far it reaches (Next: the first partition not archived, below which the
// exact tier may drop). Everything between those questions is decided
// here, by events (a rotation or the store's seal of a partition pokes
// it) rather than by polling the engine.
//
// It never answers New: an archive that cannot be read fails the call
// (tier.ErrUnavailable), and a key it does not hold is left to the exact
// tier's answer. It never drops a partition from the exact tier itself:
// it gives the embedded store its reach (tier.ArchiveSource.HoldFor:
// Next) and tells it when the archive holds more (Release); the store,
// the one owner of its partitions' lives, drops below it.
//
//	commit ──► hot partition p (exact tier, the Window)
//	           │ p closes and is sealed
//	           ▼
//	           archive.Put(p) ──► archived (durable) ──► the exact tier may drop p
//	                                                     once p leaves the Window
//	                              │ ArchiveWindow after p
//	                              ▼
//	                              archive.Drop: the key is New again
//
// A closed partition is archived as soon as it is sealed, so the archive
// normally holds it long before it leaves the window; the exact tier drops
// a partition only once the archive holds it (Next), and while the archive
// lags behind the window, the exact tier's partitions that left the window
// are still read, unfiltered, for every key found nowhere else (lagging
// reads).
//
// A filter ring of its own covers the archive (Slots slots of Group
// partitions each): a key it rules out never reaches the archive. Each
// slot's filter is saved in the archive as a blob after each partition it
// takes in, naming the newest partition it covers; a partition archived
// after its group's blob (a crash between the two) is scanned back into
// the filter at Open. What makes a blob invalid, and who checks (Open):
// another kind, secret check or filter parameters, or a damaged file (the
// snapshot's checksum), or one whose newest partition is not in the group
// its name gives: it is not loaded, and its group's partitions are
// scanned.
//
// # Invariants
//
//  1. The exact tier drops partition p only after archive.Put(p)
//     returned (Next > p), and p is copied only once no write can land
//     in it (its seal, or, for a partition that left the window and is
//     never sealed, the store's refusal of writes into it, which makes
//     those already sent durable first: CloseWrites): no committed key is
//     ever in neither, a mark that read the time before a clock jump past
//     the window included (it fails instead).
//  2. A key is added to the archive filter before its partition becomes
//     visible to claims (Next moves past it).
//  3. A Forget and the archiving of a partition exclude each other
//     (Forgetting), so an archived copy never brings back a key a Forget
//     removed.
//  4. The archive is consulted only for keys the exact tier left New,
//     and an archive that cannot answer fails the call
//     (tier.ErrUnavailable): it never makes a key New.
//
// Behind a shared tier (Redis, which expires keys itself and has no
// partitions to copy) the archive is fed from the tier's log:
//
//	commit script ──► the key (TTL Window) and a log entry, in one step
//	                  │ drained in order by the engine holding the drain lease
//	                  ▼
//	                  archive.Apply (its position recorded in the same
//	                  transaction), then the log trimmed up to it
//	                  │ once the log holds none of partition p's entries
//	                  │ and none can come (the log's clock passed p's end)
//	                  ▼
//	                  p's keys into the filter, its group's blob saved,
//	                  then archive.Seal(p)
//
// Every engine loads the blob of each newly sealed partition (refresh).
// A key the shared tier acquires, because it holds no commit of it, is
// asked of the archive; the answer counts only if every partition holding
// keys the tier may have let go (committed a Window or more ago) is sealed
// in this engine's filter (sealedFor), and otherwise the call fails with
// tier.ErrUnavailable: never a New that the archive could contradict.
//
//  5. A partition is sealed only after its group's blob holds its keys,
//     and only once no entry of it can be appended: a reader that loaded
//     the blob of every sealed partition misses no archived key.
//  6. The log is trimmed only up to a position the archive recorded as
//     applied; an entry applied twice (a drainer dead before its trim, or
//     two drainers a lease apart) is skipped by that position.
//  7. A Forget returns only once the archive applied the log up to the
//     removal it appended, so no drain brings the key back afterwards.
//  8. A removal the log holds and the drain has not trimmed (a give-back
//     of a commit whose caller was told it failed, or a Forget that gave
//     up waiting) hides what the archive answers for its key
//     (tier.ArchiveLog.Removing) when the archive read had applied the
//     log only up to a position before it (tier.AppliedLookup: of one
//     snapshot with the answers), and only then: a removal it had
//     applied shows in the read, and what the read found is a later
//     commit. An archive hit of a key the log holds no removal of is read
//     again when the log was trimmed past that position, so a removal
//     applied and trimmed in between shows. Find never answers a commit a
//     removal in the log undid, and never hides a later one.
//
// # What a late, duplicated or reordered step can do
//
// A Put retried after a lost reply replaces nothing (Put is all or
// nothing and idempotent); the store records a partition archived only
// after Put returned, so a crash between the two re-archives it. A Put
// whose reply was lost and that landed late (after the next process's
// Open listed the archive) makes that process's Put find the partition
// held and read nothing: its keys are then scanned back from the archive
// before the partition counts as archived. A log
// entry applied twice is skipped by the applied position (6). A seal is
// recorded only after its blob, so a crash between them re-seals. A blob
// written late (after a newer one of its group) names an older partition
// and is scanned past at Open.
//
// A write of a call that read the time before a partition left the
// window, arriving after the archiver closed that partition for writes
// (CloseWrites), is refused and fails its call (ErrUnavailable: nothing
// written, nothing acknowledged); one that arrived before is durable
// before the copy reads the partition. A late or repeated CloseWrites
// only raises the floor to where it already is. Seals and the archive's
// progress are events (OnSealed, Release): a lost wake-up costs time,
// never a key, since a failed seal is tried again a second later and
// every rotation wakes the archiver.
package archive
