package httpdedup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

// engineOptions is an embedded store in dir as the middleware needs it.
func engineOptions(dir string) engine.Options {
	return engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 10_000, MaxAttempts: 1, DurableClaims: true,
		MaxResultSize: 64 << 10, Logger: quietEngine}
}

func openEngine(t *testing.T, o engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// ledger records every execution of the handler by key, the effect a
// repeat would show in.
type ledger struct {
	mu   sync.Mutex
	runs map[string]int
}

func (l *ledger) add(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs = map[string]int{}
	}
	l.runs[key]++
	return l.runs[key]
}

func (l *ledger) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[key]
}

// orders is the API under test: POST /orders records an execution in the
// ledger and answers 201 with the order; ?status=N answers N instead,
// ?sleep=D sleeps first, ?size=N answers an N-byte body, ?panic=1 panics.
func orders(l *ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := l.add(r.Header.Get(httpdedup.HeaderKey))
		q := r.URL.Query()
		if d, err := time.ParseDuration(q.Get("sleep")); err == nil {
			time.Sleep(d)
		}
		if q.Get("panic") != "" {
			panic("handler bug")
		}
		if q.Get("unknown") != "" {
			httpdedup.Unknown(r) // as a proxy whose upstream connection broke
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+strconv.Itoa(n))
		w.Header().Set("X-Not-Stored", "1")
		status := http.StatusCreated
		if s, err := strconv.Atoi(q.Get("status")); err == nil {
			status = s
		}
		w.WriteHeader(status)
		if size, err := strconv.Atoi(q.Get("size")); err == nil {
			_, _ = w.Write(bytes.Repeat([]byte("x"), size))
			return
		}
		fmt.Fprintf(w, `{"order":%d,"request":%q}`, n, body)
	})
}

// server serves orders behind a middleware over e.
func server(t *testing.T, o httpdedup.Options, l *ledger) (*httptest.Server, *httpdedup.Middleware) {
	t.Helper()
	return serveWith(t, o, orders(l))
}

// serveWith serves h behind a middleware with options o.
func serveWith(t *testing.T, o httpdedup.Options, h http.Handler) (*httptest.Server, *httpdedup.Middleware) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	m, err := httpdedup.New(&o)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(m.Handler(h))
	t.Cleanup(s.Close)
	return s, m
}

// response is what a client got.
type response struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, method, url, key, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(httpdedup.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

// problemType returns the problem+json type of r ("" if r is not one).
func problemType(r response) string {
	if r.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	if json.Unmarshal([]byte(r.body), &p) != nil {
		return "unparsable"
	}
	return p.Type[strings.LastIndexByte(p.Type, '#')+1:]
}

// TestConcurrentRetriesRunOnce: 64 concurrent requests with one key run the
// handler once; with Wait every one gets its response (63 replays, marked);
// without it the others get 409 or the replay. The same requests with the
// middleware bypassed run 64 times: the ledger sees repeats.
func TestConcurrentRetriesRunOnce(t *testing.T) {
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			l := &ledger{}
			e := openEngine(t, engineOptions(t.TempDir()))
			s, m := server(t, httpdedup.Options{Engine: e, Wait: wait}, l)
			const n = 64
			got := make([]response, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i] = do(t, "POST", s.URL+"/orders?sleep=200ms", `"order-7"`, `{"sku":"a"}`)
				}()
			}
			wg.Wait()
			if runs := l.count(`"order-7"`); runs != 1 {
				t.Fatalf("the handler ran %d times for one key, want 1", runs)
			}
			originals, replays, busy := 0, 0, 0
			var first string
			for _, r := range got {
				switch {
				case r.status == http.StatusCreated && r.header.Get(httpdedup.HeaderReplayed) == "":
					originals++
					first = r.body
				case r.status == http.StatusCreated:
					replays++
					if r.header.Get("Location") != "/orders/1" || r.header.Get("X-Not-Stored") != "" {
						t.Errorf("replay headers %v: want the stored Location and not X-Not-Stored", r.header)
					}
				case r.status == http.StatusConflict && problemType(r) == "request-in-progress" && r.header.Get("Retry-After") != "":
					busy++
				default:
					t.Errorf("unexpected response %d %v %s", r.status, r.header, r.body)
				}
			}
			for _, r := range got {
				if r.status == http.StatusCreated && r.body != first {
					t.Errorf("a replay's body %q differs from the original's %q", r.body, first)
				}
			}
			if originals != 1 || (wait > 0 && replays != n-1) {
				t.Fatalf("%d originals, %d replays, %d 409s; want 1 original and, with Wait, %d replays", originals, replays, busy, n-1)
			}
			t.Logf("%d originals, %d replays, %d 409s; stats %+v", originals, replays, busy, m.Stats())
			// Once it completed, every retry is a replay.
			if r := do(t, "POST", s.URL+"/orders?sleep=200ms", `"order-7"`, `{"sku":"a"}`); r.status != http.StatusCreated || r.header.Get(httpdedup.HeaderReplayed) != "true" || r.body != first {
				t.Fatalf("a later retry: %d %v %q", r.status, r.header, r.body)
			}
		})
	}
	// The control: without the middleware, the ledger counts every run.
	l := &ledger{}
	s := httptest.NewServer(orders(l))
	defer s.Close()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); do(t, "POST", s.URL+"/orders", `"order-7"`, `{"sku":"a"}`) }()
	}
	wg.Wait()
	if runs := l.count(`"order-7"`); runs != 64 {
		t.Fatalf("bypassed: %d runs of 64 requests; the ledger must see every repeat", runs)
	}
}

