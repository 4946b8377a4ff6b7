package httpdedup_test

// Adversarial tests of the middleware and the Transport: each asserts one
// of the package's promises through its public API only, so that it fails
// if the promise is broken.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// replayed reports whether r is a replay.
func replayed(r response) bool { return r.header.Get(httpdedup.HeaderReplayed) == "true" }

// TestAdvKeySpellings: a key is its parsed RFC 8941 String: surrounding
// spaces and parameters do not change it (one run, then replays); keys that
// differ only by what their escapes decode to are different keys; an
// invalid escape is 400, never run.
func TestAdvKeySpellings(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", n.Add(1))
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)

	first := do(t, "POST", s.URL+"/x", `"k-1"`, "{}")
	if first.status != 201 || replayed(first) {
		t.Fatalf("first: %d %v", first.status, first.header)
	}
	for _, spelling := range []string{`  "k-1"`, `"k-1"   `, `"k-1";v=1`, `"k-1";a;b="x";c=?0`, `"k-1" ;a=1`} {
		r := do(t, "POST", s.URL+"/x", spelling, "{}")
		if spelling == `"k-1" ;a=1` {
			// RFC 8941: no space before a parameter's ";": malformed.
			if r.status != 400 {
				t.Errorf("%q: %d %s, want 400", spelling, r.status, r.body)
			}
			continue
		}
		if r.status != 201 || !replayed(r) || r.body != first.body {
			t.Errorf("%q: %d replayed=%v %q, want the replay of %q", spelling, r.status, replayed(r), r.body, first.body)
		}
	}
	before := n.Load()
	// a"b, a\b, a\"b and a\\b: four different keys.
	keys := []string{`"a\"b"`, `"a\\b"`, `"a\\\"b"`, `"a\\\\b"`}
	bodies := map[string]string{}
	for _, k := range keys {
		r := do(t, "POST", s.URL+"/x", k, "{}")
		if r.status != 201 || replayed(r) {
			t.Errorf("%s: %d replayed=%v, want a first run", k, r.status, replayed(r))
		}
		bodies[k] = r.body
	}
	for _, k := range keys {
		if r := do(t, "POST", s.URL+"/x", k, "{}"); !replayed(r) || r.body != bodies[k] {
			t.Errorf("%s again: replayed=%v %q, want %q", k, replayed(r), r.body, bodies[k])
		}
	}
	if got := n.Load() - before; got != int64(len(keys)) {
		t.Errorf("%d runs for %d distinct keys", got, len(keys))
	}
	before = n.Load()
	for _, k := range []string{`"a\b"`, `"a\`, `"a\x41"`, `"a"b"`, `"a", "b"`, `:YWJj:`, `?1`, `"ab"c`} {
		if r := do(t, "POST", s.URL+"/x", k, "{}"); r.status != 400 || problemType(r) != "idempotency-key-malformed" {
			t.Errorf("%s: %d %s, want 400 malformed", k, r.status, r.body)
		}
	}
	if n.Load() != before {
		t.Errorf("a malformed key ran the handler")
	}
}

// TestAdvScopeKeyCollisions: (scope, key) pairs whose naive
// concatenations meet are still distinct keys: each pair runs once.
func TestAdvScopeKeyCollisions(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Client") + "|" + r.Header.Get(httpdedup.HeaderKey)
		fmt.Fprintf(w, "%s %d", k, c.add(k))
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e, Scope: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Client"), nil // "" allowed: the unscoped client
	}}, h)
	pairs := [][2]string{
		{"a", "1:b"}, {"a:1", "b"}, {"a1:", "b"}, {"a", "b:c"}, {"a:b", "c"}, {"ab", "c"}, {"a", "bc"},
		{"", "1:ab"}, {"", "0:x"}, {"1", "0:x"}, {"0:", "x"}, {"", "2:ab"}, {"ab", ""}, {"1:a", "b"},
		{"10", ":aaaaaaaaaa"}, {"", "10:aaaaaaaaaa"},
	}
	for round := range 2 {
		for _, p := range pairs {
			if p[1] == "" {
				continue
			}
			key := strconv.Quote(p[1])
			var hdr []string
			if p[0] != "" {
				hdr = []string{"X-Client", p[0]}
			}
			r := do(t, "POST", s.URL+"/x", key, "{}", hdr...)
			if r.status != 200 || replayed(r) != (round == 1) || !strings.HasPrefix(r.body, p[0]+"|"+key+" ") {
				t.Errorf("round %d scope %q key %q: %d replayed=%v %q", round, p[0], p[1], r.status, replayed(r), r.body)
			}
		}
	}
	for _, p := range pairs {
		if k := p[0] + "|" + strconv.Quote(p[1]); p[1] != "" && c.count(k) != 1 {
			t.Errorf("scope %q key %q ran %d times", p[0], p[1], c.count(k))
		}
	}
}

