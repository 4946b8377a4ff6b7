package pebble

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// Key layout. The first byte names a keyspace:
//
//	0x00 meta: store-wide values such as the high-water clock
//	0x01 records: partition (u32 big endian) ‖ len(ns) (u8) ‖ ns ‖ key
//	0x02 the caller's records: its key bytes, never expired by retention
//
// Big-endian partitions sort in time order, so every record of partitions
// [a, b) lies between recordPrefix(a) and recordPrefix(b). Partitions are
// numbered from the Unix epoch; with partitions of at least a second, 32 bits
// last until 2106. Every byte here is paid for at each compaction, which is
// why the layout is this tight.
const (
	spaceMeta    byte = 0x00
	spaceRecords byte = 0x01
	spaceUser    byte = 0x02 // the caller's own records, written with commits
)

var (
	keyHighWater = []byte{spaceMeta, 'h', 'w'}
	keyCreated   = []byte{spaceMeta, 'c', 't'}
)

// appendRecordKey appends the storage key of (partition, ns, key) to dst.
func appendRecordKey(dst []byte, partition int64, ns string, key []byte) []byte {
	dst = append(dst, spaceRecords)
	dst = binary.BigEndian.AppendUint32(dst, uint32(partition))
	dst = append(dst, byte(len(ns)))
	dst = append(dst, ns...)
	return append(dst, key...)
}

// MaxPartition is the highest partition number the key layout holds.
const MaxPartition = 1<<32 - 1

func recordPrefix(partition int64) []byte {
	if partition > MaxPartition {
		return []byte{spaceRecords + 1}
	}
	return binary.BigEndian.AppendUint32([]byte{spaceRecords}, uint32(max(partition, 0)))
}

// ErrCorrupt reports a stored key or value this version cannot decode.
var ErrCorrupt = errors.New("pebble: corrupt record")

// parseRecordKey splits a storage key; ns and key alias k.
func parseRecordKey(k []byte) (partition int64, ns, key []byte, err error) {
	if len(k) < 6 || k[0] != spaceRecords {
		return 0, nil, nil, fmt.Errorf("%w: key of %d bytes", ErrCorrupt, len(k))
	}
	n := int(k[5])
	if len(k) < 6+n {
		return 0, nil, nil, fmt.Errorf("%w: namespace overruns key", ErrCorrupt)
	}
	return int64(binary.BigEndian.Uint32(k[1:5])), k[6 : 6+n], k[6+n:], nil
}

// State is the state of a stored record.
type State uint8

// Record states. Claims are part of the format so a shared or replicated
// store can use it; the exclusive engine writes committed and released
// records only.
const (
	StateClaimed   State = 1
	StateCommitted State = 2
	// StateReleased records a key that is not committed but whose claims
	// failed Attempts times (released, or left to expire): the attempt
	// count every restart sees. It lives, like a commit, for the window
	// after its partition; a commit of the key supersedes it.
	StateReleased State = 3
)

// Value is the decoded form of a stored value.
type Value struct {
	State State
	// LeaseUntil is the lease end of a claim, in Unix nanoseconds. A
	// committed record needs no time: its partition dates it.
	LeaseUntil int64
	// Token is the owner token of a claim.
	Token uint64
	// Attempts is the attempt count of a released record.
	Attempts uint16
	// Digest is the payload digest, zero if none was given.
	Digest Digest
	// At is a commit's time in Unix nanoseconds, zero if not stored (it
	// is stored with a result, and in namespaces with their own window).
	At int64
	// Result is the caller's result stored with a commit, nil for none.
	Result []byte
}

