package main

// Adversarial tests of the proxy, run in this process (run with a ready
// callback): an upstream that fails in the ways a real one does, and the
// promise that no keyed request reaches it twice.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// inProc runs the proxy in this process with args until the test ends and
// returns its URL.
func inProc(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	args = append([]string{"-listen", "127.0.0.1:0", "-admin", "", "-dir", t.TempDir(), "-shutdown-timeout", "2s"}, args...)
	go func() {
		done <- run(ctx, args, io.Discard, func(proxy, _ string) { addr <- proxy })
	}()
	select {
	case a := <-addr:
		t.Cleanup(func() { cancel(); <-done })
		return "http://" + a
	case err := <-done:
		cancel()
		t.Fatalf("proxy: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("proxy did not start")
	}
	return ""
}

// rawUpstream is an upstream that counts its requests and answers each
// with answer, given the hijacked connection's writer (nil conn: answer
// through w).
func rawUpstream(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, write func(string))) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		n.Add(1)
		answer(w, r, func(raw string) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = buf.WriteString(raw)
			_ = buf.Flush()
			time.Sleep(20 * time.Millisecond)
			_ = conn.Close()
		})
	}))
	s.Config.ErrorLog = nil
	s.Start()
	t.Cleanup(s.Close)
	return s, &n
}

// TestAdvProxyUpstreamBreaksMidBody: the upstream ran the request and
// started its 201 response, then its connection broke mid-body. The
// request took effect (it answered 201): a retry of the key must not
// reach the upstream again (500 outcome unknown is the honest answer).
func TestAdvProxyUpstreamBreaksMidBody(t *testing.T) {
	for name, raw := range map[string]string{
		"content-length": "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"order\":1",
		"chunked":        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\na\r\n{\"order\":1\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, write func(string)) {
				write(raw)
			})
			p := inProc(t, "-upstream", up.URL)
			first := post(p+"/orders", `"mid-1"`, `{}`)
			if runs.Load() != 1 {
				t.Fatalf("first: %d upstream runs", runs.Load())
			}
			t.Logf("first: status %d, err %v", first.status, first.err)
			for range 2 {
				r := post(p+"/orders", `"mid-1"`, `{}`)
				t.Logf("retry: %d %v %q", r.status, r.err, r.body)
				if runs.Load() != 1 {
					t.Fatalf("a retry of a request the upstream ran (and answered 201) ran it again: %d upstream runs; retry got %d %v %q",
						runs.Load(), r.status, r.err, r.body)
				}
				if r.status != 500 && r.status != 409 && !(r.status == 201 && r.header.Get(httpdedup.HeaderReplayed) == "true") {
					t.Fatalf("retry: %d %v %q", r.status, r.err, r.body)
				}
			}
		})
	}
}

// TestAdvProxyUpstreamTimeoutMidBody: -upstream-timeout ends the upstream
// call after the upstream sent its status and part of its body: the
// request took effect; the retry must not run it again.
func TestAdvProxyUpstreamTimeoutMidBody(t *testing.T) {
	up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, _ func(string)) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":`)
		http.NewResponseController(w).Flush()
		time.Sleep(time.Second)
		_, _ = io.WriteString(w, `1}`)
	})
	p := inProc(t, "-upstream", up.URL, "-upstream-timeout", "300ms")
	first := post(p+"/orders", `"slow-body-1"`, `{}`)
	t.Logf("first: status %d, err %v", first.status, first.err)
	time.Sleep(time.Second)
	r := post(p+"/orders", `"slow-body-1"`, `{}`)
	if runs.Load() != 1 {
		t.Fatalf("the retry ran the upstream again: %d runs; retry got %d %v %q", runs.Load(), r.status, r.err, r.body)
	}
}