// TestAdvLongScopeOrKeyIsNotAStoreOutage: a client whose scope is long (a
// bearer token, an API key of 1 KiB) or a key within MaxKeyLength is not
// answered 503 "store unavailable": the store is up. The handler runs once
// or the request is refused as the client's fault (4xx), never "retry
// later" for a request that can never succeed.
func TestAdvLongScopeOrKeyIsNotAStoreOutage(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(r.Header.Get(httpdedup.HeaderKey))
		w.WriteHeader(http.StatusCreated)
	})
	scope := func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
	// A MaxKeyLength the engine's MaxKeySize cannot hold is refused at New,
	// not answered 503 request after request.
	small := openEngine(t, engineOptions(t.TempDir()))
	if _, err := httpdedup.New(&httpdedup.Options{Engine: small, MaxKeyLength: 4096, Scope: scope}); !errors.Is(err, httpdedup.ErrOptions) {
		t.Fatalf("MaxKeyLength 4096 over an engine of MaxKeySize 1024: %v, want ErrOptions", err)
	}
	eo := engineOptions(t.TempDir())
	eo.MaxKeySize = 32 + 4096
	e := openEngine(t, eo)
	s, m := serveWith(t, httpdedup.Options{Engine: e, MaxKeyLength: 4096, Scope: scope}, h)
	token := "Bearer " + strings.Repeat("J", 1100) // a JWT is often this long
	cases := []struct {
		name, key string
		hdr       []string
	}{
		{"1100-byte scope, short key", `"k-1"`, []string{"Authorization", token}},
		{"short scope, 2000-byte key within MaxKeyLength", `"` + strings.Repeat("k", 2000) + `"`, []string{"Authorization", "Bearer x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, "POST", s.URL+"/x", tc.key, "{}", tc.hdr...)
			if r.status == http.StatusServiceUnavailable || r.status >= 500 {
				t.Fatalf("%d %s: the store is up; the request can never succeed and a client retries a 503 (stats %+v)", r.status, r.body, m.Stats())
			}
			if r.status == 201 {
				if again := do(t, "POST", s.URL+"/x", tc.key, "{}", tc.hdr...); !replayed(again) || c.count(tc.key) != 1 {
					t.Fatalf("retry: %d replayed=%v, %d runs", again.status, replayed(again), c.count(tc.key))
				}
			}
		})
	}
}

// TestAdvUnhandledMethodsPassThrough: GET, HEAD and OPTIONS with a key are
// not deduplicated (each runs), nor refused.
func TestAdvUnhandledMethodsPassThrough(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(r.Method)
		w.WriteHeader(http.StatusOK)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	for _, method := range []string{"GET", "HEAD", "OPTIONS"} {
		for range 2 {
			if r := do(t, method, s.URL+"/x", `"same"`, ""); r.status != 200 || replayed(r) {
				t.Errorf("%s: %d replayed=%v", method, r.status, replayed(r))
			}
		}
		if c.count(method) != 2 {
			t.Errorf("%s with a key ran %d times of 2", method, c.count(method))
		}
	}
}

