package tier

import (
	"context"
	"time"
)

// Exact is an exact, durable tier: the source of truth for every key that
// memory does not decide. The engine holds at most one, behind the memory
// table and an optional filter, and talks to it only through this contract
// and the optional interfaces below; which implementation it is matters only
// when the engine is opened.
//
// Every method takes a batch: reqs[i] is answered in out[i], and out must
// have len(reqs). No key appears twice in one batch (the engine settles a
// batch's repeats in its memory table first), but the engine calls the
// methods concurrently, from many goroutines, with batches that name the
// same keys; an implementation is safe for that, and never keeps a
// reference to reqs, out or their key bytes after returning.
//
// # Where claims live
//
// ClaimsInEngine (Pebble): one process owns the tier, and the engine's memory
// table holds every claim and fences it (only the claim's token may commit
// or release it). Claim is then a read: the tier answers Absent,
// Committed (with the record's Partition) or Released (with its attempt
// count). Commit writes committed records; Release writes the attempt
// counts the engine gives it. The tier never sees a lease.
//
// ClaimsInStore (Redis): many processes share the tier, so a claim must be
// taken in it, atomically, and every commit and release is fenced by the
// claim's owner token there. Claim acquires: Acquired (the caller's token
// now holds the key, for lease), Held, Committed (with the committer's
// Token) or Poisoned; Commit and Release answer OK or Lost per key.
//
// # Errors
//
// An error means the call's outcome is not known for any key of the batch
// (out is then unspecified). For ClaimsInEngine nothing was written: a
// failed write wrote nothing, and a read or write failure may latch (see
// Latching). For ClaimsInStore the commands may or may not have been
// applied (a reply lost on the way back): the engine keeps the claims'
// tokens so that a retry can recognise its own writes. No method answers
// Absent or Acquired for a key it could not read.
type Exact interface {
	// Claims says where claims live.
	Claims() Where
	// Claim answers each key (see "Where claims live"). lease is the
	// claim's lease (ClaimsInStore only).
	Claim(ctx context.Context, reqs []Request, lease time.Duration, out []Answer) error
	// Commit makes each key committed for the window: in partition
	// (ClaimsInEngine), or when reqs[i].Token still holds it (ClaimsInStore;
	// out[i] Lost otherwise). On success every key answers Committed to
	// later claims, durably as configured.
	Commit(ctx context.Context, partition int64, reqs []Request, out []Status) error
	// Release ends claims that did not commit. ClaimsInEngine: writes, in
	// partition, the attempt count reqs[i].Attempts of each key, zero
	// included (a durable claim given back restores the count it raised);
	// nothing with giveBack. ClaimsInStore: frees each key its token holds
	// (out[i] Lost otherwise), counting an attempt, or with giveBack counting
	// none and undoing a commit the same token made.
	Release(ctx context.Context, partition int64, reqs []Request, giveBack bool, out []Status) error
	// Close releases the tier's resources; nothing is called after it.
	Close() error
}

// Where says where an Exact tier's claims live.
type Where uint8

// Where claims live.
const (
	// ClaimsInEngine: the engine's memory table holds and fences claims; the
	// tier stores commits and attempt counts.
	ClaimsInEngine Where = iota + 1
	// ClaimsInStore: the tier holds and fences claims, shared by every
	// process that uses it.
	ClaimsInStore
)

