package httpdedup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// errStored reports a stored response that is not one this package wrote:
// a damaged store, or another writer's result under the namespace. It is
// answered 500 and the request is not run.
var errStored = errors.New("httpdedup: stored response is damaged")

// stored is a response as the engine keeps it with its key: the
// claim's Result.
//
//	version (1) | flags (1: bit 0 body kept, bit 1 headers dropped) | status (2)
//	header count (2) | per header: name length (2) name, value length (2) value
//	body (the rest, when kept)
//
// Invalid: another version, unknown flags, a status outside 100-999, a
// header or body past the end, bytes after the headers without the body
// flag, headers with the dropped flag. decodeStored checks, on every
// replay.
type stored struct {
	status   int
	header   http.Header
	bodyKept bool
	// headersDropped: the stored headers did not fit (MaxResultSize, or
	// more than 65535 values): a replay has the status alone.
	headersDropped bool
	body           []byte
}

// maxStoredValues is the most header values the encoding counts.
const maxStoredValues = 1<<16 - 1

const storedVersion = 1

// encode appends the stored form of s to dst.
func (s *stored) encode(dst []byte) []byte {
	flags := byte(0)
	if s.bodyKept {
		flags |= 1
	}
	if s.headersDropped {
		flags |= 2
	}
	dst = append(dst, storedVersion, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(s.status))
	n := 0
	for _, vs := range s.header {
		n += len(vs)
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	for name, vs := range s.header {
		for _, v := range vs {
			dst = binary.BigEndian.AppendUint16(dst, uint16(len(name)))
			dst = append(dst, name...)
			dst = binary.BigEndian.AppendUint16(dst, uint16(len(v)))
			dst = append(dst, v...)
		}
	}
	if s.bodyKept {
		dst = append(dst, s.body...)
	}
	return dst
}

// storedHeader returns the headers of h that names lists, each value
// within the encoding's 64 KiB (a longer one is not kept); ok is false
// when they are more values than the encoding counts (none is kept).
func storedHeader(h http.Header, names []string) (out http.Header, ok bool) {
	out = http.Header{}
	n := 0
	for _, name := range names {
		for _, v := range h.Values(name) {
			if len(v) < 1<<16 {
				out[name] = append(out[name], v)
				n++
			}
		}
	}
	if n > maxStoredValues {
		return nil, false
	}
	return out, true
}

// decodeStored reads a stored response; the body aliases b.
func decodeStored(b []byte) (stored, error) {
	var s stored
	if len(b) < 6 || b[0] != storedVersion || b[1]&^3 != 0 {
		return s, fmt.Errorf("%w: %d bytes", errStored, len(b))
	}
	s.bodyKept, s.headersDropped = b[1]&1 != 0, b[1]&2 != 0
	s.status = int(binary.BigEndian.Uint16(b[2:]))
	if s.status < 100 || s.status > 999 {
		return s, fmt.Errorf("%w: status %d", errStored, s.status)
	}
	n := int(binary.BigEndian.Uint16(b[4:]))
	if s.headersDropped && n > 0 {
		return s, fmt.Errorf("%w: %d headers flagged dropped", errStored, n)
	}
	rest := b[6:]
	s.header = make(http.Header, n)
	field := func() (string, bool) {
		if len(rest) < 2 {
			return "", false
		}
		l := int(binary.BigEndian.Uint16(rest))
		if len(rest) < 2+l {
			return "", false
		}
		f := string(rest[2 : 2+l])
		rest = rest[2+l:]
		return f, true
	}
	for range n {
		name, ok := field()
		if !ok {
			return s, fmt.Errorf("%w: header past the end", errStored)
		}
		v, ok := field()
		if !ok {
			return s, fmt.Errorf("%w: header value past the end", errStored)
		}
		s.header[name] = append(s.header[name], v)
	}
	switch {
	case s.bodyKept:
		s.body = rest
	case len(rest) > 0:
		return s, fmt.Errorf("%w: %d bytes after the headers", errStored, len(rest))
	}
	return s, nil
}

// bytesReader reads b (nil reads nothing).
func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