// chunked is a body of unknown length: the client sends it chunked.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestAdvBodyAtMaxBody: a body of exactly MaxBody runs; one byte more is
// 413 and never runs; both with Content-Length and chunked, and the two
// framings of one body are the same request.
func TestAdvBodyAtMaxBody(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.add(r.Header.Get(httpdedup.HeaderKey))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%d bytes, content-length %d", len(b), r.ContentLength)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	const max = 100
	s, _ := serveWith(t, httpdedup.Options{Engine: e, MaxBody: max}, h)
	send := func(key string, n int, framing string) response {
		t.Helper()
		var body io.Reader = strings.NewReader(strings.Repeat("b", n))
		if framing == "chunked" {
			body = chunked{body}
		}
		req, _ := http.NewRequest("POST", s.URL+"/x", body)
		req.Header.Set(httpdedup.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{resp.StatusCode, resp.Header, string(b)}
	}
	for _, framing := range []string{"length", "chunked"} {
		key := `"at-max-` + framing + `"`
		if r := send(key, max, framing); r.status != 201 || r.body != "100 bytes, content-length 100" {
			t.Errorf("%s, %d bytes: %d %q", framing, max, r.status, r.body)
		}
		over := `"over-max-` + framing + `"`
		if r := send(over, max+1, framing); r.status != 413 || problemType(r) != "request-body-too-large" {
			t.Errorf("%s, %d bytes: %d %s, want 413", framing, max+1, r.status, r.body)
		}
		if c.count(over) != 0 {
			t.Errorf("%s: an oversized body ran the handler", framing)
		}
	}
	// The same body, another framing: the same request, replayed.
	if r := send(`"at-max-length"`, max, "chunked"); r.status != 201 || !replayed(r) {
		t.Errorf("the chunked retry of a Content-Length request: %d replayed=%v", r.status, replayed(r))
	}
	if c.count(`"at-max-length"`) != 1 {
		t.Errorf("%d runs", c.count(`"at-max-length"`))
	}
}

// TestAdvStoredSizeBoundary: with MaxResultSize 1024 and no stored headers
// the stored form of a response is 6 bytes plus its body: a body of 1018
// bytes is replayed whole, 1019 (buffered) and 1025 (streamed) are served
// whole, marked Idempotency-Stored: headers, replayed without the body and
// counted in BodiesNotKept.
func TestAdvStoredSizeBoundary(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(r.Header.Get(httpdedup.HeaderKey))
		n, _ := strconv.Atoi(r.URL.Query().Get("size"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), n))
	})
	eo := engineOptions(t.TempDir())
	eo.MaxResultSize = 1024
	e := openEngine(t, eo)
	s, m := serveWith(t, httpdedup.Options{Engine: e, StoredHeaders: []string{}}, h)
	notKept := 0
	for _, size := range []int{0, 1, 1017, 1018, 1019, 1023, 1024, 1025, 5000} {
		key := fmt.Sprintf(`"size-%d"`, size)
		url := fmt.Sprintf("%s/x?size=%d", s.URL, size)
		whole := size+6 <= 1024
		first := do(t, "POST", url, key, "")
		if first.status != 201 || len(first.body) != size || replayed(first) {
			t.Errorf("%d: first %d, %d bytes", size, first.status, len(first.body))
		}
		wantStored := ""
		if !whole {
			wantStored = "headers"
			notKept++
		}
		if got := first.header.Get(httpdedup.HeaderStored); got != wantStored {
			t.Errorf("%d: first Idempotency-Stored %q, want %q", size, got, wantStored)
		}
		again := do(t, "POST", url, key, "")
		wantLen := size
		if !whole {
			wantLen = 0
		}
		if again.status != 201 || !replayed(again) || len(again.body) != wantLen || again.header.Get(httpdedup.HeaderStored) != wantStored {
			t.Errorf("%d: replay %d replayed=%v %d bytes stored=%q; want %d bytes, stored=%q", size, again.status, replayed(again), len(again.body), again.header.Get(httpdedup.HeaderStored), wantLen, wantStored)
		}
		if c.count(key) != 1 {
			t.Errorf("%d: %d runs", size, c.count(key))
		}
	}
	if st := m.Stats(); st.BodiesNotKept != uint64(notKept) || st.NotStored != 0 {
		t.Errorf("stats %+v, want BodiesNotKept %d and NotStored 0", st, notKept)
	}
}

// TestAdvStoredHeadersOverMaxResultSize: a response whose stored headers
// alone outgrow the engine's MaxResultSize (a long Link) is still a known
// outcome: its retry must be a replay (status at least), not 409 for the
// lease and then 500 "outcome unknown" for the whole window, as if the
// request had crashed.
func TestAdvStoredHeadersOverMaxResultSize(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(r.Header.Get(httpdedup.HeaderKey))
		w.Header().Set("Link", "<https://example.com/"+strings.Repeat("l", 3000)+">; rel=next")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	eo := engineOptions(t.TempDir())
	eo.MaxResultSize = 1024
	eo.Lease = 300 * time.Millisecond
	e := openEngine(t, eo)
	s, m := serveWith(t, httpdedup.Options{Engine: e}, h)
	first := do(t, "POST", s.URL+"/x", `"link-1"`, "")
	if first.status != 201 || first.body != "ok" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	time.Sleep(500 * time.Millisecond) // past the lease
	again := do(t, "POST", s.URL+"/x", `"link-1"`, "")
	if c.count(`"link-1"`) != 1 {
		t.Fatalf("the handler ran %d times", c.count(`"link-1"`))
	}
	if again.status != 201 || !replayed(again) {
		t.Fatalf("first Idempotency-Stored %q; the retry of a request that completed 201: %d %s (stats %+v)",
			first.header.Get(httpdedup.HeaderStored), again.status, again.body, m.Stats())
	}
}

