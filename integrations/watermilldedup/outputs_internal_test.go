package watermilldedup

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

func sampleOutputs() []*message.Message {
	a := message.NewMessage("0190c7a2-uuid-a", []byte("payload a"))
	a.Metadata.Set("z", "last")
	a.Metadata.Set("a", "")
	a.Metadata.Set("", "empty key")
	b := message.NewMessage("", nil)
	c := message.NewMessage(strings.Repeat("u", 300), bytes.Repeat([]byte{0, 0xff}, 200))
	return []*message.Message{a, b, c}
}

// TestOutputsRoundTrip: produced messages come back with their UUIDs,
// metadata and payloads, in order; the encoding is deterministic
// (metadata in key order), and none encodes as no result.
func TestOutputsRoundTrip(t *testing.T) {
	in := sampleOutputs()
	b := encodeOutputs(in)
	if b[0] != outputsVersion {
		t.Fatalf("version byte %d", b[0])
	}
	for range 10 {
		if !bytes.Equal(encodeOutputs(in), b) {
			t.Fatal("the encoding depends on map order")
		}
	}
	out, err := decodeOutputs(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("%d messages", len(out))
	}
	for i := range in {
		if out[i].UUID != in[i].UUID || !bytes.Equal(out[i].Payload, in[i].Payload) || !maps.Equal(out[i].Metadata, in[i].Metadata) {
			t.Fatalf("message %d: %+v, want %+v", i, out[i], in[i])
		}
		if out[i].Metadata == nil {
			t.Fatalf("message %d has nil metadata", i)
		}
	}
	b[len(b)-1] ^= 1 // the payload is a copy, not the stored bytes
	if out[2].Payload[len(out[2].Payload)-1] != 0xff {
		t.Fatal("a decoded payload aliases the stored result")
	}
	if encodeOutputs(nil) != nil {
		t.Fatal("no messages must store no result")
	}
	if out, err := decodeOutputs(nil); out != nil || err != nil {
		t.Fatal(out, err)
	}
}

// TestOutputsDamage: every truncation, a trailing byte, another version
// and huge counts are refused with ErrStoredOutputs, never a panic or a
// huge allocation.
func TestOutputsDamage(t *testing.T) {
	b := encodeOutputs(sampleOutputs())
	for n := 1; n < len(b); n++ {
		if _, err := decodeOutputs(b[:n]); !errors.Is(err, ErrStoredOutputs) {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(b), err)
		}
	}
	for name, bad := range map[string][]byte{
		"trailing":     append(bytes.Clone(b), 0),
		"version 2":    append([]byte{2}, b[1:]...),
		"zero count":   {outputsVersion, 0},
		"huge count":   {outputsVersion, 0xff, 0xff, 0xff, 0xff, 0x0f, 0},
		"huge field":   {outputsVersion, 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad varint":   {outputsVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"another's":    []byte("HTTP/1.1 200 OK"),
		"huge pairs":   {outputsVersion, 1, 0, 0xff, 0xff, 0x03},
		"payload past": {outputsVersion, 1, 0, 0, 5, 'a'},
	} {
		if _, err := decodeOutputs(bad); !errors.Is(err, ErrStoredOutputs) {
			t.Errorf("%s: %v, want ErrStoredOutputs", name, err)
		}
	}
}

// FuzzDecodeOutputs: any stored bytes decode or fail with
// ErrStoredOutputs, and what decodes encodes back in no more bytes (a
// repeated metadata key or a long varint only shrink).
func FuzzDecodeOutputs(f *testing.F) {
	f.Add(encodeOutputs(sampleOutputs()))
	f.Add([]byte{outputsVersion, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := decodeOutputs(b)
		if err != nil {
			if !errors.Is(err, ErrStoredOutputs) {
				t.Fatal(err)
			}
			return
		}
		if again := encodeOutputs(out); len(b) > 0 && len(again) > len(b) {
			t.Fatalf("re-encoded %d bytes from %d", len(again), len(b))
		}
	})
}
