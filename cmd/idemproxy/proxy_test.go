package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/integrations/httpdedup"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// The end-to-end tests run the proxy as a child process (this test binary,
// re-executed), in front of an upstream API in the test process whose
// ledger records every execution by key: a repeat is there to see.

func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{"proxy": proxyChild})
}

// proxyChild runs the proxy with the flags of its spec (a JSON array),
// prints "READY proxy-address admin-address" once it serves, and stops on
// SIGTERM.
func proxyChild(spec string) int {
	var args []string
	if err := json.Unmarshal([]byte(spec), &args); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := run(ctx, args, os.Stderr, func(proxy, admin string) { fmt.Println("READY", proxy, admin) })
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("STOPPED")
	return 0
}

// upstream is the API behind the proxy: POST /orders records the request's
// key in the ledger and answers 201 with the order's number; ?sleep=D
// sleeps first; ?block=1 waits until release is closed.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	ledger  map[string]int
	arrived chan string
	release chan struct{}
}

func startUpstream(t *testing.T) *upstream {
	u := &upstream{ledger: map[string]int{}, arrived: make(chan string, 16), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get(httpdedup.HeaderKey)
		u.mu.Lock()
		u.ledger[key]++
		n := len(u.ledger)
		u.mu.Unlock()
		select {
		case u.arrived <- key:
		default:
		}
		if d, err := time.ParseDuration(r.URL.Query().Get("sleep")); err == nil {
			time.Sleep(d)
		}
		if r.URL.Query().Get("block") != "" {
			<-u.release
		}
		if r.URL.Query().Get("break") != "" {
			// It ran, and its response breaks off after ten bytes.
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("0123456789"))
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"body":%q}`, n, body)
	}))
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
		u.Close()
	})
	return u
}

func (u *upstream) runs(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.ledger[key]
}

// proxy is a running proxy child.
type proxy struct {
	child      *crashtest.Child
	url, admin string
}

func startProxy(t *testing.T, args ...string) *proxy {
	t.Helper()
	spec, _ := json.Marshal(append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...))
	c := crashtest.Start(t, "proxy", string(spec), &crashtest.Options{Timeout: 3 * time.Minute})
	for {
		line, ok := c.Next()
		if !ok {
			t.Fatalf("proxy ended before serving\n%s", c.Describe())
		}
		if f := strings.Fields(line); len(f) == 3 && f[0] == "READY" {
			return &proxy{child: c, url: "http://" + f[1], admin: "http://" + f[2]}
		}
		if strings.HasPrefix(line, "ERR") {
			t.Fatalf("proxy: %s", line)
		}
	}
}

type response struct {
	status int
	header http.Header
	body   string
	err    error
}

func post(url, key, body string) response {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if key != "" {
		req.Header.Set(httpdedup.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// concurrentRetries sends n copies of one request at once, the i-th
// through urls[i%len(urls)], and checks one execution: one response not
// replayed, every other a replay of it (with -wait) or a 409.
func concurrentRetries(t *testing.T, u *upstream, urls []string, key string, n int) {
	t.Helper()
	got := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = post(urls[i%len(urls)]+"/orders?sleep=300ms", key, `{"sku":"a"}`)
		}()
	}
	wg.Wait()
	if runs := u.runs(key); runs != 1 {
		t.Fatalf("%d concurrent retries ran the upstream %d times, want 1", n, runs)
	}
	originals, replays, busy := 0, 0, 0
	first := ""
	for _, r := range got {
		switch {
		case r.err != nil:
			t.Errorf("request failed: %v", r.err)
		case r.status == 201 && r.header.Get(httpdedup.HeaderReplayed) == "":
			originals++
			first = r.body
		case r.status == 201 && r.header.Get(httpdedup.HeaderReplayed) == "true":
			replays++
		case r.status == 409:
			busy++
		default:
			t.Errorf("unexpected %d %v %s", r.status, r.header, r.body)
		}
	}
	for _, r := range got {
		if r.status == 201 && r.body != first {
			t.Errorf("a replay %q differs from the original %q", r.body, first)
		}
	}
	if originals != 1 || replays == 0 {
		t.Fatalf("%d originals, %d replays, %d 409s; want one original and replays", originals, replays, busy)
	}
	t.Logf("%d retries over %d proxies: 1 upstream run, %d replays, %d 409s", n, len(urls), replays, busy)
}

// TestProxyEndToEnd: the embedded store. 64 concurrent retries of one key
// run the upstream once and the others get its response, marked; a changed
// body is 422; a request without a key 400; curl sees the same; /metrics,
// /healthz and /readyz answer. The same 64 requests straight to the
// upstream run it 64 times: the ledger sees repeats.
func TestProxyEndToEnd(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, "-upstream", u.URL, "-dir", t.TempDir(), "-wait", "10s")
	concurrentRetries(t, u, []string{p.url}, `"order-1"`, 64)

	if r := post(p.url+"/orders?sleep=300ms", `"order-1"`, `{"sku":"b"}`); r.status != 422 {
		t.Fatalf("changed body: %d %s", r.status, r.body)
	}
	if r := post(p.url+"/orders", "", `{}`); r.status != 400 || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
		t.Fatalf("no key: %d %v", r.status, r.header)
	}
	if u.runs("") != 0 || u.runs(`"order-1"`) != 1 {
		t.Fatal("a refused request reached the upstream")
	}

	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl is needed for the end-to-end test: ", err)
	}
	for i, want := range []string{"HTTP/1.1 201", "HTTP/1.1 201"} {
		out, err := exec.Command(curl, "-sS", "-i", "-X", "POST", "-H", `Idempotency-Key: "curl-1"`, "-d", `{"sku":"c"}`, p.url+"/orders").CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		replayed := strings.Contains(strings.ToLower(string(out)), "idempotent-replayed: true")
		if !strings.HasPrefix(string(out), want) || replayed != (i == 1) {
			t.Fatalf("curl %d:\n%s", i, out)
		}
	}
	if u.runs(`"curl-1"`) != 1 {
		t.Fatalf("curl retries ran the upstream %d times", u.runs(`"curl-1"`))
	}

	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": `idemproxy_requests_total{answer="replayed"}`} {
		resp, err := http.Get(p.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}

	// The control: straight to the upstream, every retry runs.
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); post(u.URL+"/orders", `"bypass-1"`, `{}`) }()
	}
	wg.Wait()
	if u.runs(`"bypass-1"`) != 64 {
		t.Fatalf("bypassed: %d runs of 64; the ledger must see every repeat", u.runs(`"bypass-1"`))
	}
}

// TestProxiesShareRedis: two proxies on one Redis; 64 concurrent retries
// spread over both run the upstream once.
func TestProxiesShareRedis(t *testing.T) {
	u := startUpstream(t)
	addr := redistest.Start(t).Addr
	prefix := fmt.Sprintf("idem-%d:", time.Now().UnixNano())
	a := startProxy(t, "-upstream", u.URL, "-redis", addr, "-redis-prefix", prefix, "-wait", "10s")
	b := startProxy(t, "-upstream", u.URL, "-redis", addr, "-redis-prefix", prefix, "-wait", "10s")
	concurrentRetries(t, u, []string{a.url, b.url}, `"order-1"`, 64)
	// A retry through either, later, is a replay.
	for _, p := range []*proxy{a, b} {
		if r := post(p.url+"/orders?sleep=300ms", `"order-1"`, `{"sku":"a"}`); r.status != 201 || r.header.Get(httpdedup.HeaderReplayed) != "true" {
			t.Fatalf("later retry: %d %v", r.status, r.header)
		}
	}
}

// TestProxiesSharePostgres: two proxies on one PostgreSQL table; 64
// concurrent retries spread over both run the upstream once.
func TestProxiesSharePostgres(t *testing.T) {
	u := startUpstream(t)
	pool := pgtest.Pool(t) // fails in CI if the server is missing
	table := fmt.Sprintf("idemproxy_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	args := []string{"-upstream", u.URL, "-postgres", pgtest.DSN, "-postgres-table", table, "-wait", "10s"}
	a := startProxy(t, args...)
	b := startProxy(t, args...)
	concurrentRetries(t, u, []string{a.url, b.url}, `"order-1"`, 64)
}

// TestProxyKilledMidRequest: a proxy SIGKILLed while the upstream runs a
// request; after a restart the retry does not run it again and does not
// hang: 500 (outcome unknown) at once in the embedded store; in Redis 409
// while the dead proxy's lease lasts, then 500.
func TestProxyKilledMidRequest(t *testing.T) {
	for _, store := range []string{"embedded", "redis"} {
		t.Run(store, func(t *testing.T) {
			u := startUpstream(t)
			args := []string{"-upstream", u.URL, "-lease", "2s"}
			if store == "redis" {
				args = append(args, "-redis", redistest.Start(t).Addr, "-redis-prefix", fmt.Sprintf("kill-%d:", time.Now().UnixNano()))
			} else {
				args = append(args, "-dir", t.TempDir())
			}
			p := startProxy(t, args...)
			first := make(chan response, 1)
			go func() { first <- post(p.url+"/orders?block=1", `"order-9"`, `{}`) }()
			select {
			case <-u.arrived:
			case <-time.After(30 * time.Second):
				t.Fatal("the request never reached the upstream")
			}
			_ = p.child.Kill()
			_ = p.child.Wait()
			if r := <-first; r.err == nil {
				t.Fatalf("the killed proxy answered %d", r.status)
			}
			p = startProxy(t, args...)
			start := time.Now()
			var r response
			for {
				r = post(p.url+"/orders?block=1", `"order-9"`, `{}`)
				if r.status != 409 || time.Since(start) > 30*time.Second {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if r.status != 500 || !strings.Contains(r.body, "outcome-unknown") {
				t.Fatalf("retry after the kill: %d %s (after %v)", r.status, r.body, time.Since(start))
			}
			if store == "embedded" && time.Since(start) > time.Second {
				t.Fatalf("the embedded store answered after %v, want at once", time.Since(start))
			}
			if u.runs(`"order-9"`) != 1 {
				t.Fatalf("the upstream ran %d times", u.runs(`"order-9"`))
			}
			t.Logf("%s: 500 outcome unknown %v after the restart, 1 upstream run", store, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestProxyUpstreamBreaksOff: an upstream that ran the request and broke
// its response off: the client's connection is aborted, and every retry
// gets 500 (outcome unknown), never a second run.
func TestProxyUpstreamBreaksOff(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, "-upstream", u.URL, "-dir", t.TempDir())
	if r := post(p.url+"/orders?break=1", `"order-3"`, `{}`); r.err == nil && r.status == 201 && len(r.body) == 100 {
		t.Fatalf("a broken response came through whole: %d %q", r.status, r.body)
	}
	for range 2 {
		if r := post(p.url+"/orders?break=1", `"order-3"`, `{}`); r.status != 500 || !strings.Contains(r.body, "outcome-unknown") {
			t.Fatalf("retry: %d %v %s", r.status, r.err, r.body)
		}
	}
	if u.runs(`"order-3"`) != 1 {
		t.Fatalf("the upstream ran %d times", u.runs(`"order-3"`))
	}
}

// TestProxyGracefulShutdown: SIGTERM lets the request in flight finish
// and store its response; the restarted proxy replays it.
func TestProxyGracefulShutdown(t *testing.T) {
	u := startUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, "-upstream", u.URL, "-dir", dir)
	first := make(chan response, 1)
	go func() { first <- post(p.url+"/orders?sleep=1s", `"order-5"`, `{}`) }()
	<-u.arrived
	if err := p.child.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.child.Describe())
	}
	if r := <-first; r.status != 201 {
		t.Fatalf("the request in flight at SIGTERM: %d %v", r.status, r.err)
	}
	p = startProxy(t, "-upstream", u.URL, "-dir", dir)
	if r := post(p.url+"/orders?sleep=1s", `"order-5"`, `{}`); r.status != 201 || r.header.Get(httpdedup.HeaderReplayed) != "true" || u.runs(`"order-5"`) != 1 {
		t.Fatalf("after restart: %d %v, %d runs", r.status, r.header, u.runs(`"order-5"`))
	}
}

// TestProxyRefusesOversizedHeaders: request headers over -max-header-bytes
// are refused (431) before the middleware or the upstream sees them.
func TestProxyRefusesOversizedHeaders(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, "-upstream", u.URL, "-dir", t.TempDir(), "-max-header-bytes", "4096")
	req, _ := http.NewRequest("POST", p.url+"/orders", strings.NewReader("{}"))
	req.Header.Set(httpdedup.HeaderKey, `"big-1"`)
	req.Header.Set("X-Padding", strings.Repeat("p", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || u.runs(`"big-1"`) != 0 {
		t.Fatalf("%d, %d upstream runs", resp.StatusCode, u.runs(`"big-1"`))
	}
}

// TestFlags: bad flags are refused before anything starts.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-upstream", "ftp://x"},
		{"-upstream", "http://127.0.0.1:1", "-redis", "127.0.0.1:1", "-postgres", "postgres://x"},
		{"-upstream", "http://127.0.0.1:1", "extra"},
	} {
		if err := run(context.Background(), args, io.Discard, nil); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	// A busy port is named by the flag that chose it.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	for _, c := range []struct{ listen, admin, flag string }{{addr, "", "-listen"}, {"127.0.0.1:0", addr, "-admin"}} {
		err := run(context.Background(), []string{"-listen", c.listen, "-admin", c.admin, "-upstream", "http://127.0.0.1:1", "-dir", t.TempDir()}, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.flag+" "+addr) {
			t.Errorf("%s on a busy port: %v, want an error naming %s %s", c.flag, err, c.flag, addr)
		}
	}
}

// BenchmarkProxy sends POSTs over loopback, 16 at a time, straight to an
// upstream and through the proxy (embedded store), with a new key per
// request and with replays of 1,000 stored keys; it reports requests/s
// and the microseconds a request costs over the direct call (same run).
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 3s ./cmd/idemproxy/
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1,"status":"created"}`))
	}))
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-admin", "", "-upstream", up.URL, "-dir", b.TempDir()}, io.Discard,
			func(proxy, _ string) { ready <- "http://" + proxy })
	}()
	url := <-ready
	defer func() { cancel(); <-done }()
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: transport}
	var direct int64
	for _, c := range []struct{ name, url, mode string }{
		{"direct", up.URL, "new"}, {"proxy/new", url, "new"}, {"proxy/replay", url, "replay"},
	} {
		b.Run(c.name, func(b *testing.B) {
			prefix := fmt.Sprintf("%s-%d-", c.name, time.Now().UnixNano())
			key := func(i int64) string {
				if c.mode == "replay" {
					i %= 1000
				}
				return `"` + prefix + strconv.FormatInt(i, 10) + `"`
			}
			send := func(i int64, setup bool) {
				req, _ := http.NewRequest("POST", c.url+"/orders", strings.NewReader(`{"sku":"a","qty":1}`))
				req.Header.Set(httpdedup.HeaderKey, key(i))
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated || (c.mode == "replay" && !setup && resp.Header.Get(httpdedup.HeaderReplayed) != "true") {
					b.Errorf("%d %v", resp.StatusCode, resp.Header)
				}
			}
			if c.mode == "replay" {
				for i := range int64(1000) {
					send(i, true)
				}
			}
			var next atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					send(next.Add(1), false)
				}
			})
			per := time.Since(start).Nanoseconds() / int64(b.N)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			if c.name == "direct" {
				direct = per
			} else if direct > 0 {
				b.ReportMetric(float64(per-direct)/1e3, "µs-over-direct")
			}
		})
	}
}