// TestAdvPanicAfterFlush: a handler that flushed part of its response and
// then panics must not look to its client like a complete response: plain
// net/http aborts the connection (the client reads an error); behind the
// middleware the client must see the same, not a clean 200 with a
// truncated body that it will never retry.
func TestAdvPanicAfterFlush(t *testing.T) {
	c := &ledger{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(r.Header.Get(httpdedup.HeaderKey))
		w.Header().Set("Content-Type", "text/plain")
		if r.URL.Query().Get("big") != "" {
			_, _ = w.Write(bytes.Repeat([]byte("x"), 2048)) // over keep: streamed
		} else {
			_, _ = io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
		}
		panic("failed after sending part of the response")
	})
	get := func(url, key string) (status int, body string, err error) {
		req, _ := http.NewRequest("POST", url, strings.NewReader("{}"))
		req.Header.Set(httpdedup.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// The control: net/http alone.
	bare := httptest.NewUnstartedServer(h)
	bare.Config.ErrorLog = quiet
	bare.Start()
	defer bare.Close()
	if status, body, err := get(bare.URL+"/x", `"bare"`); err == nil {
		t.Fatalf("control: net/http alone gave a clean %d %q; expected the connection aborted", status, body)
	}
	eo := engineOptions(t.TempDir())
	eo.MaxResultSize = 1024
	e := openEngine(t, eo)
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	s.Config.ErrorLog = quiet
	for _, q := range []string{"", "?big=1"} {
		status, body, err := get(s.URL+"/x"+q, `"flush-panic`+q+`"`)
		if err == nil {
			t.Errorf("%q: the client got a clean %d with %d bytes from a handler that panicked", q, status, len(body))
		}
	}
}

// TestAdvHeadersThenPanic: a handler that set headers, wrote its status and
// part of its body (not flushed) and then panics: the client gets 500
// problem+json and none of the handler's headers or bytes; the claim is
// given back, so the retry runs.
func TestAdvHeadersThenPanic(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := n.Add(1)
		w.Header().Set("X-Leak", "1")
		w.Header().Set("Location", "/leak")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "half")
		if run == 1 {
			panic("after WriteHeader")
		}
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, m := serveWith(t, httpdedup.Options{Engine: e}, h)
	r := do(t, "POST", s.URL+"/x", `"hp-1"`, "")
	if r.status != 500 || problemType(r) != "handler-failed" || r.header.Get("X-Leak") != "" || r.header.Get("Location") != "" || strings.Contains(r.body, "half") {
		t.Fatalf("panic: %d %v %q", r.status, r.header, r.body)
	}
	r = do(t, "POST", s.URL+"/x", `"hp-1"`, "")
	if r.status != 201 || replayed(r) || r.body != "half" || n.Load() != 2 {
		t.Fatalf("retry: %d replayed=%v %q, %d runs", r.status, replayed(r), r.body, n.Load())
	}
	if r = do(t, "POST", s.URL+"/x", `"hp-1"`, ""); !replayed(r) || n.Load() != 2 {
		t.Fatalf("third: replayed=%v, %d runs", replayed(r), n.Load())
	}
	if st := m.Stats(); st.Panics != 1 || st.Released != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAdvAbortHandler: a handler that panics with http.ErrAbortHandler
// aborts the connection (as net/http does), and its claim is given back:
// the retry runs, once.
func TestAdvAbortHandler(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	s.Config.ErrorLog = quiet
	req, _ := http.NewRequest("POST", s.URL+"/x", strings.NewReader("{}"))
	req.Header.Set(httpdedup.HeaderKey, `"abort-1"`)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("an aborted handler answered %d", resp.StatusCode)
	}
	for i := range 2 {
		if r := do(t, "POST", s.URL+"/x", `"abort-1"`, "{}"); r.status != 201 || replayed(r) != (i == 1) {
			t.Fatalf("retry %d: %d replayed=%v", i, r.status, replayed(r))
		}
	}
	if n.Load() != 2 {
		t.Fatalf("%d runs, want 2 (the aborted one and its retry)", n.Load())
	}
}

// TestAdvWriteHeaderTwice: the first status wins, as in net/http: a 201
// then a 500 is a 201, stored and replayed, not given back.
func TestAdvWriteHeaderTwice(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "body")
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	s.Config.ErrorLog = quiet
	for i := range 2 {
		if r := do(t, "POST", s.URL+"/x", `"twice"`, ""); r.status != 201 || r.body != "body" || replayed(r) != (i == 1) {
			t.Fatalf("%d: %d %q replayed=%v", i, r.status, r.body, replayed(r))
		}
	}
	if n.Load() != 1 {
		t.Fatalf("%d runs", n.Load())
	}
}

