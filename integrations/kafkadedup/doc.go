// Package kafkadedup runs a Kafka consumer-group member (franz-go's kgo)
// that acts once per record: it owns one tierdedup engine per assigned
// topic-partition, claims each fetched partition batch, hands the New
// records to the caller's handler, and commits the marks, the handler's
// records and the partition's next offset in one atomic, durable write of
// that partition's engine. The offset stored with the marks, not the
// broker's committed offset, is where the partition resumes.
//
// It owns the mapping from partitions to engine directories, the offset
// record and the partition handoff (export on revocation, import on
// assignment); it must not decide duplicates itself (the engine does) nor
// reach the engine's internals: it uses only the engine's public API, and
// the engine never imports it, so franz-go stays out of the engine's
// import graph.
//
// # Guarantees and what they rest on
//
//  1. A record's effect written by the handler as engine.Write records is
//     applied exactly once in the partition's state: the marks, the records
//     and the next offset are one Pebble batch, synced before Process
//     returns; a crash before it leaves none of them, after it all.
//  2. A partition resumes at the offset stored with its marks; records
//     before it are never handed to a handler again by this package, and a
//     redelivered or re-sent record after it whose key was committed is a
//     Duplicate.
//  3. Members that share Options.Dir (one host, or a volume they all
//     mount) hand a partition over with no copy: the next owner opens the
//     same directory, waiting while a previous owner still holds it (the
//     engine's directory lock fences a member that has not noticed it lost
//     the partition), and a member killed mid-batch leaves a directory the
//     next Open recovers.
//  4. Members with their own directories hand a partition over through
//     Options.Exports: the owner exports on revocation, the next owner
//     imports the export when it is newer than its own copy (engine.Import
//     checks every file). A member killed before exporting leaves only its
//     last export: the next owner resumes from that export's offset and
//     redoes the work done since, with its records; effects written only
//     through engine.Write records are still exactly once in the state that
//     continues, effects outside the store are redone. A member that finds
//     neither an export nor a directory starts empty from the group's
//     committed offset or the client's reset offset.
//
// Dedup is per partition: a producer re-send of a record goes to the same
// partition when the record key chooses the partition (the default
// partitioner), which is what makes it a Duplicate there.
//
// # Concurrency
//
// A Member serves one kgo.Client; Process (or Run) is called from one
// goroutine, between polls, with kgo.BlockRebalanceOnPoll in force (Opts
// sets it), so assignment and revocation never run beside a batch.
package kafkadedup
