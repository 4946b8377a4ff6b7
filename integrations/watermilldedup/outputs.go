package watermilldedup

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
)

// outputsVersion is the first byte of the stored form of produced
// messages: the claim's Result.
//
//	version (1) | count (uvarint)
//	per message: uuid | metadata pairs (uvarint) | per pair, in key order:
//	key, value | payload
//
// each string or byte field a uvarint length and its bytes. Nothing may
// follow the last message. No produced messages store no Result at all.
const outputsVersion = 1

// encodeOutputs returns the stored form of msgs, nil for none.
func encodeOutputs(msgs []*message.Message) []byte {
	if len(msgs) == 0 {
		return nil
	}
	n := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		n += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			n += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, outputsVersion)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	field := func(s []byte) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	var keys []string
	for _, m := range msgs {
		field([]byte(m.UUID))
		keys = keys[:0]
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			field([]byte(k))
			field([]byte(m.Metadata[k]))
		}
		field(m.Payload)
	}
	return b
}

// decodeOutputs returns the messages b stores, new ones (their contexts
// the background's), nil for an empty b. An error matches
// ErrStoredOutputs.
func decodeOutputs(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	bad := func(what string) error {
		return fmt.Errorf("%w: %s (%d bytes)", ErrStoredOutputs, what, len(b))
	}
	if b[0] != outputsVersion {
		return nil, bad(fmt.Sprintf("version %d", b[0]))
	}
	rest := b[1:]
	count := func() (int, bool) {
		v, n := binary.Uvarint(rest)
		// Every counted item takes at least one byte: a count past what
		// is left is damage, not a reason to allocate.
		if n <= 0 || v > uint64(len(rest)) {
			return 0, false
		}
		rest = rest[n:]
		return int(v), true
	}
	field := func() ([]byte, bool) {
		l, ok := count()
		if !ok || l > len(rest) {
			return nil, false
		}
		f := rest[:l:l]
		rest = rest[l:]
		return f, true
	}
	n, ok := count()
	if !ok || n == 0 {
		return nil, bad("message count")
	}
	msgs := make([]*message.Message, 0, n)
	for range n {
		id, ok := field()
		if !ok {
			return nil, bad("uuid past the end")
		}
		pairs, ok := count()
		if !ok {
			return nil, bad("metadata count")
		}
		md := make(message.Metadata, pairs)
		for range pairs {
			k, ok1 := field()
			v, ok2 := field()
			if !ok1 || !ok2 {
				return nil, bad("metadata past the end")
			}
			md[string(k)] = string(v)
		}
		payload, ok := field()
		if !ok {
			return nil, bad("payload past the end")
		}
		m := message.NewMessage(string(id), slices.Clone(payload))
		m.Metadata = md
		msgs = append(msgs, m)
	}
	if len(rest) > 0 {
		return nil, bad(fmt.Sprintf("%d bytes after the last message", len(rest)))
	}
	return msgs, nil
}
