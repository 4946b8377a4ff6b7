package httpdedup

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
)

// recorder is the ResponseWriter a handler of a New request writes to. It
// holds the response back, body included, up to keep bytes, so that the
// response is stored before the client sees it; a body longer than keep,
// or a Flush, starts sending at once (streaming), the response then
// stored after the handler returns, without its body if it outgrew keep.
type recorder struct {
	w      http.ResponseWriter
	header http.Header
	status int
	keep   int
	body   bytes.Buffer // the body while it fits keep
	size   int64        // body bytes written by the handler
	// overflow: the body outgrew keep and is not kept; streaming: the
	// status and headers went to the client.
	overflow, streaming bool
	err                 error // the client's write error, once streaming
}

func newRecorder(w http.ResponseWriter, keep int) *recorder {
	return &recorder{w: w, header: http.Header{}, keep: keep}
}

// Header returns the handler's headers, sent when the response is.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the status; an informational one (1xx) goes to the
// client at once, with the headers set so far.
func (r *recorder) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		maps.Copy(r.w.Header(), r.header)
		r.w.WriteHeader(code)
		return
	}
	if r.status == 0 {
		r.status = code
	}
}

// Write buffers p while the body fits keep, and streams beyond.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.size += int64(len(p))
	if !r.overflow && r.size > int64(r.keep) {
		r.overflow = true
		r.startStreaming()
		r.body.Reset()
	}
	if !r.overflow {
		r.body.Write(p)
		if !r.streaming {
			return len(p), nil
		}
	}
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.w.Write(p)
	if err != nil {
		r.err = err
	}
	return n, err
}

// Flush sends what the handler wrote so far and streams from then on.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.startStreaming()
	if f, ok := r.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack refuses: a hijacked connection's exchange cannot be stored and
// replayed (without this, http.ResponseController would unwrap to the
// client's connection and the middleware would store an empty 200).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("httpdedup: a keyed request's connection cannot be hijacked: %w", http.ErrNotSupported)
}

// Unwrap gives http.ResponseController the client's writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// startStreaming sends the status, headers and the body held back.
func (r *recorder) startStreaming() {
	if r.streaming {
		return
	}
	r.streaming = true
	h := r.w.Header()
	maps.Copy(h, r.header)
	if r.overflow {
		h.Set(HeaderStored, "headers")
	}
	r.w.WriteHeader(r.status)
	if r.body.Len() > 0 {
		if _, err := r.w.Write(r.body.Bytes()); err != nil {
			r.err = err
		}
	}
}

// send sends the response held back (with extra headers), or, once
// streaming, nothing more.
func (r *recorder) send(extra http.Header) {
	if r.streaming {
		return
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	h := r.w.Header()
	maps.Copy(h, r.header)
	maps.Copy(h, extra)
	if h.Get("Content-Length") == "" && bodyAllowed(r.status) {
		h.Set("Content-Length", strconv.Itoa(r.body.Len()))
	}
	r.w.WriteHeader(r.status)
	_, _ = r.w.Write(r.body.Bytes())
}

// finalStatus is the response's status: 200 if the handler set none.
func (r *recorder) finalStatus() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// stored returns the response to store: status, the headers named, and
// the body unless it outgrew keep.
func (r *recorder) stored(names []string) stored {
	h, ok := storedHeader(r.header, names)
	return stored{status: r.finalStatus(), header: h, headersDropped: !ok, bodyKept: !r.overflow, body: r.body.Bytes()}
}

// bodyAllowed reports whether a response of status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