// Request is one key of a batch for an Exact tier.
type Request struct {
	NS  string
	Key []byte
	// Token is the claim's owner token (ClaimsInStore). The engine never
	// sends one token in two calls: a give-back names its call exactly,
	// and a late copy of it cannot touch a later call's state.
	Token Token
	// Earlier, when not zero, makes a Claim or Mark a retry
	// (ClaimsInStore): the caller's earlier calls of this key, whose
	// replies were lost, sent the tokens of Token's process (its first 8
	// bytes) from Earlier up to, not including, Token. A claim or commit
	// that the tier holds for such a token is the caller's own, never
	// acknowledged: Claim and Mark first move it to Token (adopt it), in
	// the same atomic step, and then answer as if Token had made it (a
	// claim renewed and Acquired; a commit Committed with Token, or
	// replaced by Mark's commit and Acquired). So a late give-back of an
	// earlier call, which names that call's token, finds nothing of its
	// own once a retry has answered.
	Earlier Token
	// Digest is the payload digest Commit stores; zero for none.
	Digest Digest
	// Oldest and Mask are a filter's hint to Claim (partitioned tiers):
	// the key can be held only in partitions p >= Oldest whose bit
	// p mod 64 is set in Mask. ^0 names every live partition.
	Oldest int64
	Mask   uint64
	// Attempts is the attempt count Release writes (ClaimsInEngine), or,
	// in a Release with giveBack (ClaimsInStore), the count the claim
	// carried when it was acquired (its Answer's Attempts): a commit it
	// undoes leaves that count, as if the commit had never been made.
	Attempts uint16
	// Result is the caller's result Commit stores with the key, nil for
	// none, and At the commit's time (Unix nanoseconds of the engine's
	// clock; zero for none). Tiers that keep results (ResultKeeper) return
	// both with every later Committed answer; a partitioned tier stores At
	// whenever it is given, so the engine can date a commit in a namespace
	// whose window is shorter than the tier's.
	Result []byte
	At     int64
	// Versioned marks an entity's version key (the engine's Advance): its
	// committed Digest is the version; Release restores the version the
	// claim replaced instead of freeing the key, and counts no attempt.
	Versioned bool
	// Archive asks a tier that keeps an ArchiveLog to append this commit
	// (Commit; Mark of a LogMarker), or this removal (Forget; Release
	// undoing a commit), to it.
	Archive bool
	// LogBy, for a LogMarker's Mark with Archive, is the latest time
	// (Unix ns, by the tier's clock, which dates the log) at which the
	// mark may commit: a mark reaching the tier later writes nothing and
	// the call fails (ErrUnavailable). The engine read the archive for
	// the key before marking, at time t; a commit of the key that leaves
	// the tier's window before LogBy = t + LogSkew/2 was sealed into the
	// archive by then, so that read saw it (see LogSkew). For a Forget
	// behind an ArchiveLog it bounds the delete: one that reaches the
	// tier after LogBy and finds the key absent appends no removal and
	// fails (a commit made since may have left the tier for the archive,
	// where the removal would hide it). The engine counts it from the end
	// of its archive read, which the delete's own read of the key
	// follows: a commit made after that read stays in the tier for its
	// window, longer than LogSkew/2 plus LogSkew. Zero: no bound.
	LogBy int64
	// Window, when positive, is how long Commit keeps the key committed in
	// a tier that expires keys itself (shorter than its own window: a
	// namespace's); zero means the tier's window.
	Window time.Duration
}

// Answer is an Exact tier's answer to Claim for one key.
type Answer struct {
	// Status is Absent, Committed or Released (ClaimsInEngine), or
	// Acquired, Held, Committed or Poisoned (ClaimsInStore).
	Status Status
	// Digest is the committed payload digest (Committed).
	Digest Digest
	// Partition holds the record (Committed, Released) in a partitioned
	// tier: the engine may cache a committed key until that partition
	// expires. -1 when the tier cannot tell, and then nothing is cached:
	// memory must never outlive the tier's own expiry.
	Partition int64
	// Token is the committer's owner token (Committed, ClaimsInStore): a
	// retried commit recognises its own write by it.
	Token Token
	// Attempts is the key's attempt count: a Released record's, an
	// Acquired claim's carried count, a Poisoned key's reached one.
	Attempts uint16
	// Expired reports that this claim found another's lease ended and
	// counted it as an attempt (ClaimsInStore).
	Expired bool
	// Result and At are the result and time stored by the commit
	// (Committed, ResultKeeper tiers); Result is nil when it stored none,
	// and is the caller's (a copy, never the tier's buffer).
	Result []byte
	At     int64
	// Unsettled reports a mark (Marker, ClaimsInStore) whose first
	// message's reply was lost and whose settling found the key held or
	// committed by another call (Held, or Committed with another token):
	// the first message may still reach the tier late and commit the key
	// with Token once it is free. The engine remembers Token for the key,
	// so that its next call sends it as Request.Earlier and adopts such a
	// commit instead of answering Duplicate.
	Unsettled bool
}

// Write is a caller's own record, written with commits by a tier that
// implements CommitWriter, in a keyspace that retention never touches.
type Write struct {
	Key, Value []byte
}

// CommitWriter is an Exact tier that can write the caller's records in
// the same atomic, durable batch as a commit.
type CommitWriter interface {
	// CommitWith is Commit plus writes, all or nothing. With no reqs it
	// writes the records alone.
	CommitWith(ctx context.Context, partition int64, reqs []Request, writes []Write, out []Status) error
	// ScanWrites calls fn for every record written with commits whose key
	// starts with prefix, in key order; key and value are valid only
	// during the call.
	ScanWrites(prefix []byte, fn func(key, value []byte) error) error
}

// Extender is a shared Exact tier (ClaimsInStore) that can extend the
// lease of a claim, for a handler that runs longer than it.
type Extender interface {
	// Extend makes the lease of each claim that reqs[i].Token holds with
	// an unexpired lease end lease from now, unless it already ends later
	// (out[i] OK); a key the token no longer holds is out[i] Lost and
	// unchanged. Errors are Claim's: the outcome is unknown, and a retry is
	// safe.
	Extend(ctx context.Context, reqs []Request, lease time.Duration, out []Status) error
}

