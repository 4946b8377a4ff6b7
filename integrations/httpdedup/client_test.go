package httpdedup_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// lossy is a server in front of h: the first lose requests run through h
// and then lose their response (the connection is dropped), the next busy
// ones are answered 503 with Retry-After: 1 without reaching h. It
// records the key of every request.
type lossy struct {
	h          http.Handler
	mu         sync.Mutex
	lose, busy int
	keys       []string
}

func (s *lossy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get(httpdedup.HeaderKey))
	lose, busy := s.lose > 0, s.lose == 0 && s.busy > 0
	if lose {
		s.lose--
	} else if busy {
		s.busy--
	}
	s.mu.Unlock()
	switch {
	case lose:
		s.h.ServeHTTP(httptest.NewRecorder(), r) // it ran; its response is lost
		panic(http.ErrAbortHandler)
	case busy:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		s.h.ServeHTTP(w, r)
	}
}

// TestTransportOneEffect: a POST whose first response is lost and whose
// second attempt is refused with 503 + Retry-After succeeds on its third,
// every attempt with the one key the Transport gave it, the handler run
// once, and the response the one of that run (replayed). Without the
// Transport the caller sees the lost response's error.
func TestTransportOneEffect(t *testing.T) {
	l := &ledger{}
	e := openEngine(t, engineOptions(t.TempDir()))
	m, err := httpdedup.New(&httpdedup.Options{Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	front := &lossy{h: m.Handler(orders(l)), lose: 1, busy: 1}
	s := httptest.NewServer(front)
	defer s.Close()

	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: 10 * time.Millisecond}}
	start := time.Now()
	resp, err := client.Post(s.URL+"/orders", "application/json", strings.NewReader(`{"sku":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(httpdedup.HeaderReplayed) != "true" || !strings.Contains(string(body), `"order":1`) {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if time.Since(start) < time.Second {
		t.Fatalf("answered after %v: the 503's Retry-After of 1 s was not honoured", time.Since(start))
	}
	if len(front.keys) != 3 || front.keys[0] == "" || front.keys[1] != front.keys[0] || front.keys[2] != front.keys[0] {
		t.Fatalf("keys of the attempts: %q, want one key three times", front.keys)
	}
	if runs := l.count(front.keys[0]); runs != 1 {
		t.Fatalf("the handler ran %d times", runs)
	}

	// A second call is a new logical request: a new key, a new run.
	front.lose = 1
	if resp, err := client.Post(s.URL+"/orders", "application/json", strings.NewReader(`{"sku":"a"}`)); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if front.keys[3] == front.keys[0] || l.count(front.keys[3]) != 1 {
		t.Fatalf("second request: key %q (first %q), %d runs", front.keys[3], front.keys[0], l.count(front.keys[3]))
	}

	// Without the Transport the lost response is the caller's error.
	front.lose = 1
	req, _ := http.NewRequest("POST", s.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set(httpdedup.HeaderKey, `"bare-1"`)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a bare client got %d for a lost response", resp.StatusCode)
	}
}

// TestTransportGivesUp: a 500 is returned at once; a server that keeps
// answering 503 gets MaxAttempts attempts; GET is sent once, without a key.
func TestTransportGivesUp(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	keys := map[string]string{}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Method+r.URL.Path]++
		keys[r.Method] = r.Header.Get(httpdedup.HeaderKey)
		mu.Unlock()
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer s.Close()
	client := &http.Client{Transport: &httpdedup.Transport{MinBackoff: time.Millisecond, MaxAttempts: 3}}
	for path, want := range map[string]int{"/fail": 1, "/busy": 3} {
		resp, err := client.Post(s.URL+path, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if calls["POST"+path] != want {
			t.Errorf("%s: %d attempts, want %d", path, calls["POST"+path], want)
		}
	}
	resp, err := client.Get(s.URL + "/busy")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls["GET/busy"] != 1 || keys["GET"] != "" {
		t.Errorf("GET: %d attempts, key %q; want 1, none", calls["GET/busy"], keys["GET"])
	}
}