// TestAdvInformational: a 103 Early Hints goes to the client at once; the
// final 201 is stored and replayed; one run.
func TestAdvInformational(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	var hints atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints && h.Get("Link") != "" {
				hints.Add(1)
			}
			return nil
		},
	})
	for i := range 2 {
		req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/x", nil)
		req.Header.Set(httpdedup.HeaderKey, `"hints-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 || string(b) != "done" || (resp.Header.Get(httpdedup.HeaderReplayed) == "true") != (i == 1) {
			t.Fatalf("%d: %d %q %v", i, resp.StatusCode, b, resp.Header)
		}
	}
	if hints.Load() != 1 || n.Load() != 1 {
		t.Fatalf("%d early hints seen (want 1, from the run), %d runs", hints.Load(), n.Load())
	}
}

// TestAdvNoContentAndNotModified: 204 and 304 are stored and replayed,
// with no body, and their replay is a well-formed response.
func TestAdvNoContentAndNotModified(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		s, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.Header().Set("ETag", `"v1"`)
		w.WriteHeader(s)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	for _, status := range []int{204, 304} {
		key := fmt.Sprintf(`"nc-%d"`, status)
		for i := range 3 {
			r := do(t, "POST", fmt.Sprintf("%s/x?status=%d", s.URL, status), key, "")
			if r.status != status || r.body != "" || replayed(r) != (i > 0) || r.header.Get("ETag") != `"v1"` {
				t.Fatalf("%d, %d: %d %q %v", status, i, r.status, r.body, r.header)
			}
		}
	}
	if n.Load() != 2 {
		t.Fatalf("%d runs for two keys", n.Load())
	}
}

// TestAdvConcurrentDifferentBodies: 16 concurrent requests with one key
// and 16 different bodies: exactly one runs; every other is 409 (in
// progress) or 422 (another request), never a replay of another body's
// response; with Wait every other is 422.
func TestAdvConcurrentDifferentBodies(t *testing.T) {
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			var n atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				n.Add(1)
				time.Sleep(200 * time.Millisecond)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(b)
			})
			e := openEngine(t, engineOptions(t.TempDir()))
			s, _ := serveWith(t, httpdedup.Options{Engine: e, Wait: wait}, h)
			const k = 16
			got := make([]response, k)
			var wg sync.WaitGroup
			for i := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i] = do(t, "POST", s.URL+"/x", `"mix-1"`, fmt.Sprintf(`{"i":%d}`, i))
				}()
			}
			wg.Wait()
			if n.Load() != 1 {
				t.Fatalf("%d runs for one key", n.Load())
			}
			ran := 0
			for i, r := range got {
				switch {
				case r.status == 201 && !replayed(r) && r.body == fmt.Sprintf(`{"i":%d}`, i):
					ran++
				case r.status == 422 && problemType(r) == "idempotency-key-reused":
				case r.status == 409 && wait == 0 && problemType(r) == "request-in-progress":
				default:
					t.Errorf("request %d: %d replayed=%v %q", i, r.status, replayed(r), r.body)
				}
			}
			if ran != 1 {
				t.Fatalf("%d requests ran", ran)
			}
		})
	}
}

// TestAdvWaitFirstFails: with Wait, requests that meet a key in flight
// whose first run fails (500, given back) run it again exactly once between
// them; the others replay that second run.
func TestAdvWaitFirstFails(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := n.Add(1)
		time.Sleep(200 * time.Millisecond)
		if run == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", run)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, m := serveWith(t, httpdedup.Options{Engine: e, Wait: 5 * time.Second}, h)
	first := make(chan response, 1)
	go func() { first <- do(t, "POST", s.URL+"/x", `"wf-1"`, "{}") }()
	time.Sleep(50 * time.Millisecond)
	const k = 8
	got := make([]response, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = do(t, "POST", s.URL+"/x", `"wf-1"`, "{}") }()
	}
	wg.Wait()
	if r := <-first; r.status != 500 {
		t.Fatalf("first: %d", r.status)
	}
	if n.Load() != 2 {
		t.Fatalf("%d runs, want 2 (the failed one and one retry); stats %+v", n.Load(), m.Stats())
	}
	originals, replays := 0, 0
	for _, r := range got {
		switch {
		case r.status == 201 && !replayed(r) && r.body == "run 2":
			originals++
		case r.status == 201 && replayed(r) && r.body == "run 2":
			replays++
		default:
			t.Errorf("waiter: %d replayed=%v %q", r.status, replayed(r), r.body)
		}
	}
	if originals != 1 || replays != k-1 {
		t.Fatalf("%d originals, %d replays", originals, replays)
	}
}

// TestAdvShortLeaseKept: a 500 ms lease and a 3 s handler: the heartbeat
// keeps the claim, so retries meanwhile are 409 and never run it; the
// response is stored. (A beat comes every half lease; a shorter lease
// lost its claim to a scheduling stall of half of it on a loaded machine
// under -race.)
func TestAdvShortLeaseKept(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		time.Sleep(3 * time.Second)
		w.WriteHeader(http.StatusCreated)
	})
	eo := engineOptions(t.TempDir())
	eo.Lease = 500 * time.Millisecond
	e := openEngine(t, eo)
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	done := make(chan response, 1)
	go func() { done <- do(t, "POST", s.URL+"/x", `"lease-1"`, "") }()
	start := time.Now()
	time.Sleep(50 * time.Millisecond)
	for time.Since(start) < 2400*time.Millisecond { // the run lasts 3 s: six leases
		if r := do(t, "POST", s.URL+"/x", `"lease-1"`, ""); r.status != 409 {
			t.Fatalf("retry during the run: %d replayed=%v %v %q, %d runs", r.status, replayed(r), r.header, r.body, n.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := <-done; r.status != 201 || r.header.Get(httpdedup.HeaderStored) != "" {
		t.Fatalf("the run: %d %v", r.status, r.header)
	}
	if r := do(t, "POST", s.URL+"/x", `"lease-1"`, ""); !replayed(r) || n.Load() != 1 {
		t.Fatalf("after: %d replayed=%v, %d runs", r.status, replayed(r), n.Load())
	}
}

// fakeClock is an engine clock that jumps when told.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestAdvLeaseLostCannotStore: a run whose lease ends (the engine's clock
// jumps past it) is not run again by the next request (500, outcome
// unknown), and its own response, when it finally comes, is not stored
// over that: it is served marked Idempotency-Stored: false, and the key
// stays 500.
func TestAdvLeaseLostCannotStore(t *testing.T) {
	var n atomic.Int64
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		started <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "late")
	})
	clock := &fakeClock{}
	eo := engineOptions(t.TempDir())
	eo.Lease = 300 * time.Millisecond
	eo.Clock = clock
	e := openEngine(t, eo)
	s, m := serveWith(t, httpdedup.Options{Engine: e}, h)
	first := make(chan response, 1)
	go func() { first <- do(t, "POST", s.URL+"/x", `"lost-1"`, "") }()
	<-started
	clock.off.Add(int64(10 * time.Second)) // the lease ends, in the engine's time
	r := do(t, "POST", s.URL+"/x", `"lost-1"`, "")
	if r.status != 500 || problemType(r) != "outcome-unknown" {
		t.Fatalf("a retry after the lease ended: %d %s", r.status, r.body)
	}
	time.Sleep(150 * time.Millisecond) // a heartbeat beats
	close(release)
	f := <-first
	if f.status != 201 || f.header.Get(httpdedup.HeaderStored) != "false" {
		t.Fatalf("the run that lost its lease: %d %v", f.status, f.header)
	}
	if r := do(t, "POST", s.URL+"/x", `"lost-1"`, ""); r.status != 500 || replayed(r) && r.body == "late" {
		t.Fatalf("later: %d %v %q", r.status, r.header, r.body)
	}
	if n.Load() != 1 {
		t.Fatalf("%d runs", n.Load())
	}
	if st := m.Stats(); st.NotStored != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAdvEngineClosedMidHandler: the engine closes while a handler runs:
// the handler's response is served marked Idempotency-Stored: false (not
// hung), and the retry is 503 problem+json, not a second run.
func TestAdvEngineClosedMidHandler(t *testing.T) {
	var n atomic.Int64
	var e *engine.Engine
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		done := make(chan error, 1)
		go func() { done <- e.Close() }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			w.WriteHeader(599)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	e = openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e, CommitTimeout: 2 * time.Second}, h)
	r := do(t, "POST", s.URL+"/x", `"closed-1"`, "")
	if r.status != 201 || r.header.Get(httpdedup.HeaderStored) != "false" {
		t.Fatalf("the run: %d %v", r.status, r.header)
	}
	r = do(t, "POST", s.URL+"/x", `"closed-1"`, "")
	if r.status != 503 || problemType(r) != "idempotency-store-unavailable" || n.Load() != 1 {
		t.Fatalf("retry: %d %s, %d runs", r.status, r.body, n.Load())
	}
}

// TestAdvManyRacingKeys: 8 keys, 8 concurrent requests each, with a
// handler that fails (500) or panics on some first runs: every key runs
// to one success at most once, and every 201 a client sees for a key is
// the same response.
func TestAdvManyRacingKeys(t *testing.T) {
	c := &ledger{}
	var successes sync.Map
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(httpdedup.HeaderKey)
		run := c.add(key)
		time.Sleep(20 * time.Millisecond)
		switch {
		case run == 1 && strings.Contains(key, "fail"):
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case run == 1 && strings.Contains(key, "panic"):
			panic("first run")
		}
		if _, dup := successes.LoadOrStore(key, run); dup {
			t.Errorf("%s succeeded twice", key)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%s run %d", key, run)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e, Wait: 3 * time.Second}, h)
	s.Config.ErrorLog = quiet
	keys := []string{`"ok-1"`, `"ok-2"`, `"fail-1"`, `"fail-2"`, `"panic-1"`, `"panic-2"`, `"ok-3"`, `"fail-3"`}
	var mu sync.Mutex
	bodies := map[string]map[string]bool{}
	var wg sync.WaitGroup
	for _, key := range keys {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := do(t, "POST", s.URL+"/x", key, "{}")
				if r.status == 201 {
					mu.Lock()
					if bodies[key] == nil {
						bodies[key] = map[string]bool{}
					}
					bodies[key][r.body] = true
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, key := range keys {
		if len(bodies[key]) > 1 {
			t.Errorf("%s: clients saw %d different successes: %v", key, len(bodies[key]), bodies[key])
		}
		max := 1
		if !strings.HasPrefix(key, `"ok`) {
			max = 2
		}
		if c.count(key) > max {
			t.Errorf("%s ran %d times, at most %d", key, c.count(key), max)
		}
	}
}