// ResultKeeper is an Exact tier that stores Request.Result and
// Request.At with a commit and returns them with every Committed answer.
// The engine refuses a commit with a result over any other tier.
type ResultKeeper interface {
	// KeepsResults reports whether results are stored.
	KeepsResults() bool
}

// Looker is an Exact tier whose claims live in it (ClaimsInStore) that
// can tell a key's state without claiming it. (A ClaimsInEngine tier's
// Claim is already a read.)
type Looker interface {
	// Lookup answers each key without changing anything: Absent, Held (a
	// live claim), Committed (with Digest, Result and At), Released (an
	// attempt count, or a claim whose lease ended, counted) or Poisoned.
	// An error means nothing is known.
	Lookup(ctx context.Context, reqs []Request, out []Answer) error
}

// Forgetter is an Exact tier that can remove a key's committed record or
// attempt count, so that the next claim of it is New.
type Forgetter interface {
	// Forget removes every record of each key (every partition
	// reqs[i].Oldest and Mask name, in a partitioned tier) unless a live
	// claim holds it, atomically per key, and answers what it found, as
	// Lookup does: Held keys are left as they are. It returns once the
	// removal is durable as configured. An error means the outcome is not
	// known (a retry is safe).
	Forget(ctx context.Context, reqs []Request, out []Answer) error
}

// Advancer is a shared Exact tier (ClaimsInStore) that claims an entity's
// version key only for a higher version, atomically (the engine's
// Advance).
type Advancer interface {
	// Advance claims each key for reqs[i].Token and lease when
	// reqs[i].Digest, a version, is greater than the version stored
	// (committed, or kept by a claim that replaced it): Acquired, with
	// Digest the version it replaces (zero if none). Otherwise it changes
	// nothing and answers Committed with Digest the stored version, or Held
	// while another live claim holds the key. Versions compare as their
	// Digest's bytes. Errors are Claim's.
	Advance(ctx context.Context, reqs []Request, lease time.Duration, out []Answer) error
}

// Marker is a shared Exact tier that can claim and commit in one step, for
// a caller that processes nothing between the two (the engine's
// MarkBatch): one statement or pipeline instead of two.
type Marker interface {
	// Mark is Claim followed, for every key it acquires, by Commit: the
	// answer Acquired means the key is now committed by reqs[i].Token with
	// reqs[i].Digest. Other answers and errors are Claim's.
	Mark(ctx context.Context, reqs []Request, out []Answer) error
}

// PartialMarker is a Marker that marks in one step only in some of its
// configurations: the engine marks through Mark only while CanMark.
type PartialMarker interface {
	Marker
	// CanMark reports whether Mark keeps every promise Claim and Commit
	// keep in this configuration.
	CanMark() bool
}

// LogMarker is a Marker that keeps an ArchiveLog and can mark keys of an
// archived namespace in one step: Mark of requests with Archive set
// appends each commit it makes to the log in the step that makes it, and
// refuses to commit past the requests' LogBy. Without it the engine
// marks behind an archive in three steps (claim, read the archive,
// commit).
type LogMarker interface {
	Marker
	// MarksWithLog reports whether Mark keeps that promise in this
	// configuration.
	MarksWithLog() bool
}

// LogSkew bounds the difference between an engine's clock and a shared
// tier's, which dates the archive log and expires the keys: the archive
// answers a read at time t only once every partition the log filled
// before t - window + LogSkew is sealed, and a one-step mark behind it
// commits only until t + LogSkew/2 (Request.LogBy).
const LogSkew = 2 * time.Second

// Unmarker is a Marker whose marks the engine gives back, after a Mark
// call failed, through Unmark rather than Release: a mark has no claim for
// the give-back to remove first, so a mark still on its way to the tier
// (a paused server) must be fenced out by other means.
type Unmarker interface {
	Marker
	// Unmark undoes each request's mark if the tier applied it (a commit
	// carrying reqs[i].Token), and otherwise keeps that mark from being
	// applied for fence; out[i] is OK when a mark was undone.
	Unmark(ctx context.Context, reqs []Request, fence time.Duration, out []Status) error
}

// Dropper is a partitioned Exact tier whose retention the engine drives.
type Dropper interface {
	// Drop deletes every record of partitions before `before` and
	// records highWater, the engine's clock, durably, in one step.
	Drop(before, highWater int64) error
}

// Scanner is a partitioned Exact tier that can list what it holds, so the
// engine can rebuild a filter from it.
type Scanner interface {
	// Scan calls fn for every committed or released record in partitions
	// [from, to); ns and key are valid only during the call.
	Scan(ctx context.Context, from, to int64, fn func(partition int64, ns, key []byte) error) error
}

// Latching is an Exact tier that stops after a failure it cannot recover
// from (a failed WAL write, an unreadable block) until it is reopened.
type Latching interface {
	// Broken returns the failure that stopped the tier, nil while it works.
	Broken() error
}
