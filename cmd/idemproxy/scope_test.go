package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// send posts body with key and the given header lines (name, value pairs,
// a name repeated for several lines) and returns the response.
func send(t *testing.T, url, key, body string, header ...string) response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set(httpdedup.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestProxyScopesByCredential: without -scope-header, the proxy scopes
// keys by the Authorization a request carries. Clients that differ in
// any line of it (another token, a token in another case, a second line,
// none at all) send the same key and body: each runs once upstream, its
// retry replays its own response, and none sees another's. A client's
// retry with the same credential is a replay.
func TestProxyScopesByCredential(t *testing.T) {
	// Each run answers its own number and the credential it ran for.
	var mu sync.Mutex
	runs := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d for %q", n, r.Header.Values("Authorization"))
	}))
	defer up.Close()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return runs
	}
	p := inProc(t, "-upstream", up.URL)
	clients := [][]string{
		{"Authorization", "Bearer alice"},
		{"Authorization", "Bearer bob"},
		{"Authorization", "Bearer ALICE"},
		{"Authorization", "Bearer x", "Authorization", "Bearer alice"},
		{"Authorization", "Bearer x", "Authorization", "Bearer bob"},
		{"Authorization", "Bearer x"},
		{}, // no credential: the anonymous scope
	}
	const key, body = `"order-7"`, `{"sku":"a"}`
	first := map[int]string{}
	for i, h := range clients {
		r := send(t, p+"/orders", key, body, h...)
		if r.status != http.StatusCreated || r.header.Get(httpdedup.HeaderReplayed) != "" {
			t.Fatalf("client %d %v: %d replayed %q %s: want its own first run", i, h, r.status, r.header.Get(httpdedup.HeaderReplayed), r.body)
		}
		for j, b := range first {
			if b == r.body {
				t.Fatalf("client %d %v got client %d's response %s", i, h, j, b)
			}
		}
		first[i] = r.body
	}
	if n := count(); n != len(clients) {
		t.Fatalf("the upstream ran %d times for %d clients, want once each", n, len(clients))
	}
	for i, h := range clients {
		r := send(t, p+"/orders", key, body, h...)
		if r.header.Get(httpdedup.HeaderReplayed) != "true" || r.body != first[i] {
			t.Errorf("client %d %v: retry %d replayed %q %s, want its own %s replayed", i, h, r.status, r.header.Get(httpdedup.HeaderReplayed), r.body, first[i])
		}
	}
	if n := count(); n != len(clients) {
		t.Fatalf("after the retries the upstream ran %d times, want %d", n, len(clients))
	}
}

// TestProxyScopeHeaderFlag: -scope-header X-Tenant scopes by that header
// and refuses a request without it; -scope-header "" puts every client in
// one scope (a second client's request is the first's retry).
func TestProxyScopeHeaderFlag(t *testing.T) {
	u := startUpstream(t)
	p := inProc(t, "-upstream", u.URL, "-scope-header", "x-tenant")
	a := send(t, p+"/orders", `"k"`, `{}`, "X-Tenant", "a", "Authorization", "Bearer same")
	b := send(t, p+"/orders", `"k"`, `{}`, "X-Tenant", "b", "Authorization", "Bearer same")
	if a.status != 201 || b.status != 201 || b.header.Get(httpdedup.HeaderReplayed) != "" || u.runs(`"k"`) != 2 {
		t.Fatalf("two tenants: %d, %d (replayed %q), upstream %d runs", a.status, b.status, b.header.Get(httpdedup.HeaderReplayed), u.runs(`"k"`))
	}
	for _, h := range [][]string{{}, {"X-Tenant", ""}} {
		if r := send(t, p+"/orders", `"k2"`, `{}`, h...); r.status != http.StatusForbidden {
			t.Errorf("X-Tenant %v: %d %s, want 403", h, r.status, r.body)
		}
	}

	u2 := startUpstream(t)
	one := inProc(t, "-upstream", u2.URL, "-scope-header", "")
	c := send(t, one+"/orders", `"k"`, `{}`, "Authorization", "Bearer alice")
	d := send(t, one+"/orders", `"k"`, `{}`, "Authorization", "Bearer bob")
	if c.status != 201 || d.header.Get(httpdedup.HeaderReplayed) != "true" || u2.runs(`"k"`) != 1 {
		t.Fatalf(`-scope-header "": %d, then %d replayed %q; upstream %d runs, want one scope`, c.status, d.status, d.header.Get(httpdedup.HeaderReplayed), u2.runs(`"k"`))
	}
}