// TestAdvTransportBodyWithoutGetBody: a request whose body has no GetBody
// (a plain reader) is sent whole on every attempt, under one key.
func TestAdvTransportBodyWithoutGetBody(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get(httpdedup.HeaderKey)+" "+string(b))
		n := len(seen)
		mu.Unlock()
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer s.Close()
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: time.Millisecond}}
	req, _ := http.NewRequest("POST", s.URL, chunked{strings.NewReader("payload-1")})
	if req.GetBody != nil {
		t.Fatal("the request has GetBody")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || len(seen) != 3 {
		t.Fatalf("%d after %d attempts", resp.StatusCode, len(seen))
	}
	for _, s := range seen {
		if s != seen[0] || !strings.HasSuffix(s, " payload-1") || strings.HasPrefix(s, " ") {
			t.Fatalf("attempts %q: want one key and the whole body each time", seen)
		}
	}
}

// TestAdvTransportRetryAfterDate: a Retry-After given as an HTTP date is
// honoured; one past MaxRetryAfter returns the response at once.
func TestAdvTransportRetryAfterDate(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		n := len(at)
		mu.Unlock()
		if r.URL.Path == "/far" {
			w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if n == 1 {
			w.Header().Set("Retry-After", time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer s.Close()
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: time.Millisecond}}
	resp, err := client.Post(s.URL+"/x", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || len(at) != 2 {
		t.Fatalf("%d after %d attempts", resp.StatusCode, len(at))
	}
	// A date has whole seconds: now+2s is 1 to 2 s away.
	if d := at[1].Sub(at[0]); d < 900*time.Millisecond {
		t.Fatalf("retried after %v, before the Retry-After date", d)
	}
	at = nil
	start := time.Now()
	resp, err = client.Post(s.URL+"/far", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || len(at) != 1 || time.Since(start) > time.Second {
		t.Fatalf("far Retry-After: %d after %d attempts, %v", resp.StatusCode, len(at), time.Since(start))
	}
}

// TestAdvTransportKeySpelling: a key from NewKey with a quote and a
// backslash is sent as a valid sf-string: the server reads the same key on
// every attempt and runs once.
func TestAdvTransportKeySpelling(t *testing.T) {
	var n atomic.Int64
	var busy atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if busy.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // before the middleware: not run
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	m, err := httpdedup.New(&httpdedup.Options{Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1); w.WriteHeader(http.StatusCreated) }))
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if busy.Load() == 0 {
			h.ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer s.Close()
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: time.Millisecond, NewKey: func() string { return `a"b\c d` }}}
	for i := range 2 {
		resp, err := client.Post(s.URL+"/x", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || (resp.Header.Get(httpdedup.HeaderReplayed) == "true") != (i == 1) {
			t.Fatalf("%d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
	if n.Load() != 1 {
		t.Fatalf("%d runs", n.Load())
	}
}

// TestAdvTransportReplayIsFinal: a response replayed by the middleware
// (Idempotent-Replayed: true) is the first request's final answer: every
// retry with the key gets it again. A handler's own 409 (a business
// conflict) is stored and replayed; the Transport must not spend its
// attempts and backoff re-fetching that replay.
func TestAdvTransportReplayIsFinal(t *testing.T) {
	var n, attempts atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":"the seat is taken"}`)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	m, err := httpdedup.New(&httpdedup.Options{Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inner := m.Handler(h)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		inner.ServeHTTP(w, r)
	}))
	defer s.Close()
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: 50 * time.Millisecond, MaxAttempts: 5}}
	resp, err := client.Post(s.URL+"/seats", "application/json", strings.NewReader(`{"seat":"1A"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 409 || n.Load() != 1 {
		t.Fatalf("%d, %d runs", resp.StatusCode, n.Load())
	}
	if attempts.Load() > 2 {
		t.Fatalf("%d attempts: the Transport kept re-fetching a stored 409 (replayed=%q)", attempts.Load(), resp.Header.Get(httpdedup.HeaderReplayed))
	}
}

// TestAdvClientDisconnectsMidBody: a client that sends half its body and
// disconnects never runs the handler, and the key stays free: the full
// request then runs once.
func TestAdvClientDisconnectsMidBody(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	// A raw connection: headers announce 1000 bytes, 10 are sent.
	conn, err := (&net.Dialer{}).Dial("tcp", s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"half-1\"\r\nContent-Length: 1000\r\n\r\n0123456789")
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	time.Sleep(100 * time.Millisecond)
	if n.Load() != 0 {
		t.Fatalf("a half-sent request ran the handler")
	}
	if r := do(t, "POST", s.URL+"/x", `"half-1"`, strings.Repeat("b", 1000)); r.status != 201 || replayed(r) || n.Load() != 1 {
		t.Fatalf("the whole request: %d replayed=%v, %d runs", r.status, replayed(r), n.Load())
	}
}

// TestAdvHijackIsNotReplayedAsSomethingElse: a handler that takes the
// connection over (http.ResponseController.Hijack reaches the client's
// writer through the recorder's Unwrap) answers on it itself: the
// middleware never saw that response, so it must not store and replay a
// response the client never got (an empty 200). Either Hijack is refused
// for a keyed request, or the replay is what the client saw.
func TestAdvHijackIsNotReplayedAsSomethingElse(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "hijacked")
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		_ = buf.Flush()
		_ = conn.Close()
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	s.Config.ErrorLog = quiet
	first := do(t, "POST", s.URL+"/x", `"hijack-1"`, "")
	again := do(t, "POST", s.URL+"/x", `"hijack-1"`, "")
	if first.status != 202 || first.body != "hijacked" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	if n.Load() != 1 || again.status != first.status || again.body != first.body {
		t.Fatalf("the client saw %d %q; its retry got %d %q (replayed=%v), %d runs", first.status, first.body, again.status, again.body, replayed(again), n.Load())
	}
}

// TestAdvReopenAfterCloseMidHandler: the engine closes while a handler
// runs (its response cannot be stored), and the process starts again on
// the same directory: the abandoned claim is counted (DurableClaims), so
// the retry is 500 outcome unknown, never a second run.
func TestAdvReopenAfterCloseMidHandler(t *testing.T) {
	var n atomic.Int64
	dir := t.TempDir()
	var e *engine.Engine
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_ = e.Close()
		w.WriteHeader(http.StatusCreated)
	})
	o := engineOptions(dir)
	var err error
	if e, err = engine.Open(&o); err != nil {
		t.Fatal(err)
	}
	s, _ := serveWith(t, httpdedup.Options{Engine: e, CommitTimeout: 2 * time.Second}, h)
	if r := do(t, "POST", s.URL+"/x", `"reopen-1"`, ""); r.status != 201 || r.header.Get(httpdedup.HeaderStored) != "false" {
		t.Fatalf("the run: %d %v", r.status, r.header)
	}
	s.Close()
	e2 := openEngine(t, engineOptions(dir))
	s2, _ := serveWith(t, httpdedup.Options{Engine: e2}, h)
	for range 2 {
		if r := do(t, "POST", s2.URL+"/x", `"reopen-1"`, ""); r.status != 500 || problemType(r) != "outcome-unknown" || n.Load() != 1 {
			t.Fatalf("retry after the restart: %d %s, %d runs", r.status, r.body, n.Load())
		}
	}
}

// TestAdvManyStoredHeaderValues: a response with more than 65535 values of
// stored headers (each small, the whole under MaxResultSize) is replayed
// as it was sent, or not kept (Idempotency-Stored), never replayed with
// other headers or a body made of header bytes.
func TestAdvManyStoredHeaderValues(t *testing.T) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		vs := make([]string, 70000)
		for i := range vs {
			vs[i] = "a"
		}
		w.Header()["Link"] = vs
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "body")
	})
	eo := engineOptions(t.TempDir())
	eo.MaxResultSize = 2 << 20
	e := openEngine(t, eo)
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, h)
	first := do(t, "POST", s.URL+"/x", `"links-1"`, "")
	again := do(t, "POST", s.URL+"/x", `"links-1"`, "")
	if first.status != 201 || first.body != "body" || len(first.header.Values("Link")) != 70000 {
		t.Fatalf("first: %d %q, %d Link values", first.status, first.body, len(first.header.Values("Link")))
	}
	if n.Load() != 1 || again.status != 201 || !replayed(again) {
		t.Fatalf("retry: %d replayed=%v, %d runs", again.status, replayed(again), n.Load())
	}
	if again.header.Get(httpdedup.HeaderStored) == "" && (again.body != "body" || len(again.header.Values("Link")) != 70000) {
		t.Fatalf("the replay differs from the response: %d bytes of body (want %q), %d Link values (want 70000)", len(again.body), "body", len(again.header.Values("Link")))
	}
}

// TestAdvTransportFollowsRedirect: a keyed POST answered 308 (the resource
// moved) is followed by http.Client with the same method and body: the
// caller must get the new resource's answer, once, not 422 because the
// client sent the first request's key to another path.
func TestAdvTransportFollowsRedirect(t *testing.T) {
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/v2/orders", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("/v2/orders", func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	e := openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e}, mux)
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: time.Millisecond}}
	resp, err := client.Post(s.URL+"/orders", "application/json", strings.NewReader(`{"sku":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || n.Load() != 1 {
		t.Fatalf("%d %s, %d runs of the moved resource", resp.StatusCode, b, n.Load())
	}
}
