package httpdedup_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// TestSpans: with a TracerProvider, each request the middleware handles
// ends one span "tierdedup.http" saying how it was answered (and the
// handler's spans are its children); a request it passes through has
// none.
func TestSpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	l := &ledger{}
	started := make(chan struct{}, 1)
	var e *engine.Engine
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, s := tp.Tracer("api").Start(r.Context(), "create order")
		s.End()
		if strings.Contains(r.URL.RawQuery, "sleep") {
			started <- struct{}{}
		}
		if strings.Contains(r.URL.RawQuery, "close") {
			_ = e.Close() // the response cannot be stored
		}
		orders(l).ServeHTTP(w, r)
	})
	e = openEngine(t, engineOptions(t.TempDir()))
	s, _ := serveWith(t, httpdedup.Options{Engine: e, TracerProvider: tp}, h)

	// ours waits for n spans of the middleware (a span ends just after
	// its response is sent) and returns them.
	ours := func(n int) []sdktrace.ReadOnlySpan {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			var got []sdktrace.ReadOnlySpan
			for _, sp := range sr.Ended() {
				if sp.Name() == "tierdedup.http" {
					got = append(got, sp)
				}
			}
			if len(got) >= n || time.Now().After(deadline) {
				if len(got) != n {
					t.Fatalf("%d spans of the middleware, want %d", len(got), n)
				}
				return got
			}
		}
	}

	type want struct {
		answer string
		status int64 // 0: none
		stored string
		failed bool
	}
	var wants []want
	step := func(method, path, key, body string, status int, w want) {
		t.Helper()
		if r := do(t, method, s.URL+path, key, body); r.status != status {
			t.Fatalf("%s %s %s: %d %s, want %d", method, path, key, r.status, r.body, status)
		}
		wants = append(wants, w)
		ours(len(wants))
	}
	step("POST", "/orders", `"k1"`, "a", 201, want{"executed", 201, "true", false})
	step("POST", "/orders", `"k1"`, "a", 201, want{"replayed", 201, "", false})
	step("POST", "/orders", `"k1"`, "b", 422, want{"conflict", 422, "", false})
	step("POST", "/orders", `token`, "a", 400, want{"rejected", 400, "", false})
	step("POST", "/orders", "", "a", 400, want{"rejected", 400, "", false})
	step("POST", "/orders?status=503", `"k2"`, "a", 503, want{"executed", 503, "false", true})
	step("POST", "/orders?panic=1", `"k3"`, "a", 500, want{"executed", 500, "false", true})
	if r := do(t, "PUT", s.URL+"/orders", "", "a"); r.status != 201 { // passed through: no span
		t.Fatalf("PUT without a key: %d %s", r.status, r.body)
	}

	// In flight: a second request meets the first's claim.
	first := make(chan response, 1)
	go func() { first <- do(t, "POST", s.URL+"/orders?sleep=1s", `"k4"`, "a") }()
	<-started
	step("POST", "/orders?sleep=1s", `"k4"`, "a", 409, want{"in-flight", 409, "", false})
	if r := <-first; r.status != 201 {
		t.Fatalf("the first request in flight: %d %s", r.status, r.body)
	}
	wants = append(wants, want{"executed", 201, "true", false})

	step("POST", "/orders?close=1", `"k5"`, "a", 201, want{"executed", 201, "false", true})
	step("POST", "/orders", `"k5"`, "a", 503, want{"unavailable", 503, "", true})

	spans := ours(len(wants))
	for i, w := range wants {
		sp := spans[i]
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			a[kv.Key] = kv.Value
		}
		if got := a["tierdedup.http.answer"].AsString(); got != w.answer {
			t.Errorf("span %d: answer %q, want %q", i, got, w.answer)
		}
		if got := a["http.response.status_code"].AsInt64(); got != w.status {
			t.Errorf("span %d (%s): status %d, want %d", i, w.answer, got, w.status)
		}
		if got, ok := a["tierdedup.http.stored"]; (ok || w.stored != "") && got.Emit() != w.stored {
			t.Errorf("span %d (%s): stored %q, want %q", i, w.answer, got.Emit(), w.stored)
		}
		if a["http.request.method"].AsString() != "POST" || a["tierdedup.namespace"].AsString() != "http" {
			t.Errorf("span %d: %v", i, sp.Attributes())
		}
		if failed := sp.Status().Code == codes.Error; failed != w.failed {
			t.Errorf("span %d (%s): status %v, want Error %v", i, w.answer, sp.Status(), w.failed)
		}
	}
	if a := spans[5].Attributes(); !hasAttr(a, "tierdedup.http.released", "true") {
		t.Errorf("a 503 the handler answered: %v, want its claim released", a)
	}
	if a := spans[6].Attributes(); !hasAttr(a, "tierdedup.http.panicked", "true") || !hasAttr(a, "tierdedup.http.released", "true") {
		t.Errorf("a panic: %v", a)
	}
	for _, i := range []int{9, 10} {
		if ev := spans[i].Events(); len(ev) != 1 || ev[0].Name != "exception" {
			t.Errorf("span %d (%s): events %v, want the engine's error", i, wants[i].answer, ev)
		}
	}
	if a := spans[9].Attributes(); !hasAttr(a, "tierdedup.http.released", "false") {
		t.Errorf("a response not stored: %v, want its claim kept", a)
	}

	// The handler's spans are children of its request's span.
	children, orphans := 0, 0
	for _, sp := range sr.Ended() {
		if sp.Name() != "create order" {
			continue
		}
		if !sp.Parent().IsValid() {
			orphans++ // the PUT passed through
			continue
		}
		children++
		parent := false
		for _, ours := range spans {
			if ours.SpanContext().SpanID() == sp.Parent().SpanID() && ours.SpanContext().TraceID() == sp.Parent().TraceID() {
				parent = ours.Name() == "tierdedup.http"
				if a := ours.Attributes(); !hasAttr(a, "tierdedup.http.answer", "executed") {
					t.Errorf("a handler ran under a span answered %v", a)
				}
			}
		}
		if !parent {
			t.Errorf("the handler's span's parent %v is not a request's span", sp.Parent().SpanID())
		}
	}
	if children != 5 || orphans != 1 { // k1, k2, k3, k4, k5; the PUT
		t.Errorf("%d handler spans under the middleware's, %d without a parent; want 5 and 1", children, orphans)
	}
}

func hasAttr(kvs []attribute.KeyValue, key, value string) bool {
	for _, kv := range kvs {
		if string(kv.Key) == key && kv.Value.Emit() == value {
			return true
		}
	}
	return false
}