// TestAdvProxyUpstreamFailsBeforeAnswer: the upstream read the request and
// closed the connection without an answer, or timed out: 502 and the
// outcome is unknown; every retry is 500, the upstream run once.
func TestAdvProxyUpstreamFailsBeforeAnswer(t *testing.T) {
	t.Run("connection closed", func(t *testing.T) {
		up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, write func(string)) { write("") })
		p := inProc(t, "-upstream", up.URL)
		if r := post(p+"/orders", `"closed-1"`, `{}`); r.status != 502 {
			t.Fatalf("first: %d %v", r.status, r.err)
		}
		for range 2 {
			if r := post(p+"/orders", `"closed-1"`, `{}`); r.status != 500 || !strings.Contains(r.body, "outcome-unknown") || runs.Load() != 1 {
				t.Fatalf("retry: %d %q, %d runs", r.status, r.body, runs.Load())
			}
		}
	})
	t.Run("timeout", func(t *testing.T) {
		up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, _ func(string)) {
			time.Sleep(time.Second)
			w.WriteHeader(http.StatusCreated)
		})
		p := inProc(t, "-upstream", up.URL, "-upstream-timeout", "200ms")
		if r := post(p+"/orders", `"timeout-1"`, `{}`); r.status != 502 {
			t.Fatalf("first: %d %v", r.status, r.err)
		}
		if r := post(p+"/orders", `"timeout-1"`, `{}`); r.status != 500 || runs.Load() != 1 {
			t.Fatalf("retry: %d %q, %d runs", r.status, r.body, runs.Load())
		}
	})
	t.Run("upstream down", func(t *testing.T) {
		// Nothing listens: the request never went out; the retry may run.
		up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, _ func(string)) { w.WriteHeader(201) })
		url := up.URL
		up.Close()
		p := inProc(t, "-upstream", url)
		if r := post(p+"/orders", `"down-1"`, `{}`); r.status != 502 {
			t.Fatalf("first: %d %v %q", r.status, r.err, r.body)
		}
		if r := post(p+"/orders", `"down-1"`, `{}`); r.status != 502 || strings.Contains(r.body, "outcome-unknown") || runs.Load() != 0 {
			t.Fatalf("retry: %d %q, %d runs", r.status, r.body, runs.Load())
		}
	})
}

// TestAdvProxyLongScopeHeader: with -scope-header Authorization, a client
// whose bearer token is 1.2 KB (a JWT) is served, not answered 503 "store
// unavailable" on every request; likewise a key within -max-key.
func TestAdvProxyLongScopeHeader(t *testing.T) {
	up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, _ func(string)) { w.WriteHeader(http.StatusCreated) })
	p := inProc(t, "-upstream", up.URL, "-scope-header", "Authorization", "-max-key", "4096")
	for name, c := range map[string][2]string{
		"jwt":      {"Bearer " + strings.Repeat("e", 1200), `"k-1"`},
		"long key": {"Bearer x", `"` + strings.Repeat("k", 2000) + `"`},
	} {
		req, _ := http.NewRequest("POST", p+"/orders", strings.NewReader("{}"))
		req.Header.Set("Authorization", c[0])
		req.Header.Set(httpdedup.HeaderKey, c[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Errorf("%s: %d %s (upstream runs %d)", name, resp.StatusCode, b, runs.Load())
		}
	}
}

// TestAdvProxyClientLeavesLargeResponse: the upstream ran the request and
// answered 201 with a body longer than -max-stored, which the proxy
// streams; the client reads the status and leaves mid-body. The outcome
// is known (201): the retry must not run the upstream again, and should be
// the replay of that 201 without its body (Idempotency-Stored: headers),
// not 500 "outcome unknown".
func TestAdvProxyClientLeavesLargeResponse(t *testing.T) {
	up, runs := rawUpstream(t, func(w http.ResponseWriter, r *http.Request, _ func(string)) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		chunk := strings.Repeat("x", 256<<10)
		for range 16 { // 4 MiB, in 20 ms steps
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	p := inProc(t, "-upstream", up.URL, "-max-stored", "4096")
	req, _ := http.NewRequest("POST", p+"/orders", strings.NewReader("{}"))
	req.Header.Set(httpdedup.HeaderKey, `"big-1"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	_, _ = io.ReadFull(resp.Body, make([]byte, 1024))
	resp.Body.Close() // leaves mid-body
	time.Sleep(800 * time.Millisecond)
	r := post(p+"/orders", `"big-1"`, `{}`)
	if runs.Load() != 1 {
		t.Fatalf("the retry ran the upstream again: %d runs", runs.Load())
	}
	if r.status != 201 || r.header.Get(httpdedup.HeaderReplayed) != "true" || r.header.Get(httpdedup.HeaderStored) != "headers" {
		t.Fatalf("the retry of a request the upstream answered 201: %d %v %q", r.status, r.header, r.body)
	}
}