// Value encoding, version 1:
//
//	[0] version = 1
//	[1] state
//	[2] flags: bit 0 = digest present
//	claimed only: LeaseUntil u64 little endian, Token u64 little endian
//	released only: Attempts u16 little endian
//	then the 16-byte digest when flagged
//	committed only: At i64 little endian when flagged (bit 1), then the
//	result's bytes to the end of the value when flagged (bit 2)
//
// A committed record without digest, time or result is 3 bytes. A value
// with an unknown flag is refused (ErrCorrupt), so an older version never
// reads a time or a result as nothing.
const (
	valueVersion  = 1
	flagDigest    = 1
	flagAt        = 2
	flagResult    = 4
	valueFixedLen = 3
)

func appendValue(dst []byte, v Value) []byte {
	flags := byte(0)
	if v.Digest != (Digest{}) {
		flags |= flagDigest
	}
	if v.State == StateCommitted && v.At != 0 {
		flags |= flagAt
	}
	if v.State == StateCommitted && len(v.Result) > 0 {
		flags |= flagResult
	}
	dst = append(dst, valueVersion, byte(v.State), flags)
	switch v.State {
	case StateClaimed:
		dst = binary.LittleEndian.AppendUint64(dst, uint64(v.LeaseUntil))
		dst = binary.LittleEndian.AppendUint64(dst, v.Token)
	case StateReleased:
		dst = binary.LittleEndian.AppendUint16(dst, v.Attempts)
	}
	if flags&flagDigest != 0 {
		dst = append(dst, v.Digest[:]...)
	}
	if flags&flagAt != 0 {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(v.At))
	}
	if flags&flagResult != 0 {
		dst = append(dst, v.Result...)
	}
	return dst
}

func decodeValue(b []byte) (Value, error) {
	if len(b) < valueFixedLen {
		return Value{}, fmt.Errorf("%w: value of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != valueVersion {
		return Value{}, fmt.Errorf("%w: value version %d", ErrCorrupt, b[0])
	}
	v := Value{State: State(b[1])}
	flags, rest := b[2], b[valueFixedLen:]
	if flags&^(flagDigest|flagAt|flagResult) != 0 || flags&(flagAt|flagResult) != 0 && v.State != StateCommitted {
		return Value{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	switch v.State {
	case StateCommitted:
	case StateClaimed:
		if len(rest) < 16 {
			return Value{}, fmt.Errorf("%w: claim without lease and token", ErrCorrupt)
		}
		v.LeaseUntil = int64(binary.LittleEndian.Uint64(rest))
		v.Token, rest = binary.LittleEndian.Uint64(rest[8:]), rest[16:]
	case StateReleased:
		if len(rest) < 2 {
			return Value{}, fmt.Errorf("%w: released record without attempts", ErrCorrupt)
		}
		v.Attempts, rest = binary.LittleEndian.Uint16(rest), rest[2:]
	default:
		return Value{}, fmt.Errorf("%w: state %d", ErrCorrupt, v.State)
	}
	if flags&flagDigest != 0 {
		if len(rest) < len(v.Digest) {
			return Value{}, fmt.Errorf("%w: truncated digest", ErrCorrupt)
		}
		copy(v.Digest[:], rest)
		rest = rest[len(v.Digest):]
		if v.Digest == (Digest{}) {
			return Value{}, fmt.Errorf("%w: a zero digest flagged", ErrCorrupt)
		}
	}
	if flags&flagAt != 0 {
		if len(rest) < 8 {
			return Value{}, fmt.Errorf("%w: truncated time", ErrCorrupt)
		}
		v.At, rest = int64(binary.LittleEndian.Uint64(rest)), rest[8:]
		if v.At == 0 {
			return Value{}, fmt.Errorf("%w: a zero time flagged", ErrCorrupt)
		}
	}
	if flags&flagResult != 0 {
		if len(rest) == 0 {
			return Value{}, fmt.Errorf("%w: an empty result flagged", ErrCorrupt)
		}
		// Result aliases b: a caller that keeps it copies it.
		v.Result, rest = rest, nil
	}
	if len(rest) != 0 {
		return Value{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(rest))
	}
	return v, nil
}

// Digest is a payload digest (tier.Digest), stored whole with a commit.
type Digest = tier.Digest