// TestDraftConformance goes through the draft's requirements and this
// package's policy, one row each (docs/idempotency.md lists them).
func TestDraftConformance(t *testing.T) {
	l := &ledger{}
	dir := t.TempDir()
	eo := engineOptions(dir)
	eo.Lease = 600 * time.Millisecond
	e := openEngine(t, eo)
	s, _ := server(t, httpdedup.Options{Engine: e, MaxBody: 1 << 10,
		Scope: func(r *http.Request) (string, error) {
			if c := r.Header.Get("X-Client"); c != "" {
				return c, nil
			}
			return "", errors.New("no X-Client header")
		}}, l)
	url := s.URL + "/orders"
	client := []string{"X-Client", "alice"}
	post := func(key, body string, query ...string) response {
		t.Helper()
		return do(t, "POST", url+strings.Join(query, ""), key, body, client...)
	}
	runs := func(key string) int { return l.count(key) }

	t.Run("missing key on POST: 400", func(t *testing.T) {
		if r := post("", "{}"); r.status != 400 || problemType(r) != "idempotency-key-missing" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if runs("") != 0 {
			t.Fatal("the handler ran")
		}
	})
	t.Run("key not required on PUT: passes", func(t *testing.T) {
		if r := do(t, "PUT", url, "", "{}", client...); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("GET with a key: passes, not deduplicated", func(t *testing.T) {
		before := runs(`"get-1"`)
		do(t, "GET", url, `"get-1"`, "", client...)
		do(t, "GET", url, `"get-1"`, "", client...)
		if runs(`"get-1"`) != before+2 {
			t.Fatal("a GET was deduplicated")
		}
	})
	for name, key := range map[string]string{
		"a token, not a string": `abc`, "an integer": `42`, "unterminated": `"abc`, "empty": `""`,
		"too long": `"` + strings.Repeat("k", 256) + `"`, "not ASCII": "\"caf\u00e9\"",
	} {
		t.Run("malformed key ("+name+"): 400", func(t *testing.T) {
			if r := post(key, "{}"); r.status != 400 || problemType(r) != "idempotency-key-malformed" || !strings.Contains(r.body, "idempotency_window") {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if runs(key) != 0 {
				t.Fatal("the handler ran")
			}
		})
	}
	t.Run("two key lines: 400", func(t *testing.T) {
		if r := do(t, "POST", url, `"a"`, "{}", append(client, httpdedup.HeaderKey, `"b"`)...); r.status != 400 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("key with parameters: accepted, parameters ignored", func(t *testing.T) {
		if r := post(`"p-1";v=1`, "{}"); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("replay: same status, stored headers, body, marker", func(t *testing.T) {
		first := post(`"r-1"`, `{"a":1}`)
		again := post(`"r-1"`, `{"a":1}`)
		if first.status != 201 || first.header.Get(httpdedup.HeaderReplayed) != "" {
			t.Fatalf("first: %d %v", first.status, first.header)
		}
		if again.status != 201 || again.body != first.body || again.header.Get("Location") != first.header.Get("Location") ||
			again.header.Get("Content-Type") != "application/json" || again.header.Get(httpdedup.HeaderReplayed) != "true" {
			t.Fatalf("replay: %d %v %q; first %q", again.status, again.header, again.body, first.body)
		}
		if runs(`"r-1"`) != 1 {
			t.Fatalf("%d runs", runs(`"r-1"`))
		}
	})
	t.Run("same key, another body: 422", func(t *testing.T) {
		post(`"c-1"`, `{"a":1}`)
		if r := post(`"c-1"`, `{"a":2}`); r.status != 422 || problemType(r) != "idempotency-key-reused" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if r := post(`"c-1"`, `{"a":1}`, "?x=1"); r.status != 422 {
			t.Fatalf("another query: %d", r.status)
		}
		if runs(`"c-1"`) != 1 {
			t.Fatalf("%d runs", runs(`"c-1"`))
		}
	})
	t.Run("in progress: 409 with Retry-After; the lease kept past its length", func(t *testing.T) {
		done := make(chan response)
		go func() { done <- post(`"slow-1"`, "{}", "?sleep=2s") }() // over three leases
		time.Sleep(300 * time.Millisecond)
		for range 3 {
			if r := post(`"slow-1"`, "{}", "?sleep=2s"); r.status != 409 || r.header.Get("Retry-After") != "1" {
				t.Fatalf("%d %v %s", r.status, r.header, r.body)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if r := <-done; r.status != 201 || r.header.Get(httpdedup.HeaderStored) != "" {
			t.Fatalf("the slow request: %d %v %s", r.status, r.header, r.body)
		}
		if r := post(`"slow-1"`, "{}", "?sleep=2s"); r.header.Get(httpdedup.HeaderReplayed) != "true" {
			t.Fatalf("after it: %d %v", r.status, r.header)
		}
		if runs(`"slow-1"`) != 1 {
			t.Fatalf("%d runs", runs(`"slow-1"`))
		}
	})
	t.Run("4xx stored and replayed", func(t *testing.T) {
		post(`"e-400"`, "{}", "?status=400")
		if r := post(`"e-400"`, "{}", "?status=400"); r.status != 400 || r.header.Get(httpdedup.HeaderReplayed) != "true" || runs(`"e-400"`) != 1 {
			t.Fatalf("%d %v, %d runs", r.status, r.header, runs(`"e-400"`))
		}
	})
	for _, status := range []int{500, 503, 429, 408} {
		t.Run(fmt.Sprintf("%d not stored: the retry runs again", status), func(t *testing.T) {
			key := fmt.Sprintf(`"e-%d"`, status)
			post(key, "{}", "?status="+strconv.Itoa(status))
			r := post(key, "{}")
			if r.status != 201 || r.header.Get(httpdedup.HeaderReplayed) != "" || runs(key) != 2 {
				t.Fatalf("retry: %d %v, %d runs", r.status, r.header, runs(key))
			}
		})
	}
	t.Run("panic: 500, the retry runs again", func(t *testing.T) {
		if r := post(`"panic-1"`, "{}", "?panic=1"); r.status != 500 || problemType(r) != "handler-failed" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if r := post(`"panic-1"`, "{}"); r.status != 201 || runs(`"panic-1"`) != 2 {
			t.Fatalf("retry: %d, %d runs", r.status, runs(`"panic-1"`))
		}
	})
	t.Run("outcome unknown (Unknown): retries answered 500, never run", func(t *testing.T) {
		if r := post(`"unknown-1"`, "{}", "?unknown=1"); r.status != 502 {
			t.Fatalf("first: %d %s", r.status, r.body)
		}
		for range 2 {
			if r := post(`"unknown-1"`, "{}", "?unknown=1"); r.status != 500 || problemType(r) != "outcome-unknown" || r.header.Get(httpdedup.HeaderReplayed) != "true" {
				t.Fatalf("retry: %d %v %s", r.status, r.header, r.body)
			}
		}
		if runs(`"unknown-1"`) != 1 {
			t.Fatalf("%d runs", runs(`"unknown-1"`))
		}
	})
	t.Run("response over MaxResultSize: served whole, replayed without body", func(t *testing.T) {
		r := post(`"big-1"`, "{}", "?size=200000")
		if r.status != 201 || len(r.body) != 200000 || r.header.Get(httpdedup.HeaderStored) != "headers" {
			t.Fatalf("%d, %d bytes, %v", r.status, len(r.body), r.header)
		}
		again := post(`"big-1"`, "{}", "?size=200000")
		if again.status != 201 || again.body != "" || again.header.Get(httpdedup.HeaderStored) != "headers" || again.header.Get(httpdedup.HeaderReplayed) != "true" || runs(`"big-1"`) != 1 {
			t.Fatalf("replay: %d, %d bytes, %v, %d runs", again.status, len(again.body), again.header, runs(`"big-1"`))
		}
	})
	t.Run("body over MaxBody: 413", func(t *testing.T) {
		if r := post(`"huge-1"`, strings.Repeat("b", 2<<10)); r.status != 413 || runs(`"huge-1"`) != 0 {
			t.Fatalf("%d, %d runs", r.status, runs(`"huge-1"`))
		}
	})
	t.Run("keys scoped per client", func(t *testing.T) {
		a := do(t, "POST", url, `"s-1"`, "{}", "X-Client", "alice")
		b := do(t, "POST", url, `"s-1"`, "{}", "X-Client", "bob")
		if a.status != 201 || b.status != 201 || b.header.Get(httpdedup.HeaderReplayed) != "" || runs(`"s-1"`) != 2 {
			t.Fatalf("alice %d, bob %d %v, %d runs", a.status, b.status, b.header, runs(`"s-1"`))
		}
		if r := do(t, "POST", url, `"s-1"`, "{}"); r.status != 403 {
			t.Fatalf("no client: %d", r.status)
		}
	})
	t.Run("store unavailable: 503, not run", func(t *testing.T) {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if r := post(`"down-1"`, "{}"); r.status != 503 || problemType(r) != "idempotency-store-unavailable" || r.header.Get("Retry-After") == "" || runs(`"down-1"`) != 0 {
			t.Fatalf("%d %s, %d runs", r.status, r.body, runs(`"down-1"`))
		}
	})
}

// TestRefusesEnginesThatRunTwice: every engine configuration under which a
// request could run twice is refused with ErrOptions.
func TestRefusesEnginesThatRunTwice(t *testing.T) {
	good := engineOptions("")
	for name, change := range map[string]func(o *engine.Options){
		"no DurableClaims": func(o *engine.Options) { o.DurableClaims = false },
		"MaxAttempts 3":    func(o *engine.Options) { o.MaxAttempts = 3 },
		"memory-only":      func(o *engine.Options) { o.Tiers, o.Backend, o.DurableClaims = engine.MemoryOnly, nil, false },
		"bloom-only": func(o *engine.Options) {
			o.Tiers, o.Backend, o.DurableClaims = engine.BloomOnly, &embedded.Backend{}, false
		},
		"MaxAttempts 0":     func(o *engine.Options) { o.MaxAttempts, o.DurableClaims = 0, false },
		"no ConflictStatus": nil,
	} {
		t.Run(name, func(t *testing.T) {
			o := good
			o.Backend = embedded.Dir(t.TempDir())
			var mo httpdedup.Options
			if change != nil {
				change(&o)
			} else {
				mo.ConflictStatus = 200
			}
			if o.Tiers == engine.MemoryOnly {
				o.Backend = nil
			}
			e := openEngine(t, o)
			mo.Engine = e
			if _, err := httpdedup.New(&mo); !errors.Is(err, httpdedup.ErrOptions) {
				t.Fatalf("%v, want ErrOptions", err)
			}
		})
	}
	if _, err := httpdedup.New(&httpdedup.Options{}); !errors.Is(err, httpdedup.ErrOptions) {
		t.Fatalf("no engine: %v", err)
	}
}

// TestClientLeavesMidRequest: a client that disconnects while the handler
// runs does not stop it: the response is stored and replayed to the retry,
// and the handler ran once.
func TestClientLeavesMidRequest(t *testing.T) {
	l := &ledger{}
	e := openEngine(t, engineOptions(t.TempDir()))
	s, m := server(t, httpdedup.Options{Engine: e}, l)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/orders?sleep=1s", strings.NewReader("{}"))
	req.Header.Set(httpdedup.HeaderKey, `"gone-1"`)
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v, want the client's deadline", err)
	}
	// Retries while the handler still runs are 409; the first other
	// answer must be the stored response.
	var r response
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r = do(t, "POST", s.URL+"/orders?sleep=1s", `"gone-1"`, "{}"); r.status != 409 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request was still running after 10 s")
		}
	}
	if r.status != 201 || r.header.Get(httpdedup.HeaderReplayed) != "true" || l.count(`"gone-1"`) != 1 {
		t.Fatalf("retry: %d %v, %d runs; stats %+v", r.status, r.header, l.count(`"gone-1"`), m.Stats())
	}
}

// TestRedisDownIs503: behind Redis, a request whose key cannot be claimed
// because Redis is down or paused is answered 503 (problem+json, with
// Retry-After) within CommitTimeout, and its handler does not run; once
// Redis is back, the retry runs it once.
func TestRedisDownIs503(t *testing.T) {
	l := &ledger{}
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := openEngine(t, engine.Options{MaxAttempts: 1, Logger: quietEngine,
		Backend: redis.NewBackend(c, redis.Config{Prefix: fmt.Sprintf("down-%d:", time.Now().UnixNano())})})
	s, _ := server(t, httpdedup.Options{Engine: e, CommitTimeout: time.Second}, l)
	if r := do(t, "POST", s.URL+"/orders", `"up-1"`, "{}"); r.status != 201 {
		t.Fatalf("Redis up: %d %s", r.status, r.body)
	}
	for name, down := range map[string]func(){"paused": srv.Pause, "killed": srv.Kill} {
		down()
		start := time.Now()
		r := do(t, "POST", s.URL+"/orders", `"down-1"`, "{}")
		if r.status != 503 || problemType(r) != "idempotency-store-unavailable" || r.header.Get("Retry-After") == "" || l.count(`"down-1"`) != 0 {
			t.Fatalf("Redis %s: %d %v %s, %d runs", name, r.status, r.header, r.body, l.count(`"down-1"`))
		}
		if took := time.Since(start); took > 2500*time.Millisecond {
			t.Fatalf("Redis %s: answered after %v, want within CommitTimeout", name, took)
		}
		if name == "paused" {
			srv.Resume()
		} else {
			srv.Restart()
		}
	}
	var r response
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = do(t, "POST", s.URL+"/orders", `"down-1"`, "{}"); r.status != 503 {
			break
		}
	}
	if r.status != 201 || l.count(`"down-1"`) != 1 {
		t.Fatalf("Redis back: %d %s, %d runs", r.status, r.body, l.count(`"down-1"`))
	}
}

// TestWindowsAdvertised: the 400 and 422 bodies publish the namespace's
// window and, with an archive, how long the archive keeps keys beyond it.
func TestWindowsAdvertised(t *testing.T) {
	o := engineOptions(t.TempDir())
	o.Window, o.Partition = 48*time.Hour, 24*time.Hour
	o.Namespaces = map[string]engine.NamespaceOptions{"short": {Window: time.Hour}}
	o.Archive, o.ArchiveWindow = pebble.ArchiveDir{Dir: t.TempDir()}, 30*24*time.Hour
	e := openEngine(t, o)
	for ns, want := range map[string][]string{
		"http":  {`"idempotency_window":"48h0m0s"`, `"idempotency_archive_window":"720h0m0s"`},
		"short": {`"idempotency_window":"1h0m0s"`},
	} {
		s, _ := server(t, httpdedup.Options{Engine: e, Namespace: ns}, &ledger{})
		r := do(t, "POST", s.URL+"/orders", "", "{}")
		for _, w := range want {
			if !strings.Contains(r.body, w) {
				t.Errorf("namespace %s: %s lacks %s", ns, r.body, w)
			}
		}
		if ns == "short" && strings.Contains(r.body, "archive") {
			t.Errorf("namespace %s (a window of its own, never archived): %s", ns, r.body)
		}
	}
}
